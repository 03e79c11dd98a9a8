package runs

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestJobMessageNamesNoHostPath: a job that leaves a 3,000-deep directory
// in /out makes its bundle fail; the job's message (and what the authority
// is told) names the path as the job sees it, /out/e/e/..., and no path
// under the executor's state directory.
func TestJobMessageNamesNoHostPath(t *testing.T) {
	h, _ := newHarness(t, false)
	hundred := strings.Repeat("e/", 100)
	g := h.grantFor(`cd /out && for i in $(seq 30); do mkdir -p ` + hundred + ` && cd ` + hundred + ` || exit 1; done && echo x > f`)
	h.start(t, g)
	run := h.waitEnd(t, g.JobID)
	state := filepath.Dir(h.m.cfg.Dir)
	msg := run.Result.Message
	t.Logf("message: %.300s", msg)
	if run.State != Failed || !strings.Contains(msg, "/out/e/e/e/") {
		t.Fatalf("the job ended %s with %.300q; want failed naming /out/e/e/...", run.State, msg)
	}
	reports := h.waitReports(t, 1)
	for name, text := range map[string]string{"message": msg, "report": reports[0].Result.Message} {
		if strings.Contains(text, state) || strings.Contains(text, "/scratch/") {
			t.Errorf("the %s names a host path (%s): %.300q", name, state, text)
		}
	}
}
