package leases

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Sweep ends every lease past its expiry, and every brokered lease whose
// job has ended, each with an audit entry by caller (the authority
// itself), and returns how many. Expired leases already read as such
// before the sweep; it makes the log say when they ran out. A brokered
// lease of an ended job is live until the sweep ends it (the executor's
// proxy for the job is gone with the job, but its credential must not
// outlive it). approvals.Service.SweepEvery runs it after the approvals'
// sweep.
func (s *Service) Sweep(ctx context.Context, caller identity.ID) (int, error) {
	now := s.now()
	ended, err := s.revokeEnded(ctx, caller, now)
	if err != nil {
		return ended, err
	}
	expired, err := approvals.Drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireLeasesAudited(ctx, now, batch, func(l store.Lease) audit.Event {
			return audit.Event{Kind: audit.KindLeaseExpired, Caller: caller.String(), Subject: l.ID, Time: now, Outcome: audit.OutcomeAllowed,
				Reason: fmt.Sprintf("%s lease on %s ended at %s", l.Purpose, l.Resource, l.ExpiresAt.Format(time.RFC3339))}
		})
		return len(list), err
	})
	return ended + expired, err
}
