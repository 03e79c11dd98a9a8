// Package approvals owns the authority's approval requests: opening a
// request when a job with a publish target finishes, who may see and
// decide it, and the single-use consumption by the publisher. The
// credential leases that follow a consumption are package leases, which
// records its refusals and asks who approves a tenant here. Every decision
// and every refusal goes to the audit log. It imports no gRPC; the
// authority's api, leases and composition root import it.
package approvals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Bounds on what callers send: a vote's comment or a revocation's reason
// is stored, shown to every approver and audited; an id is at most
// MaxIDBytes.
const (
	MaxCommentBytes = 4096
	MaxIDBytes      = 128
)

// Config configures a Service.
type Config struct {
	Store   store.Store
	Tenants policy.Tenants
	// Artifacts opens result bundles for ReadReview; without it ReadReview
	// is refused.
	Artifacts Artifacts
	Logger    *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Refusals throttles repeated refusals on the log; default a
	// throttle of its own (audit.NewRefusalThrottle). Whoever owns it runs
	// its Flush.
	Refusals *audit.Throttle
	// Meter makes the approval metrics (metrics.go); nil is the global
	// meter provider.
	Meter metric.MeterProvider
}

// Service is the approval logic; safe for concurrent use.
type Service struct {
	cfg Config
	// refusals keeps one caller's repeated refusal from filling the log.
	refusals *audit.Throttle
	metrics  *metrics
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("approvals: store is required")
	}
	if cfg.Tenants == nil {
		cfg.Tenants = policy.Tenants{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Refusals == nil {
		cfg.Refusals = audit.NewRefusalThrottle()
	}
	m, err := newMetrics(cfg.Meter)
	if err != nil {
		return nil, fmt.Errorf("approvals: metrics: %w", err)
	}
	return &Service{cfg: cfg, refusals: cfg.Refusals, metrics: m}, nil
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// Now is the time on the service's clock as the store keeps it (UTC, to
// the microsecond); package leases reads the same clock.
func (s *Service) Now() time.Time { return s.now() }

// newID returns a random id (pkg/ids).
func newID() string { return ids.New() }

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

func denied(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrPermissionDenied, fmt.Sprintf(format, args...))
}

func precondition(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, fmt.Sprintf(format, args...))
}

// refusable reports whether err is a refusal of the caller's request (to
// be audited as denied) rather than an internal failure.
func refusable(err error) bool {
	for _, e := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
		errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Refused records a refused decision and returns err; an err that is not
// a refusal (an internal failure) is returned unrecorded. Repeats go
// through the throttle that approvals and leases share. If the log cannot
// be written the refusal still stands; the failure is logged.
func (s *Service) Refused(ctx context.Context, e audit.Event, err error) error {
	if !refusable(err) {
		return err
	}
	e.Outcome, e.Reason, e.Time = audit.OutcomeDenied, err.Error(), s.now()
	e, ok := s.refusals.Admit(e, e.Time)
	if !ok {
		return err // the same refusal was logged within the window; the next says how many
	}
	if _, aerr := s.cfg.Store.AppendAudit(ctx, e); aerr != nil {
		s.cfg.Logger.ErrorContext(ctx, "audit a refusal", "kind", e.Kind, "error", aerr)
	}
	return err
}

// Target is a publish target.
type Target struct{ Repo, Branch string }

// Effective returns a's state as callers see it: a pending or approved
// request past its expiry is expired.
func Effective(a store.Approval, now time.Time) store.ApprovalState {
	if (a.State == store.ApprovalPending || a.State == store.ApprovalApproved) && !now.Before(a.ExpiresAt) {
		return store.ApprovalExpired
	}
	return a.State
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// PageSize is a caller's page size checked: 0 is 50, at most 500.
func PageSize(n int) (int, error) {
	switch {
	case n == 0:
		return 50, nil
	case n < 0 || n > 500:
		return 0, invalid("page_size", "%d is not between 1 and 500", n)
	}
	return n, nil
}

// readsTenant reports whether caller may read the tenant's results whole:
// one of its clients, or an approver its approval policy lists.
func (s *Service) readsTenant(caller identity.ID, tenant string) bool {
	switch caller.Kind {
	case identity.KindClient:
		t := s.cfg.Tenants[tenant]
		return t != nil && t.HasClient(caller.Principal())
	case identity.KindApprover:
		return s.ApproverOf(caller, tenant)
	}
	return false
}

// ApproverOf reports whether approver caller may see and decide tenant's
// requests (and its leases): the tenant lists it (or lists no approvers at
// all).
func (s *Service) ApproverOf(caller identity.ID, tenant string) bool {
	t := s.cfg.Tenants[tenant]
	return t != nil && caller.Kind == identity.KindApprover && t.Approvals.AllowsApprover(caller.Principal())
}

// IsPublisher reports whether id is the publisher service.
func IsPublisher(id identity.ID) bool {
	return id.Kind == identity.KindService && id.Name == identity.ServicePublisher
}
