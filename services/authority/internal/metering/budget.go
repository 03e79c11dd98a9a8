package metering

import (
	"context"
	"fmt"
	"maps"
	"math/big"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// WarnPercent is the share of its budget past which a tenant is warned.
const WarnPercent = 80

// Admit decides whether tenant may start new work (a job, a session, the
// resume of a suspended session): refused (errdefs.ErrResourceExhausted)
// once its month-to-date cost has reached its monthly budget, and warned
// (the sentence returned) at WarnPercent or more, the warning logged on
// the audit log once per tenant and month. A tenant without a budget is
// admitted at no cost of a query. The limit is soft: concurrent calls may
// read the same cost and all be admitted, and admitted work is never
// stopped.
func (s *Service) Admit(ctx context.Context, tenant string) (warning string, err error) {
	limit := s.cfg.Budgets[tenant]
	if limit <= 0 {
		return "", nil
	}
	now := s.cfg.Now().UTC()
	u, err := s.monthToDate(ctx, tenant, now)
	if err != nil {
		return "", err
	}
	next := MonthStart(now).AddDate(0, 1, 0)
	if u >= limit {
		return "", fmt.Errorf("%w: tenant %s has used %s of its %s monthly budget; new jobs are refused until %s",
			errdefs.ErrResourceExhausted, tenant, u, limit, next.Format(time.DateOnly))
	}
	if int64(u)*100 < int64(limit)*WarnPercent {
		return "", nil
	}
	warning = fmt.Sprintf("tenant %s has used %s of its %s monthly budget (%d%%)", tenant, u, limit, int64(u)*100/int64(limit))
	s.warnOnce(ctx, tenant, now, warning)
	return warning, nil
}

// warnOnce logs tenant's budget warning on the audit log unless it was
// logged this month already (by this process, or by any replica before:
// the log is read once per tenant and month). Two replicas reading the
// log at the same moment may both log it: accepted (docs/metering.md),
// rather than a lock across replicas on the submission path. A warning that cannot be
// logged is logged here and not remembered, so the next submission tries
// again; it never refuses the work.
func (s *Service) warnOnce(ctx context.Context, tenant string, now time.Time, warning string) {
	month := now.Format("2006-01")
	s.mu.Lock()
	done := s.warned[tenant] == month
	s.mu.Unlock()
	if done {
		return
	}
	seen, err := s.cfg.Store.ListAudit(ctx, store.AuditFilter{Kind: audit.KindBudgetWarning, Tenant: tenant, Since: MonthStart(now), Limit: 1})
	if err == nil && len(seen) == 0 {
		_, err = s.cfg.Store.AppendAudit(ctx, audit.Event{Kind: audit.KindBudgetWarning, Caller: s.cfg.Self.String(), Subject: tenant,
			Tenant: tenant, Outcome: audit.OutcomeAllowed, Reason: warning, Time: now})
	}
	if err != nil {
		s.cfg.Logger.Error("audit a budget warning", "tenant", tenant, "error", err)
		return
	}
	s.mu.Lock()
	s.warned[tenant] = month
	s.mu.Unlock()
}

// settled is how long after a job's end its record is taken as final: a
// write stamped earlier than this (a slow commit, another replica's
// clock) is still read.
const settled = 5 * time.Minute

// ledger is a tenant's month so far as Admit last read it: the exact cost
// of the jobs that ended by upTo, which no later read needs again.
type ledger struct {
	month string
	upTo  time.Time
	cost  *big.Rat
	// unreported are the jobs in cost that ended with no result (their
	// span counted as awake), with their cost there: a result recorded
	// later moves a job's end past upTo (the store's stamp), so it is read
	// again, and its cost here is taken back first.
	unreported map[string]*big.Rat
}

// monthToDate is tenant's cost this month as of now, for admission: the
// jobs ended by the ledger's mark are summed once and kept, so each
// submission reads only the jobs running or ended since (a late result
// included).
func (s *Service) monthToDate(ctx context.Context, tenant string, now time.Time) (Micros, error) {
	since, month := MonthStart(now), now.Format("2006-01")
	s.mu.Lock()
	l, ok := s.ledgers[tenant]
	s.mu.Unlock()
	if !ok || l.month != month {
		l = ledger{month: month, upTo: since, cost: new(big.Rat)}
	}
	jobs, err := s.jobs(ctx, store.UsageFilter{Tenants: []string{tenant}, Since: l.upTo, Until: now})
	if err != nil {
		return 0, err
	}
	mark := now.Add(-settled)
	if mark.Before(l.upTo) {
		mark = l.upTo
	}
	base, unreported := new(big.Rat).Set(l.cost), maps.Clone(l.unreported)
	if unreported == nil {
		unreported = map[string]*big.Rat{}
	}
	for _, j := range jobs {
		if c, ok := unreported[j.ID]; ok {
			base.Sub(base, c)
			delete(unreported, j.ID)
		}
	}
	total, kept := new(big.Rat).Set(base), new(big.Rat).Set(base)
	for _, j := range jobs {
		u := Meter(j, since, now, now, s.cfg.Rates)
		total.Add(total, u.cost)
		if !j.Running() && !j.End.After(mark) {
			kept.Add(kept, u.cost)
			if !j.Reported {
				unreported[j.ID] = u.cost
			}
		}
	}
	s.mu.Lock()
	s.ledgers[tenant] = ledger{month: month, upTo: mark, cost: kept, unreported: unreported}
	s.mu.Unlock()
	return round(total), nil
}
