package api_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestReportFoldedUploads: an upload record that stands for several
// uploads counts them all against file_writes_total, and one that is not a
// span of uploads (a negative count, a first after its last) is refused
// naming it.
func TestReportFoldedUploads(t *testing.T) {
	h := newHarness(t)
	sid := h.runningSession("folded", nil).GetJobId()
	report := func(total int64, ws ...*authorityv1.FileWrite) error {
		detail := noFiles()
		detail.FileWrites, detail.FileWritesTotal = ws, total
		_, err := h.client(executorID).ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: sid, Detail: detail,
			Result: &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_FINISHED, BundleDigest: digestA, RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_RUNC}})
		return err
	}
	folded := &authorityv1.FileWrite{Path: "/work/a", Count: 3, FirstAfterExec: 1, AfterExec: 2}
	wantStatus(t, report(2, folded), codes.InvalidArgument, "file_writes_total")
	wantStatus(t, report(3, &authorityv1.FileWrite{Path: "/work/a", Count: -1}), codes.InvalidArgument, "file_writes[0]")
	wantStatus(t, report(3, &authorityv1.FileWrite{Path: "/work/a", Count: 3, FirstAfterExec: 5, AfterExec: 2}), codes.InvalidArgument, "file_writes[0]")
	if err := report(4, folded); err != nil {
		t.Fatalf("a folded record within the total: %v", err)
	}
}
