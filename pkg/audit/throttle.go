package audit

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// Throttle keeps a caller from filling the log with one refusal repeated:
// an entry whose kind, caller, subject, tenant, job, outcome and reason match one admitted less
// than the window ago is not logged but counted; once the window has
// passed, Due (run by Flush) gives an entry saying how many were left out,
// or the next matching entry admitted says so, whichever comes first. It
// remembers at most maxKeys distinct entries; past that, forgotten ones
// (whose windows ended) make room, and when none has, entries are admitted
// unthrottled rather than lost. Safe for concurrent use.
type Throttle struct {
	window  time.Duration
	maxKeys int

	mu   sync.Mutex
	seen map[[sha256.Size]byte]*throttled
}

type throttled struct {
	since      time.Time // when the last admitted one was logged
	suppressed int
	// sample is the last one left out, first and last when the left-out
	// ones came.
	sample      Event
	first, last time.Time
}

// sampleReason bounds the reason a throttle keeps of a left-out entry.
const sampleReason = 1024

// NewRefusalThrottle is the authority's throttle of refusals: one entry per
// 10 s for each distinct refusal, up to 10,000 remembered.
func NewRefusalThrottle() *Throttle { return NewThrottle(10*time.Second, 10000) }

// NewThrottle returns a Throttle with the given window and capacity.
func NewThrottle(window time.Duration, maxKeys int) *Throttle {
	return &Throttle{window: window, maxKeys: maxKeys, seen: map[[sha256.Size]byte]*throttled{}}
}

// Admit reports whether e goes on the log at now, and returns it with a
// note of how many like it were left out before it.
func (t *Throttle) Admit(e Event, now time.Time) (Event, bool) {
	key := sha256.Sum256([]byte(fmt.Sprintf("%d:%s|%d:%s|%d:%s|%d:%s|%d:%s|%d:%s|%s", len(e.Kind), e.Kind, len(e.Caller), e.Caller,
		len(e.Subject), e.Subject, len(e.Tenant), e.Tenant, len(e.JobID), e.JobID, len(e.Outcome), e.Outcome, e.Reason)))
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.seen[key]; ok {
		if now.Sub(s.since) < t.window {
			if s.suppressed == 0 {
				s.first = now
			}
			s.suppressed++
			s.last = now
			s.sample = e
			s.sample.Reason = bound(e.Reason, sampleReason)
			return e, false
		}
		if s.suppressed > 0 {
			e.Reason += fmt.Sprintf(" (and %d more like it since %s, not logged one by one)", s.suppressed, s.since.UTC().Format(time.RFC3339))
		}
		s.since, s.suppressed = now, 0
		return e, true
	}
	if len(t.seen) >= t.maxKeys {
		for k, s := range t.seen {
			if now.Sub(s.since) >= t.window && s.suppressed == 0 {
				delete(t.seen, k)
			}
		}
		if len(t.seen) >= t.maxKeys {
			return e, true
		}
	}
	t.seen[key] = &throttled{since: now}
	return e, true
}

// Due returns, for every entry with left-out repeats whose window has
// passed at now (every such entry when all is set, as at shutdown), one
// entry saying how many were left out and when, and forgets them.
func (t *Throttle) Due(now time.Time, all bool) []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Event
	for _, s := range t.seen {
		if s.suppressed == 0 || (!all && now.Sub(s.since) < t.window) {
			continue
		}
		e := s.sample
		e.Time = now
		e.Reason += fmt.Sprintf(" (repeated %d more times from %s to %s, not logged one by one)", s.suppressed,
			s.first.UTC().Format(time.RFC3339), s.last.UTC().Format(time.RFC3339))
		out = append(out, e)
		s.since, s.suppressed, s.sample = now, 0, Event{}
	}
	return out
}

// Flush appends what Due gives every interval until ctx ends, then what
// is left (with up to 5 s to write it). Errors are given to fail.
func (t *Throttle) Flush(ctx context.Context, interval time.Duration, write func(context.Context, Event) error, fail func(error)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	flush := func(ctx context.Context, all bool) {
		for _, e := range t.Due(time.Now(), all) {
			if err := write(ctx, e); err != nil {
				fail(err)
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			flush(final, true)
			return
		case <-tick.C:
			flush(ctx, false)
		}
	}
}
