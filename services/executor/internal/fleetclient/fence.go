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

	mu       sync.Mutex
	answered time.Time     // the last answer; zero before the first
	changed  chan struct{} // closed and replaced on every answer
}

// NewFence is a fence that closes after without an answer; now is the
// clock (nil: time.Now).
func NewFence(after time.Duration, now func() time.Time) *Fence {
	if now == nil {
		now = time.Now
	}
	return &Fence{after: after, now: now, changed: make(chan struct{})}
}

// Fenced implements runs.Fence.
func (f *Fence) Fenced() (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fencedLocked(), f.changed
}

func (f *Fence) fencedLocked() bool {
	return f.answered.IsZero() || f.now().Sub(f.answered) > f.after
}

// answer records an answered heartbeat, opening the fence.
func (f *Fence) answer() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answered = f.now()
	close(f.changed)
	f.changed = make(chan struct{})
}
