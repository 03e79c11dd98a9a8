package sandbox

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The self-check's workload passes where nothing corrupts it (here, on the
// host), and every part of it ran.
func TestSelfCheckMain(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := selfCheckMain(300*time.Millisecond, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), selfCheckOutput+" rounds=") {
		t.Fatalf("selfCheckMain = %d, stdout %q, stderr %q; want 0 and %q", code, stdout.String(), stderr.String(), selfCheckOutput)
	}
	for n := range 40 {
		if deepFrames(n, 5) != deepFramesWant(n, 5) {
			t.Fatalf("deepFrames(%d, 5) = %#x, deepFramesWant %#x", n, deepFrames(n, 5), deepFramesWant(n, 5))
		}
	}
}

// A pass is recorded under the executor's state dir: an executor that
// starts again there with the same binaries, platform, check length, kernel
// and CPU skips the check (and says it did); a change of any of them runs
// it again.
func TestSelfCheckCached(t *testing.T) {
	first := newEnv(t)
	probe := func(e *env) (RuntimeStatus, time.Duration) {
		t.Helper()
		start := time.Now()
		st, ok := e.m.Available(ClassRunsc)
		if !ok {
			t.Fatalf("runsc unavailable: %s", st.Reason)
		}
		if st.SelfCheck != SelfCheckPassed {
			t.Fatalf("self-check %q, want passed", st.SelfCheck)
		}
		return st, time.Since(start)
	}
	st, cold := probe(first)
	if st.SelfCheckCached {
		t.Fatal("the first probe in a new state dir says its self-check was cached")
	}
	again := newEnv(t, func(c *Config) { c.StateDir = first.cfg.StateDir })
	st, warm := probe(again)
	if !st.SelfCheckCached {
		t.Fatal("a second start in the same state dir ran the self-check again")
	}
	longer := newEnv(t, func(c *Config) {
		c.StateDir = first.cfg.StateDir
		c.RunscSelfCheck = first.cfg.RunscSelfCheck + time.Second
	})
	if st, _ := probe(longer); st.SelfCheckCached {
		t.Fatal("a longer self-check was taken from a shorter one's pass")
	}
	t.Logf("probe with the self-check (%s): %s; with its pass cached: %s", first.cfg.RunscSelfCheck, cold.Round(time.Millisecond), warm.Round(time.Millisecond))
	if warm >= cold-first.cfg.RunscSelfCheck/2 {
		t.Errorf("the cached probe took %s, the full one %s", warm, cold)
	}
}
