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
// naming it; once recorded, GetSession lists them.
func TestReportFoldedUploads(t *testing.T) {
	h := newHarness(t)
	sid := h.runningSession("folded", nil).GetJobId()
	report := func(total int64, ws ...*typesv1.FileWrite) error {
		detail := noFiles()
		detail.FileWrites, detail.FileWritesTotal = ws, total
		_, err := h.client(executorID).ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: sid, Detail: detail,
			Result: &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_FINISHED, BundleDigest: digestA, RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_RUNC}})
		return err
	}
	folded := &typesv1.FileWrite{Path: "/work/a", Count: 3, FirstAfterExec: 1, AfterExec: 2}
	wantStatus(t, report(2, folded), codes.InvalidArgument, "file_writes_total")
	wantStatus(t, report(3, &typesv1.FileWrite{Path: "/work/a", Count: -1}), codes.InvalidArgument, "file_writes[0]")
	wantStatus(t, report(3, &typesv1.FileWrite{Path: "/work/a", Count: 3, FirstAfterExec: 5, AfterExec: 2}), codes.InvalidArgument, "file_writes[0]")
	if err := report(4, folded); err != nil {
		t.Fatalf("a folded record within the total: %v", err)
	}
	// Once the session has ended, GetSession lists the uploads its result
	// recorded.
	sess, err := h.client(devID).GetSession(t.Context(), &authorityv1.GetSessionRequest{SessionId: sid})
	if err != nil || sess.GetFileWritesTotal() != 4 || len(sess.GetFileWrites()) != 1 || sess.GetFileWrites()[0].GetCount() != 3 {
		t.Fatalf("GetSession of the ended session: uploads %v of %d, %v; want the result's folded record of 4", sess.GetFileWrites(), sess.GetFileWritesTotal(), err)
	}
}
