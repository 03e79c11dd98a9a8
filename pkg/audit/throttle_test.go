package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
)

func TestThrottle(t *testing.T) {
	th := audit.NewThrottle(10*time.Second, 3)
	t0 := time.Unix(1_800_000_000, 0)
	e := audit.Event{Kind: "rpc.denied", Caller: "spiffe://x/client/a", Outcome: "denied", Reason: "no"}
	if _, ok := th.Admit(e, t0); !ok {
		t.Fatal("the first refusal was not admitted")
	}
	for i := 1; i <= 99; i++ {
		if _, ok := th.Admit(e, t0.Add(time.Duration(i)*50*time.Millisecond)); ok {
			t.Fatalf("repeat %d admitted inside the window", i)
		}
	}
	other := e
	other.Caller = "spiffe://x/client/b"
	if _, ok := th.Admit(other, t0.Add(time.Second)); !ok {
		t.Error("another caller's refusal was throttled")
	}
	got, ok := th.Admit(e, t0.Add(11*time.Second))
	if !ok || !strings.Contains(got.Reason, "and 99 more like it since") {
		t.Errorf("after the window: %v %q", ok, got.Reason)
	}
	// Full of distinct entries still in their windows: admitted, not lost.
	for _, c := range []string{"c", "d", "e"} {
		x := e
		x.Caller = c
		if _, ok := th.Admit(x, t0.Add(12*time.Second)); !ok {
			t.Errorf("caller %s: a new entry was lost when the throttle was full", c)
		}
	}
}

// TestThrottleDueAndFlush: left-out repeats are not lost waiting for a
// next matching entry: once the window has passed Due says how many, and
// Flush writes what is left when it stops.
func TestThrottleDueAndFlush(t *testing.T) {
	th := audit.NewThrottle(10*time.Second, 100)
	t0 := time.Unix(1_800_000_000, 0)
	e := audit.Event{Kind: "job.refused", Caller: "spiffe://x/client/a", Tenant: "dev", Outcome: "denied", Reason: "no such repository"}
	th.Admit(e, t0)
	for i := 1; i <= 5; i++ {
		th.Admit(e, t0.Add(time.Duration(i)*time.Second))
	}
	if due := th.Due(t0.Add(5*time.Second), false); len(due) != 0 {
		t.Fatalf("inside the window: %v", due)
	}
	due := th.Due(t0.Add(11*time.Second), false)
	if len(due) != 1 || !strings.Contains(due[0].Reason, "no such repository (repeated 5 more times from") ||
		due[0].Kind != e.Kind || due[0].Caller != e.Caller || due[0].Tenant != "dev" || !due[0].Time.Equal(t0.Add(11*time.Second)) {
		t.Fatalf("after the window: %+v", due)
	}
	if again := th.Due(t0.Add(30*time.Second), true); len(again) != 0 {
		t.Fatalf("the same repeats reported twice: %v", again)
	}

	// Flush writes the rest when its context ends, whatever the window
	// (both are inside the window of the summary above).
	th.Admit(e, time.Now())
	th.Admit(e, time.Now())
	ctx, cancel := context.WithCancel(t.Context())
	var got []audit.Event
	done := make(chan struct{})
	go func() {
		defer close(done)
		th.Flush(ctx, time.Hour, func(_ context.Context, e audit.Event) error { got = append(got, e); return nil }, func(err error) { t.Error(err) })
	}()
	cancel()
	<-done
	if len(got) != 1 || !strings.Contains(got[0].Reason, "repeated 2 more times") {
		t.Fatalf("flushed at stop: %+v", got)
	}
}
