package fleetclient

import (
	"sync"
	"time"
)

// Fence holds new sandboxes back (runs.Fence) while the authority has not
// answered a heartbeat for longer than its bound, and before the first
// answer after the process started. The authority declares an executor
// lost after its own, longer bound (fleet.lost_after) and then places the
// executor's queued jobs elsewhere: a fenced executor has stopped starting
// them by then, so no job starts on two executors.
type Fence struct {
	after time.Duration
	now   func() time.Time

	mu sync.Mutex
	// bound is after, or half the authority's lost bound when that is
	// shorter (it says it in every answer).
	bound time.Duration
	// answered is when the last answered heartbeat was sent; zero before
	// the first.
	answered time.Time
	changed  chan struct{} // closed and replaced on every answer
}

// NewFence is a fence that closes after without an answer; now is the
// clock (nil: time.Now).
func NewFence(after time.Duration, now func() time.Time) *Fence {
	if now == nil {
		now = time.Now
	}
	return &Fence{after: after, bound: after, now: now, changed: make(chan struct{})}
}

// Fenced implements runs.Fence.
func (f *Fence) Fenced() (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fencedLocked(), f.changed
}

func (f *Fence) fencedLocked() bool {
	return f.answered.IsZero() || f.now().Sub(f.answered) > f.bound
}

// answer records that the heartbeat sent at sent was answered, opening the
// fence, and the authority's lost bound lostAfter (0: not said): the fence
// closes at half of it when that is sooner than its own bound, so it is
// shut well before the authority places this executor's jobs elsewhere,
// counted from the sending, not from the answer's arrival.
func (f *Fence) answer(sent time.Time, lostAfter time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bound = f.after
	if lostAfter > 0 {
		f.bound = min(f.after, lostAfter/2)
	}
	if sent.After(f.answered) {
		f.answered = sent
	}
	close(f.changed)
	f.changed = make(chan struct{})
}
