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
// whose job has ended, as expired, and ends every lease past its expiry, each with an audit entry by caller (the
// authority itself), and returns how many of each. Both already read as
// expired before the sweep; it makes the log say when they ran out.
func (s *Service) Sweep(ctx context.Context, caller identity.ID) (approvalsExpired, leasesExpired int, err error) {
	now := s.now()
	expired := func(a store.Approval, reason string) audit.Event {
		return audit.Event{Kind: audit.KindApprovalExpired, Caller: caller.String(), Subject: a.ID, Time: now, Outcome: outcomeAllowed, Reason: reason}
	}
	n, err := drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireApprovalsAudited(ctx, now, batch, func(a store.Approval) audit.Event {
			return expired(a, fmt.Sprintf("%s request expired at %s undecided or unconsumed", a.Kind, a.ExpiresAt.Format(time.RFC3339)))
		})
		s.metrics.expired(list)
		return len(list), err
	})
	approvalsExpired += n
	if err != nil {
		return approvalsExpired, leasesExpired, err
	}
	n, err = drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireChangesOfEndedJobsAudited(ctx, batch, func(a store.Approval) audit.Event {
			return expired(a, fmt.Sprintf("change request for job %s: the job has ended, so the change can no longer apply", a.JobID))
		})
		s.metrics.expired(list)
		return len(list), err
	})
	approvalsExpired += n
	if err != nil {
		return approvalsExpired, leasesExpired, err
	}
	leasesExpired, err = drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireLeasesAudited(ctx, now, batch, func(l store.Lease) audit.Event {
			return audit.Event{Kind: audit.KindLeaseExpired, Caller: caller.String(), Subject: l.ID, Time: now, Outcome: outcomeAllowed,
				Reason: fmt.Sprintf("%s lease on %s ended at %s", l.Purpose, l.Resource, l.ExpiresAt.Format(time.RFC3339))}
		})
		return len(list), err
	})
	return approvalsExpired, leasesExpired, err
}

// drain calls step with a batch size until a batch comes back short or
// fails, and returns how many it handled in all.
func drain(step func(batch int) (int, error)) (int, error) {
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

// SweepEvery runs Sweep every interval until ctx ends; failures are
// logged and tried again at the next tick.
func (s *Service) SweepEvery(ctx context.Context, caller identity.ID, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		a, l, err := s.Sweep(ctx, caller)
		switch {
		case err != nil && ctx.Err() == nil:
			s.cfg.Logger.ErrorContext(ctx, "expiry sweep", "error", err)
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
