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
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// downloadedBundle is one DownloadBundle stream, taken apart.
type downloadedBundle struct {
	header   *authorityv1.BundleHeader
	data     bytes.Buffer
	verified string
	err      error
}

func downloadBundle(t *testing.T, c authorityv1.AuthorityServiceClient, jobID string) *downloadedBundle {
	t.Helper()
	d := &downloadedBundle{}
	stream, err := c.DownloadBundle(t.Context(), &authorityv1.DownloadBundleRequest{JobId: jobID})
	if err != nil {
		d.err = err
		return d
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return d
		}
		if err != nil {
			d.err = err
			return d
		}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.DownloadBundleResponse_Header:
			d.header = m.Header
		case *authorityv1.DownloadBundleResponse_Chunk:
			d.data.Write(m.Chunk)
		case *authorityv1.DownloadBundleResponse_VerifiedDigest:
			d.verified = m.VerifiedDigest
		}
	}
}

// TestDownloadBundle: the tenant's client and the approvers its policy
// lists get a finished job's whole bundle with the provenance envelope
// the executor reported, vouched for only when every byte has the digest
// the result recorded. From the attacker's side: another tenant's client
// and an approver no tenant lists see no such job, a job without a result
// has no bundle, and an executor whose copy was altered (the fake serves
// whatever bytes it is given) gets DataLoss, no confirmation, and the
// mismatch on the audit log.
func TestDownloadBundle(t *testing.T) {
	h := newHarness(t)
	dev, alice, other, eve := h.client(devID), h.client(aliceID), h.client(otherID), h.client(eveID)
	dir := t.TempDir()
	b, err := bundle.Write(filepath.Join(dir, "bundle.tar"), bundle.Input{Meta: map[string]int{}, Patch: bytes.Repeat([]byte("+x\n"), 200000)})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	envelope := []byte(`{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[]}`)

	j := h.submit(dev, "download", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	wantStatus(t, downloadBundle(t, dev, j.GetJobId()).err, codes.FailedPrecondition, "no result bundle")
	if _, err := h.client(executorID).ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(b.Digest), Detail: noFiles(), Provenance: envelope}); err != nil {
		t.Fatal(err)
	}
	h.fake.SetArtifact(j.GetJobId(), data)

	for name, c := range map[string]authorityv1.AuthorityServiceClient{"the tenant's client": dev, "the tenant's approver": alice} {
		d := downloadBundle(t, c, j.GetJobId())
		if d.err != nil {
			t.Fatalf("%s: %v", name, d.err)
		}
		if d.header.GetJobId() != j.GetJobId() || d.header.GetBundleDigest() != b.Digest || !bytes.Equal(d.header.GetProvenance(), envelope) {
			t.Errorf("%s: header %v", name, d.header)
		}
		if !bytes.Equal(d.data.Bytes(), data) || d.verified != b.Digest {
			t.Errorf("%s: %d bytes (want %d), verified %q", name, d.data.Len(), len(data), d.verified)
		}
	}
	for name, c := range map[string]authorityv1.AuthorityServiceClient{"another tenant's client": other, "an approver no tenant lists": eve} {
		d := downloadBundle(t, c, j.GetJobId())
		wantStatus(t, d.err, codes.NotFound)
		if d.header != nil || d.data.Len() > 0 {
			t.Errorf("%s got %v and %d bytes", name, d.header, d.data.Len())
		}
	}
	wantStatus(t, downloadBundle(t, h.client(publisherID), j.GetJobId()).err, codes.PermissionDenied)
	wantStatus(t, downloadBundle(t, dev, "").err, codes.InvalidArgument, "job_id")
	wantStatus(t, downloadBundle(t, dev, "no-such-job").err, codes.NotFound)

	for name, bad := range map[string][]byte{
		"a flipped byte": append(append(bytes.Clone(data[:len(data)/2]), data[len(data)/2]^1), data[len(data)/2+1:]...),
		"a byte added":   append(bytes.Clone(data), 0),
		"cut short":      data[:len(data)-1],
	} {
		h.fake.SetArtifact(j.GetJobId(), bad)
		d := downloadBundle(t, dev, j.GetJobId())
		if d.verified != "" || status.Code(d.err) != codes.DataLoss {
			t.Errorf("%s: verified %q, error %v; want DataLoss and no verified digest", name, d.verified, d.err)
		}
	}
	ev, err := alice.ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Kind: "review.bundle_mismatch"})
	if err != nil || len(ev.GetEvents()) != 3 || ev.GetEvents()[0].GetSubject() != j.GetJobId() {
		t.Errorf("review.bundle_mismatch events: %v, %v; want 3 for %s", ev.GetEvents(), err, j.GetJobId())
	}
}
