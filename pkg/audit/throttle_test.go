package audit_test

import (
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
