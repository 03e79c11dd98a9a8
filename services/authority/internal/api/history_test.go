package api_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestFetchSourceHistory: for a tenant of depth 3 the stream is the
// header (saying 3), the archive, then the history part and a git pack of
// the base's two parents, in that order; the depth is the job's grant's.
func TestFetchSourceHistory(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{devHistoryDepth: 3})
	for _, v := range []string{"two", "three"} {
		if err := os.WriteFile(filepath.Join(h.origin.Dir, v+".txt"), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		h.origin.Run("add", "-A")
		h.origin.Run("commit", "-q", "-m", v)
	}
	dev, executor := h.client(devID), h.client(executorID)
	j := h.submit(dev, "history", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)

	// The depth is the grant's: read once, at submission.
	if gs := h.fake.Grants(j.GetJobId()); len(gs) == 0 || gs[0].GetGitHistoryDepth() != 3 {
		t.Fatalf("the job's grant: %v; want git_history_depth 3", gs)
	}

	stream, err := executor.FetchSource(t.Context(), &authorityv1.FetchSourceRequest{JobId: j.GetJobId()})
	if err != nil {
		t.Fatal(err)
	}
	var archive, pack bytes.Buffer
	var hist *authorityv1.SourceHistory
	for i := 0; ; i++ {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch p := msg.GetPart().(type) {
		case *authorityv1.FetchSourceResponse_Header:
			if i != 0 || p.Header.GetHistoryDepth() != 3 {
				t.Fatalf("header as message %d: %v", i, p.Header)
			}
		case *authorityv1.FetchSourceResponse_Chunk:
			if hist != nil {
				t.Fatal("an archive chunk after the history part")
			}
			archive.Write(p.Chunk)
		case *authorityv1.FetchSourceResponse_History:
			if hist != nil || archive.Len() == 0 {
				t.Fatalf("history part %v before the archive or twice", p.History)
			}
			hist = p.History
		case *authorityv1.FetchSourceResponse_HistoryChunk:
			if hist == nil {
				t.Fatal("a history chunk before the history part")
			}
			pack.Write(p.HistoryChunk)
		}
	}
	if want := h.origin.Run("archive", "--format=tar", "main"); !bytes.Equal(archive.Bytes(), []byte(want)) {
		t.Errorf("archive: %d bytes, want %d", archive.Len(), len(want))
	}
	if hist.GetDepth() != 3 || hist.GetCommits() != 2 || !bytes.HasPrefix(pack.Bytes(), []byte("PACK")) {
		t.Fatalf("history %v with %d pack bytes; want depth 3, 2 commits, a pack", hist, pack.Len())
	}
}
