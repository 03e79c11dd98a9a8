package audit

import (
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// Throttle keeps a caller from filling the log with one refusal repeated:
// an entry whose kind, caller, subject, tenant, job, outcome and reason match one admitted less
// than the window ago is not logged but counted, and the next matching
// entry admitted after the window says how many were left out since. It
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
}

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
			s.suppressed++
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
