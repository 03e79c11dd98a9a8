package approvals

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Sweep rewrites every approval past its expiry, and every change request
// whose job has ended, as expired, each with an audit entry by caller (the
// authority itself), and returns how many. They already read as expired
// before the sweep; it makes the log say when they ran out.
func (s *Service) Sweep(ctx context.Context, caller identity.ID) (approvalsExpired int, err error) {
	now := s.now()
	expired := func(a store.Approval, reason string) audit.Event {
		return audit.Event{Kind: audit.KindApprovalExpired, Caller: caller.String(), Subject: a.ID, Time: now, Outcome: audit.OutcomeAllowed, Reason: reason}
	}
	n, err := Drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireApprovalsAudited(ctx, now, batch, func(a store.Approval) audit.Event {
			return expired(a, fmt.Sprintf("%s request expired at %s undecided or unconsumed", a.Kind, a.ExpiresAt.Format(time.RFC3339)))
		})
		s.metrics.expired(list)
		return len(list), err
	})
	approvalsExpired += n
	if err != nil {
		return approvalsExpired, err
	}
	n, err = Drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireChangesOfEndedJobsAudited(ctx, batch, func(a store.Approval) audit.Event {
			return expired(a, fmt.Sprintf("%s request for job %s: the job has ended, so it can no longer apply", a.Kind, a.JobID))
		})
		s.metrics.expired(list)
		return len(list), err
	})
	return approvalsExpired + n, err
}

// Drain calls step with a batch size until a batch comes back short or
// fails, and returns how many it handled in all.
func Drain(step func(batch int) (int, error)) (int, error) {
	const batch = 100
	total := 0
	for {
		n, err := step(batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
	}
}

// SweepEvery runs Sweep, then leases (package leases' Sweep), every
// interval until ctx ends; failures are logged and tried again at the next
// tick.
func (s *Service) SweepEvery(ctx context.Context, caller identity.ID, interval time.Duration,
	leases func(context.Context, identity.ID) (int, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		// Each sweep runs whatever the other did: a failing approvals
		// sweep must not keep expired leases usable.
		a, aerr := s.Sweep(ctx, caller)
		l, lerr := leases(ctx, caller)
		switch {
		case (aerr != nil || lerr != nil) && ctx.Err() == nil:
			s.cfg.Logger.ErrorContext(ctx, "expiry sweep", "approvals_error", aerr, "leases_error", lerr,
				"approvals_expired", a, "leases_expired", l)
		case a+l > 0:
			s.cfg.Logger.InfoContext(ctx, "expiry sweep", "approvals_expired", a, "leases_expired", l)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
