package runs

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRecoverReportsRestartOnce leaves a run in flight, as an executor
// killed mid-run does, and checks that Recover fails it and reports the
// restart by its reason alone: the authority words the reason for people
// ("the executor restarted while the job was in flight"), so a message
// saying it again would print it twice.
func TestRecoverReportsRestartOnce(t *testing.T) {
	h, _ := newHarness(t, false)
	id := "job-in-flight"
	if err := os.MkdirAll(h.m.runDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	h.m.mu.Lock()
	h.m.runs[id] = &entry{run: Run{JobID: id, State: Running, CreatedAt: time.Now()}, changed: make(chan struct{})}
	h.m.mu.Unlock()
	if err := h.m.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.auth.mu.Lock()
		reports := append([]Report(nil), h.auth.reports...)
		h.auth.mu.Unlock()
		if len(reports) > 0 {
			r := reports[0].Result
			if reports[0].JobID != id || r.Reason != ReasonExecutorRestarted || r.ExitCode != -1 {
				t.Errorf("reported %s: reason %q, exit %d; want %s: %q, exit -1", reports[0].JobID, r.Reason, r.ExitCode, id, ReasonExecutorRestarted)
			}
			if strings.Contains(r.Message, "restarted") {
				t.Errorf("message %q says again what the reason says", r.Message)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Recover reported nothing")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
