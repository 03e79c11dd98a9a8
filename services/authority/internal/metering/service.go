package metering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Store is what metering reads and writes of the authority's store.
type Store interface {
	UsageJobs(ctx context.Context, f store.UsageFilter) ([]store.UsageRecord, error)
	ListAudit(ctx context.Context, f store.AuditFilter) ([]audit.Event, error)
	AppendAudit(ctx context.Context, e audit.Event) (audit.Event, error)
}

// Decoder reads a stored job's grant and result into a Job (the wire
// format is the composition root's to know).
type Decoder func(store.UsageRecord) (Job, error)

// Config is what the Service needs.
type Config struct {
	Store  Store
	Decode Decoder
	// Tenants scope who reads which tenant's usage.
	Tenants policy.Tenants
	Rates   Rates
	// Budgets are tenants' monthly budgets; a tenant not named has none.
	Budgets map[string]Micros
	// Self is the authority, the caller of the budget warnings it logs.
	Self   identity.ID
	Meter  metric.MeterProvider
	Logger *slog.Logger
	Now    func() time.Time
	// MaxJobs is the most jobs a Query reads; 0 is MaxJobs.
	MaxJobs int
}

// Service meters usage, answers for it, and keeps tenants' budgets.
type Service struct {
	cfg     Config
	metrics *metrics

	mu sync.Mutex
	// warned is the month ("2026-12") each tenant's budget warning was
	// last logged for, so it is logged once a month, not per submission.
	warned map[string]string
	// ledgers keep each tenant's settled month-to-date cost (budget.go).
	ledgers map[string]ledger
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Decode == nil {
		return nil, errors.New("metering: store and decoder are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxJobs <= 0 {
		cfg.MaxJobs = MaxJobs
	}
	if cfg.Tenants == nil {
		cfg.Tenants = policy.Tenants{}
	}
	m, err := newMetrics(cfg.Meter)
	if err != nil {
		return nil, fmt.Errorf("metering: metrics: %w", err)
	}
	return &Service{cfg: cfg, metrics: m, warned: map[string]string{}, ledgers: map[string]ledger{}}, nil
}

// Rates are the rates in force.
func (s *Service) Rates() Rates { return s.cfg.Rates }

// MaxWindow is the longest window a Query reads, so that one request
// cannot read a tenant's whole history; a longer report is several.
const MaxWindow = 93 * 24 * time.Hour

// MaxJobs is the most jobs and sessions a Query reads by default: a
// window holding more is refused (its totals would be wrong cut), naming
// since.
const MaxJobs = 20000

// Grouping is how a Query groups its rows.
type Grouping int

const (
	ByJob Grouping = iota
	ByDay
)

// Query selects usage.
type Query struct {
	// Tenant is one tenant; "" is every tenant the caller may read.
	Tenant string
	// Since defaults to the start of the current UTC month, Until to now.
	Since, Until time.Time
	By           Grouping
	// Limit is 1-1000; 0 is 100.
	Limit int
}

// Budget is a tenant's monthly budget and the month's cost so far.
type Budget struct {
	Tenant string
	Limit  Micros
	Used   Micros
}

// Report is a Query's answer.
type Report struct {
	Rows      []Usage
	Total     Usage
	Truncated bool
	Since     time.Time
	Until     time.Time
	Budgets   []Budget
}

// MonthStart is the start of t's UTC month.
func MonthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

// readable is the tenants caller may read usage of: a client the tenants
// it acts for, an approver those whose approvals it may give, an operator
// all. A tenant named that caller may not read is refused, naming it.
func (s *Service) readable(caller identity.ID, tenant string) ([]string, error) {
	may := func(name string) bool {
		t := s.cfg.Tenants[name]
		switch {
		case t == nil:
			return false
		case caller.Kind == identity.KindOperator:
			return true
		case caller.Kind == identity.KindClient:
			return t.HasClient(caller.Principal())
		case caller.Kind == identity.KindApprover:
			return t.Approvals.AllowsApprover(caller.Principal())
		}
		return false
	}
	if tenant != "" {
		if !may(tenant) {
			return nil, fmt.Errorf("%w: tenant: %s may not read the usage of tenant %q", errdefs.ErrPermissionDenied, caller.Principal(), tenant)
		}
		return []string{tenant}, nil
	}
	var out []string
	for name := range s.cfg.Tenants {
		if may(name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s reads the usage of no tenant", errdefs.ErrPermissionDenied, caller.Principal())
	}
	return out, nil
}

// Usage answers q for caller.
func (s *Service) Usage(ctx context.Context, caller identity.ID, q Query) (Report, error) {
	now := s.cfg.Now().UTC()
	switch {
	case q.Limit < 0 || q.Limit > 1000:
		return Report{}, invalid("limit", "%d: must be between 1 and 1000 (0 is 100)", q.Limit)
	case q.Limit == 0:
		q.Limit = 100
	}
	if q.By != ByJob && q.By != ByDay {
		return Report{}, invalid("by", "%d: want job or day", q.By)
	}
	if q.Since.IsZero() {
		q.Since = MonthStart(now)
	}
	if q.Until.IsZero() {
		q.Until = now
	}
	if !q.Since.Before(q.Until) {
		return Report{}, invalid("since", "%s is not before until (%s)", q.Since.Format(time.RFC3339), q.Until.Format(time.RFC3339))
	}
	if q.Until.Sub(q.Since) > MaxWindow {
		return Report{}, invalid("since", "the window from since to until is %s: at most %d days", q.Until.Sub(q.Since).Round(time.Hour), MaxWindow/(24*time.Hour))
	}
	tenants, err := s.readable(caller, q.Tenant)
	if err != nil {
		return Report{}, err
	}
	jobs, err := s.jobs(ctx, store.UsageFilter{Tenants: tenants, Since: q.Since, Until: q.Until, Limit: s.cfg.MaxJobs + 1})
	if err != nil {
		return Report{}, err
	}
	if len(jobs) > s.cfg.MaxJobs {
		// Totals count every job, so a window is read whole or refused.
		return Report{}, invalid("since", "more than %d jobs and sessions ran between since (%s) and until: ask for a shorter window",
			s.cfg.MaxJobs, q.Since.Format(time.RFC3339))
	}
	rep := Report{Since: q.Since, Until: q.Until}
	var rows []Usage
	switch q.By {
	case ByJob:
		for _, j := range jobs {
			// A job whose minutes all fall outside the window (it ended,
			// or a running one started, within the minute after since)
			// has no row.
			if u := Meter(j, q.Since, q.Until, now, s.cfg.Rates); u.AwakeMinutes+u.AsleepMinutes > 0 {
				rows = append(rows, u)
			}
		}
		// The store gives them newest start first.
	case ByDay:
		type key struct{ tenant, day, class string }
		byKey := map[key]Usage{}
		for _, j := range jobs {
			for _, d := range Days(j, q.Since, q.Until, now, s.cfg.Rates) {
				k := key{d.Tenant, d.Day, d.Class}
				if have, ok := byKey[k]; ok {
					byKey[k] = have.Add(d)
				} else {
					d.JobID = ""
					byKey[k] = d
				}
			}
		}
		for _, u := range byKey {
			rows = append(rows, u)
		}
		sort.Slice(rows, func(i, k int) bool {
			a, b := rows[i], rows[k]
			if a.Day != b.Day {
				return a.Day > b.Day
			}
			if a.Tenant != b.Tenant {
				return a.Tenant < b.Tenant
			}
			return a.Class < b.Class
		})
	}
	for _, r := range rows {
		rep.Total = rep.Total.Add(r)
	}
	rep.Total.Start = time.Time{}
	if len(rows) > q.Limit {
		rows, rep.Truncated = rows[:q.Limit], true
	}
	rep.Rows = rows
	used, err := s.used(ctx, tenants, now)
	if err != nil {
		return Report{}, err
	}
	for _, t := range tenants {
		rep.Budgets = append(rep.Budgets, Budget{Tenant: t, Limit: s.cfg.Budgets[t], Used: used[t]})
	}
	return rep, nil
}

// jobs reads and decodes the jobs f selects; a record that cannot be
// decoded is logged and left out.
func (s *Service) jobs(ctx context.Context, f store.UsageFilter) ([]Job, error) {
	recs, err := s.cfg.Store.UsageJobs(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]Job, 0, len(recs))
	for _, r := range recs {
		j, err := s.cfg.Decode(r)
		if err != nil {
			s.cfg.Logger.Warn("metering: a job's record cannot be read; left out", "job", r.ID, "error", err)
			continue
		}
		out = append(out, j)
	}
	return out, nil
}

// MonthToDate is tenant's cost since the start of the current UTC month,
// jobs that ended and jobs still running (until now) alike.
func (s *Service) MonthToDate(ctx context.Context, tenant string) (Micros, error) {
	return s.monthToDate(ctx, tenant, s.cfg.Now().UTC())
}

// used is each tenant's cost this month as of now, from the ledgers
// admission keeps (budget.go): a tenant's settled month is read once.
func (s *Service) used(ctx context.Context, tenants []string, now time.Time) (map[string]Micros, error) {
	out := make(map[string]Micros, len(tenants))
	for _, t := range tenants {
		u, err := s.monthToDate(ctx, t, now)
		if err != nil {
			return nil, err
		}
		out[t] = u
	}
	return out, nil
}
