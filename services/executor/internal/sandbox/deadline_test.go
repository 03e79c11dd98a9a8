package sandbox

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// When the deadline timer fires, the deadline in force decides, not the
// one the timer was armed for: UpdateLimits may have extended it with its
// wake-up still unread (Run's select takes either when both are ready).
// The test extends the deadline without the wake-up, which is that race
// decided the wrong way every time.
func TestDeadlineTimerRechecksExtendedDeadline(t *testing.T) {
	e := newEnv(t)
	lim := defaultLimits
	lim.Deadline = slowdown * 1500 * time.Millisecond
	l := e.start(t, fmt.Sprintf("echo started; sleep %d; echo finished", 3*slowdown), lim)
	l.waitOutput(t, "started")
	l.sb.mu.Lock()
	l.sb.spec.Limits.Deadline = time.Minute
	l.sb.mu.Unlock()
	r := l.wait(t)
	wantExit(t, r, 0)
	if !strings.Contains(r.stdout, "finished") {
		t.Fatalf("the job was killed at the deadline it had before: %s %q", r.res.Reason, r.res.Message)
	}
}

func TestUntilDeadline(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		elapsed, deadline, want time.Duration
	}{
		{time.Second, time.Minute, 59 * time.Second},
		{time.Minute, time.Minute, 0},
		{2 * time.Minute, time.Minute, -time.Minute},
	} {
		if got := untilDeadline(start, start.Add(tc.elapsed), tc.deadline); got != tc.want {
			t.Errorf("after %s under %s: %s left, want %s", tc.elapsed, tc.deadline, got, tc.want)
		}
	}
}
