package runs

import (
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// TestExportDeadline: a job whose export (git over what it left in /work)
// passes its deadline used to hold the executor, and its shutdown, for as
// long as git took; now git is killed at the deadline and the job ends
// timeout saying the patch passed its deadline, with nothing of /work or
// /out exported. The deadline here (1 ms) is shorter than any git run.
func TestExportDeadline(t *testing.T) {
	h, _ := newHarness(t, false)
	h.m.cfg.ExportTimeout = time.Millisecond
	start := time.Now()
	run, path, size := sparseJob(t, h, `for i in 1 2 3 4 5 6 7 8; do head -c 1048576 /dev/urandom > /work/r$i; done && echo kept > /out/x && echo left`, nil)
	t.Logf("the job and its export took %v", time.Since(start))
	if run.State != Finished || run.Result.Reason != sandbox.ReasonTimeout {
		t.Fatalf("the job ended %s/%s, want finished/timeout: %+v", run.State, run.Result.Reason, run.Result)
	}
	msg := run.Result.Message
	if !strings.Contains(msg, "patch of the job's changes passed its deadline of 1ms") ||
		!strings.Contains(msg, "nothing of /work or /out was exported") || strings.Contains(msg, h.base) {
		t.Errorf("the message does not say the export passed its deadline: %q", msg)
	}
	wantNothingExported(t, run, path, size)
}
