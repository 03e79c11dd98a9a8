package sandbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestKillsAtOnce: two kills of one job's cgroup at once both end, with
// nothing of the job left. Each freezes the cgroup, kills and thaws it;
// before the fix, a kill whose freeze the other's thaw undid waited out
// the whole freeze wait (200 ms) for nothing, and a pooled job's end took
// ~200 ms more in about a third of runs (on the old code, 4 of 6 rounds
// here took that long). A loaded machine can make any kill slow, so the
// test fails only when more than a third of its rounds wait out the
// freeze; TestAwaitFrozen checks the wait's rule itself.
func TestKillsAtOnce(t *testing.T) {
	e := newEnv(t)
	const rounds = 15
	slow := 0
	for i := range rounds {
		spec := Spec{ID: fmt.Sprintf("kills-%d", i), Class: ClassRunc, Source: e.source(t, nil), Limits: defaultLimits,
			Command: []string{"sh", "-c", "sleep 100 & sleep 100 & sleep 100 & wait"}}
		sb, err := e.m.Create(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan Result, 1)
		go func() { r, _ := sb.Run(context.Background()); done <- r }()
		waitFor(t, "the job's four processes", 10*slowdown*time.Second, func() bool { return len(e.m.cg.procs(sb.cgRel)) >= 4 })
		var wg sync.WaitGroup
		took := make([]time.Duration, 2)
		errs := make([]error, 2)
		for k := range took {
			wg.Go(func() {
				began := time.Now()
				errs[k] = e.m.cg.kill(sb.cgRel, killWait)
				took[k] = time.Since(began)
			})
		}
		wg.Wait()
		if left := e.m.cg.procs(sb.cgRel); len(left) > 0 {
			t.Errorf("round %d: processes left after both kills: %v", i, left)
		}
		var r Result
		select {
		case r = <-done:
		case <-time.After(10 * slowdown * time.Second):
			t.Fatalf("round %d: the job's Run did not end after its processes were killed", i)
		}
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		for k := range took {
			if errs[k] != nil {
				t.Errorf("round %d: kill %d: %v", i, k, errs[k])
			}
		}
		t.Logf("round %d: the kills took %v and %v; the job ended %s (%s)", i, took[0], took[1], r.Reason, r.Message)
		if max(took[0], took[1]) >= freezeWait*slowdown {
			slow++
		}
	}
	if slow > rounds/3 {
		t.Errorf("%d of %d rounds had a kill that waited out the freeze wait (%v)", slow, rounds, freezeWait)
	}
}

// TestAwaitFrozen: a kill's wait for its freeze ends at once when the
// cgroup is frozen, or thawed by another kill (whose SIGKILLs are sent),
// and otherwise after freezeWait.
func TestAwaitFrozen(t *testing.T) {
	for _, c := range []struct {
		name           string
		frozen, thawed bool
		wantWait       bool
	}{
		{"frozen", true, false, false},
		{"thawed by another kill", false, true, false},
		{"still freezing", false, false, true},
	} {
		began := time.Now()
		awaitFrozen(func() (bool, bool) { return c.frozen, c.thawed })
		took := time.Since(began)
		if c.wantWait != (took >= freezeWait) {
			t.Errorf("%s: the wait took %v, want it to wait out %v: %v", c.name, took, freezeWait, c.wantWait)
		}
	}
}
