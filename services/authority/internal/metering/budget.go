package metering

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// WarnPercent is the share of its budget past which a tenant is warned.
const WarnPercent = 80

// Admit decides whether tenant may start new work: refused
// (errdefs.ErrResourceExhausted) once its month-to-date cost has reached
// its monthly budget, and warned (the sentence returned) at WarnPercent or
// more, the warning logged on the audit log once per tenant and month. A
// tenant without a budget is admitted at no cost of a query.
func (s *Service) Admit(ctx context.Context, tenant string) (warning string, err error) {
	limit := s.cfg.Budgets[tenant]
	if limit <= 0 {
		return "", nil
	}
	now := s.cfg.Now().UTC()
	used, err := s.used(ctx, []string{tenant}, now)
	if err != nil {
		return "", err
	}
	u := used[tenant]
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
// the log is read once per tenant and month). A warning that cannot be
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
