package fleetclient

import (
	"testing"
	"time"
)

// TestFenceBound: the fence closes at its own bound, or at half the
// authority's lost bound when that is sooner, counted from when the
// answered heartbeat was sent; it is closed before the first answer.
func TestFenceBound(t *testing.T) {
	now := time.Unix(1000, 0)
	f := NewFence(20*time.Second, func() time.Time { return now })
	if fenced, _ := f.Fenced(); !fenced {
		t.Fatal("open before the first answer")
	}
	sent := now
	now = now.Add(2 * time.Second) // the answer took 2s
	f.answer(sent, 6*time.Second)
	for _, tc := range []struct {
		at     time.Duration // after sending
		fenced bool
	}{{2 * time.Second, false}, {3 * time.Second, false}, {3*time.Second + time.Millisecond, true}, {10 * time.Second, true}} {
		now = sent.Add(tc.at)
		if fenced, _ := f.Fenced(); fenced != tc.fenced {
			t.Errorf("%v after sending, with the authority's lost bound 6s: fenced %v, want %v", tc.at, fenced, tc.fenced)
		}
	}
	// An authority that says no bound: the fence's own.
	sent = now
	f.answer(sent, 0)
	now = sent.Add(19 * time.Second)
	if fenced, _ := f.Fenced(); fenced {
		t.Error("closed before its own bound")
	}
	now = sent.Add(21 * time.Second)
	if fenced, _ := f.Fenced(); !fenced {
		t.Error("open past its own bound")
	}
	// An answer to an older heartbeat does not move the fence back.
	f.answer(sent.Add(-time.Minute), 0)
	if fenced, _ := f.Fenced(); !fenced {
		t.Error("an older answer reopened the fence")
	}
}
