package api_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/bundle/bundlepb"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// reviewed is one ReadReview stream, taken apart.
type reviewed struct {
	parts    []authorityv1.ReviewPart
	files    []*authorityv1.FileChange
	bytes    map[authorityv1.ReviewPart]*bytes.Buffer
	verified string
	err      error
}

func readReview(t *testing.T, c authorityv1.AuthorityServiceClient, req *authorityv1.ReadReviewRequest) reviewed {
	t.Helper()
	r := reviewed{bytes: map[authorityv1.ReviewPart]*bytes.Buffer{}}
	stream, err := c.ReadReview(t.Context(), req)
	if err != nil {
		r.err = err
		return r
	}
	var part authorityv1.ReviewPart
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.ReadReviewResponse_Start:
			part = m.Start.GetPart()
			r.parts = append(r.parts, part)
			r.bytes[part] = &bytes.Buffer{}
		case *authorityv1.ReadReviewResponse_Files:
			r.files = append(r.files, m.Files.GetFiles()...)
		case *authorityv1.ReadReviewResponse_Chunk:
			r.bytes[part].Write(m.Chunk)
		case *authorityv1.ReadReviewResponse_VerifiedDigest:
			r.verified = m.VerifiedDigest
		}
	}
}

// TestReadReviewStreamsTheVerifiedBundle: ReadReview hands a reviewer the
// bundle's whole file list, patch and output, in order, and vouches for it
// only when every byte has the approval's digest. The fake executor (named
// as such: it serves whatever bytes the test gives it) plays an executor
// whose disk was altered after its own check, so the authority's check is
// the one under test.
func TestReadReviewStreamsTheVerifiedBundle(t *testing.T) {
	h := newHarness(t)
	dev, alice, other := h.client(devID), h.client(aliceID), h.client(otherID)
	dir := t.TempDir()
	stdout := filepath.Join(dir, "stdout")
	if err := os.WriteFile(stdout, bytes.Repeat([]byte("out\n"), 100000), 0o644); err != nil {
		t.Fatal(err)
	}
	files := make([]bundle.FileChange, 2500)
	for i := range files {
		files[i] = bundle.FileChange{Path: "f" + string(rune('a'+i%26)) + "/" + string(rune('0'+i%10)), Status: bundle.FileAdded, NewMode: 0o100644, Added: 1, Size: 2, PatchBytes: 1}
	}
	files[7].Path = "bad\xff\x1b[2J"
	patch := bytes.Repeat([]byte("+"), 2500)
	b, err := bundle.Write(filepath.Join(dir, "bundle.tar"), bundle.Input{Meta: map[string]int{}, Files: files, Patch: patch, StdoutPath: stdout})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(b.Path)
	if err != nil {
		t.Fatal(err)
	}

	s := spec()
	s.PublishTarget = &typesv1.PublishTarget{Repository: "demo", Branch: "main"}
	j := h.submit(dev, "review", s).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	res := exited(b.Digest)
	res.DiffStat = &typesv1.DiffStat{FilesChanged: int64(len(files)), Insertions: int64(len(files))}
	rr, err := h.client(executorID).ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: res, Patch: patch[:100],
		Detail: &authorityv1.ReviewDetail{FilesTotal: int64(len(files)), PatchSize: int64(len(patch)), Stdout: &authorityv1.OutputTail{Size: 400000, Data: []byte("out\n")}}})
	if err != nil {
		t.Fatal(err)
	}
	aid := rr.GetJob().GetApprovalId()
	h.fake.SetArtifact(j.GetJobId(), data)

	got := readReview(t, alice, &authorityv1.ReadReviewRequest{ApprovalId: aid})
	if got.err != nil {
		t.Fatalf("ReadReview: %v", got.err)
	}
	wantParts := []authorityv1.ReviewPart{authorityv1.ReviewPart_REVIEW_PART_FILES, authorityv1.ReviewPart_REVIEW_PART_PATCH,
		authorityv1.ReviewPart_REVIEW_PART_STDOUT, authorityv1.ReviewPart_REVIEW_PART_STDERR}
	if len(got.parts) != 4 || got.parts[0] != wantParts[0] || got.parts[1] != wantParts[1] || got.parts[2] != wantParts[2] || got.parts[3] != wantParts[3] {
		t.Errorf("parts %v, want %v", got.parts, wantParts)
	}
	if len(got.files) != len(files) || bundlepb.Path(got.files[7]) != files[7].Path || got.files[7].GetPath() != "bad\uFFFD\x1b[2J" {
		t.Errorf("%d files streamed (file 7: %q / %q), want %d with the exact bytes of every path", len(got.files), got.files[7].GetPath(), got.files[7].GetPathBytes(), len(files))
	}
	if !bytes.Equal(got.bytes[authorityv1.ReviewPart_REVIEW_PART_PATCH].Bytes(), patch) || got.bytes[authorityv1.ReviewPart_REVIEW_PART_STDOUT].Len() != 400000 {
		t.Errorf("patch %d bytes, stdout %d: not the bundle's", got.bytes[authorityv1.ReviewPart_REVIEW_PART_PATCH].Len(), got.bytes[authorityv1.ReviewPart_REVIEW_PART_STDOUT].Len())
	}
	if got.verified != b.Digest {
		t.Errorf("verified %q, want %s", got.verified, b.Digest)
	}

	// One part; the tenant's client may read it too, another client not.
	only := readReview(t, dev, &authorityv1.ReadReviewRequest{ApprovalId: aid, Parts: []authorityv1.ReviewPart{authorityv1.ReviewPart_REVIEW_PART_PATCH}})
	if only.err != nil || len(only.parts) != 1 || len(only.files) != 0 || only.verified != b.Digest {
		t.Errorf("patch only: parts %v, %d files, verified %q, %v", only.parts, len(only.files), only.verified, only.err)
	}
	wantStatus(t, readReview(t, other, &authorityv1.ReadReviewRequest{ApprovalId: aid}).err, codes.NotFound)
	for _, parts := range [][]authorityv1.ReviewPart{{authorityv1.ReviewPart_REVIEW_PART_PATCH, authorityv1.ReviewPart_REVIEW_PART_PATCH}, {authorityv1.ReviewPart_REVIEW_PART_UNSPECIFIED}, {99}} {
		wantStatus(t, readReview(t, alice, &authorityv1.ReadReviewRequest{ApprovalId: aid, Parts: parts}).err, codes.InvalidArgument, "parts")
	}
	wantStatus(t, readReview(t, alice, &authorityv1.ReadReviewRequest{}).err, codes.InvalidArgument, "approval_id")

	// The executor hands over other bytes: one flipped in the patch, or
	// one more at the end. Whatever was streamed is never vouched for.
	for name, bad := range map[string][]byte{
		"a flipped byte": bytes.Replace(bytes.Clone(data), patch[:10], []byte("-+++++++++"), 1),
		"a byte added":   append(bytes.Clone(data), 0),
	} {
		h.fake.SetArtifact(j.GetJobId(), bad)
		r := readReview(t, alice, &authorityv1.ReadReviewRequest{ApprovalId: aid})
		if r.verified != "" || status.Code(r.err) != codes.DataLoss {
			t.Errorf("%s: verified %q, error %v; want DataLoss and no verified digest", name, r.verified, r.err)
		}
	}
	// Each mismatch is on the audit log.
	ev, err := alice.ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Kind: "review.bundle_mismatch"})
	if err != nil || len(ev.GetEvents()) != 2 || ev.GetEvents()[0].GetSubject() != aid {
		t.Errorf("review.bundle_mismatch events: %v, %v; want 2 for %s", ev.GetEvents(), err, aid)
	}
}
