package jobs

import (
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// TestGateWaitsWithoutSpinning: a waiter that may not go (its tenant at
// its quota) after an executor refusal whose hold-off has passed sleeps
// until woken or its wait ends; it used to loop without pause.
func TestGateWaitsWithoutSpinning(t *testing.T) {
	g := newGate(time.Now, func(string) policy.Quota { return policy.Quota{RunningJobs: 1} })
	g.hold("running", "dev", use{memory: 1})
	g.refused("refused", "other", use{memory: 1}, time.Millisecond) // a hold-off that ends at once
	time.Sleep(5 * time.Millisecond)
	start := time.Now()
	ok, why := g.enter("waiting", "dev", use{memory: 1}, 300*time.Millisecond)
	if ok || why == "" {
		t.Fatalf("a job over its tenant's quota went (%v, %q)", ok, why)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("the wait ended after %v, want about 300ms", d)
	}
	g.mu.Lock()
	looks := g.looks
	g.mu.Unlock()
	if looks > 10 {
		t.Errorf("the waiter looked %d times in 300ms: it spins", looks)
	}
}

// TestGateWithdrawEndsAWait: a cancelled job's wait ends at once.
func TestGateWithdrawEndsAWait(t *testing.T) {
	g := newGate(time.Now, func(string) policy.Quota { return policy.Quota{RunningJobs: 1} })
	g.hold("running", "dev", use{})
	done := make(chan string)
	go func() {
		_, why := g.enter("waiting", "dev", use{}, 10*time.Second)
		done <- why
	}()
	time.Sleep(50 * time.Millisecond)
	g.withdraw("waiting")
	select {
	case why := <-done:
		if why != "" {
			t.Errorf("a withdrawn wait ended with %q, want \"\"", why)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("withdraw did not end the wait")
	}
}

// TestGateResizeNeverHoldsForAnEndedJob: a change applied after a job's
// drive ended does not make it hold its share again.
func TestGateResizeNeverHoldsForAnEndedJob(t *testing.T) {
	g := newGate(time.Now, func(string) policy.Quota { return policy.Quota{} })
	g.hold("a", "dev", use{memory: 1})
	g.release("a")
	g.resize("a", "dev", use{memory: 2})
	if n, _ := g.holdingOf("dev", ""); n != 0 {
		t.Fatalf("an ended job holds again after a resize (%d jobs)", n)
	}
	g.hold("b", "dev", use{memory: 1})
	g.resize("b", "dev", use{memory: 5})
	if _, u := g.holdingOf("dev", ""); u.memory != 5 {
		t.Errorf("after a resize the job holds %d, want 5", u.memory)
	}
}
