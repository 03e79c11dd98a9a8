// Package egressbase is what a job's two egress services by name share: the
// egress proxy (egressproxy) and the job's DNS server (jobdns). It owns the
// Resolver they ask, the policy's name rules as they keep them, the ranges
// refused whatever a name resolves to, and the log of their decisions, where
// refusals past a cap per name per minute are summarised instead of listed.
// Only those two packages import it.
package egressbase

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/refusalcap"
)

// Resolver answers a name with addresses. *net.Resolver is one; production
// passes one bound to the executor's configured upstream resolvers
// (network.resolvers).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DefaultDenialsPerMinute is how many refusals of one name are recorded one
// by one in a minute when a Config says zero.
const DefaultDenialsPerMinute = 20

// Check checks what both services' Configs need: a resolver and valid
// Extra ranges; who names the service in the error.
func Check(who string, r Resolver, extra []netip.Prefix) error {
	if r == nil {
		return fmt.Errorf("%s: a Resolver is required", who)
	}
	for _, p := range extra {
		if !p.IsValid() {
			return fmt.Errorf("%s: an Extra prefix is not valid", who)
		}
	}
	return nil
}

// Names is p's name rules normalised (its prefix rules are the kernel's
// business), or why p does not normalise; who names the service.
func Names(who string, p egress.Policy) ([]egress.Name, error) {
	n, err := egress.Policy{Names: p.Names}.Normalize()
	if err != nil {
		return nil, fmt.Errorf("%s: policy: %v", who, err)
	}
	return n.Names, nil
}

// Refused is the ranges refused beyond egress.Internal's now: extra, and
// what refused (when set) says at this moment.
func Refused(extra []netip.Prefix, refused func() []netip.Prefix) []netip.Prefix {
	if refused == nil {
		return extra
	}
	return append(slices.Clip(extra), refused()...)
}

// Log hands decisions of type D to a record function, never two at once,
// and holds back refusals past perMinute of one key (ten times as many over
// all keys) for a summary made by summarise.
type Log[D any] struct {
	mu     sync.Mutex
	record func(D)
	// Gate is the cap; tests shorten its window.
	Gate refusalcap.Gate[D]
}

// NewLog returns a Log; perMinute zero is DefaultDenialsPerMinute, a nil
// record discards.
func NewLog[D any](perMinute int, record func(D), summarise func(refusalcap.Summary[D]) D) *Log[D] {
	if perMinute <= 0 {
		perMinute = DefaultDenialsPerMinute
	}
	if record == nil {
		record = func(D) {}
	}
	l := &Log[D]{record: record}
	l.Gate = refusalcap.Gate[D]{
		PerKey: perMinute, Overall: 10 * perMinute, Every: time.Minute,
		Record: record, Summarise: summarise, Mu: &l.mu,
	}
	return l
}

// Emit records d when allowed; a refusal of key is recorded or counted.
func (l *Log[D]) Emit(d D, allowed bool, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if allowed {
		l.record(d)
		return
	}
	l.Gate.Refused(key, d, time.Now())
}

// Flush records the summaries of refusals still being counted.
func (l *Log[D]) Flush() {
	l.mu.Lock()
	l.Gate.Flush()
	l.mu.Unlock()
}

// SummaryReason is the reason a summary record gives: what were refused
// (say "refusals"), how many, over what and when, and the cap.
func SummaryReason[D any](what string, w refusalcap.Summary[D]) string {
	return fmt.Sprintf("%d more %s %s in the %s from %s, not recorded one by one (the cap is %d)", w.Suppressed, what, w.What("names"), w.Every, w.Start.Format(time.RFC3339), w.Limit)
}
