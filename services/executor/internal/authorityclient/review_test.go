package authorityclient

import (
	"context"
	"fmt"
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

// reportServer plays the authority's ReportResult and keeps the review
// detail it was sent.
type reportServer struct {
	sourceServer
	detail *authorityv1.ReviewDetail
}

func (s *reportServer) ReportResult(_ context.Context, req *authorityv1.ReportResultRequest) (*authorityv1.ReportResultResponse, error) {
	s.detail = req.GetDetail()
	return &authorityv1.ReportResultResponse{}, nil
}

// TestReviewUploadsBeforeTheirExec: 2,000 uploads, then /work/run.sh, then
// the exec that runs it: the review, bounded, still lists run.sh before
// that exec and counts every upload; repeated uploads of a path are one
// record that says how many.
func TestReviewUploadsBeforeTheirExec(t *testing.T) {
	srv := &reportServer{}
	c := dial(t, srv)
	var ws []runs.FileWrite
	for i := range 2000 {
		ws = append(ws, runs.FileWrite{Path: fmt.Sprintf("/out/f%d", i%700), Size: 1})
	}
	ws = append(ws, runs.FileWrite{Path: "/work/run.sh", Size: 9})
	rep := runs.Report{JobID: "s-1", FileWrites: ws, Execs: []runs.Exec{{Seq: 1, Spec: runs.ExecSpec{ID: "t1", Argv: []string{"sh", "/work/run.sh"}}}}}
	if err := c.ReportResult(context.Background(), rep); err != nil {
		t.Fatal(err)
	}
	d := srv.detail
	got := d.GetFileWrites()
	if len(got) > convert.ListedWrites || d.GetFileWritesTotal() != 2001 {
		t.Fatalf("%d records, total %d; want at most %d, total 2001", len(got), d.GetFileWritesTotal(), convert.ListedWrites)
	}
	if last := got[len(got)-1]; last.GetPath() != "/work/run.sh" || last.GetAfterExec() != 0 {
		t.Errorf("the last upload listed is %v, want /work/run.sh before exec 1", last)
	}
	var listed int64
	for _, w := range got {
		listed += max(w.GetCount(), 1)
	}
	if listed >= 2001 || got[0].GetCount() < 2 {
		t.Errorf("the review lists %d uploads, the first %v: want repeated paths folded and a cut counted", listed, got[0])
	}
}
