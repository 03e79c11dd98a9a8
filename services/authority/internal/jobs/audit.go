package jobs

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The audit log: appending entries (throttling repeated refusals),
// reading it for approvers, and recording the policy in force.

// audit appends an event that goes with no job change (a refusal, a read).
// A log that cannot be written is an error the caller must see: a decision
// that is not recorded must not take effect.
func (s *Service) audit(ctx context.Context, e audit.Event) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	if _, err := s.cfg.Store.AppendAudit(ctx, e); err != nil {
		return fmt.Errorf("jobs: audit %s: %w", e.Kind, err)
	}
	return nil
}

// auditRefusal records a refusal, unless the same one was recorded within
// the throttle's window (then it is counted, and the next says so).
func (s *Service) auditRefusal(ctx context.Context, e audit.Event) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	e, ok := s.refusals.Admit(e, e.Time)
	if !ok {
		return nil
	}
	return s.audit(ctx, e)
}

// AuditDenied records a call the authorization table refused.
func (s *Service) AuditDenied(ctx context.Context, method string, caller identity.ID, reason string) {
	if err := s.auditRefusal(ctx, audit.Event{Kind: audit.KindRpcDenied, Caller: caller.String(), Subject: method, Outcome: audit.OutcomeDenied, Reason: reason}); err != nil {
		s.cfg.Logger.Error("audit a denied call", "method", method, "caller", caller.String(), "error", err)
	}
}

// AuditQuery selects audit events.
type AuditQuery struct {
	JobID, Tenant, Caller, Kind string
	Since, Until                time.Time
	PageSize                    int
	PageToken                   string
}

// auditPageBytes bounds one page of the audit log.
const auditPageBytes = 2 << 20

// AuditEvents returns a page of the audit log, oldest first, and the token
// of the next page ("" on the last). The authorization table lets only
// approvers call; an auditor reads the whole log, any other approver only
// the entries of a tenant that lists it, and must name that tenant.
func (s *Service) AuditEvents(ctx context.Context, caller identity.ID, q AuditQuery) ([]audit.Event, string, error) {
	if err := s.mayReadAudit(caller, q.Tenant); err != nil {
		return nil, "", err
	}
	size := q.PageSize
	switch {
	case size == 0:
		size = 100
	case size < 0 || size > 1000:
		return nil, "", fmt.Errorf("%w: page_size: %d is not between 1 and 1000", errdefs.ErrInvalidArgument, size)
	}
	var after int64
	if q.PageToken != "" {
		n, err := strconv.ParseInt(strings.TrimPrefix(q.PageToken, "after:"), 10, 64)
		if err != nil || !strings.HasPrefix(q.PageToken, "after:") || n < 0 {
			return nil, "", fmt.Errorf("%w: page_token: not a token this server issued", errdefs.ErrInvalidArgument)
		}
		after = n
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return nil, "", fmt.Errorf("%w: end_time must be after start_time", errdefs.ErrInvalidArgument)
	}
	events, err := s.cfg.Store.ListAudit(ctx, store.AuditFilter{
		JobID: q.JobID, Tenant: q.Tenant, Caller: q.Caller, Kind: q.Kind,
		Since: q.Since, Until: q.Until, AfterSequence: after, Limit: size + 1,
	})
	if err != nil {
		return nil, "", err
	}
	// A page also ends before it would pass auditPageBytes (entries are
	// bounded, but a thousand of them need not fit in one message).
	n, total := 0, 0
	for n < len(events) && n < size {
		e := events[n]
		total += len(e.Kind) + len(e.Caller) + len(e.Subject) + len(e.Tenant) + len(e.JobID) + len(e.Outcome) + len(e.Reason) + 256
		if n > 0 && total > auditPageBytes {
			break
		}
		n++
	}
	next := ""
	if n < len(events) {
		events = events[:n]
		next = fmt.Sprintf("after:%d", events[n-1].Sequence)
	}
	return events, next, nil
}

// IsAuditor reports whether caller reads the whole audit log.
func (s *Service) IsAuditor(caller identity.ID) bool {
	return caller.Kind == identity.KindApprover && slices.Contains(s.cfg.Auditors, caller.Principal())
}

// mayReadAudit says whether caller may read the log's entries of tenant
// ("" for the whole log).
func (s *Service) mayReadAudit(caller identity.ID, tenant string) error {
	switch {
	case s.IsAuditor(caller):
		return nil
	case caller.Kind != identity.KindApprover:
		return fmt.Errorf("%w: only approvers read the audit log", errdefs.ErrPermissionDenied)
	case tenant == "":
		return fmt.Errorf("%w: tenant: required: %s reads only the entries of the tenants that list it as an approver; the whole log is for auditors (the authority config's audit.auditors)",
			errdefs.ErrPermissionDenied, caller.Principal())
	}
	if t := s.cfg.Tenants[tenant]; t == nil || !t.Approvals.AllowsApprover(caller.Principal()) {
		// Told the same whether the tenant exists or not.
		return fmt.Errorf("%w: tenant %q: %s is not one of its approvers", errdefs.ErrPermissionDenied, tenant, caller.Principal())
	}
	return nil
}

// RecordPolicy appends the tenant policy this authority runs with to the
// audit log (kind policy.loaded): a digest of the whole policy and of each
// tenant's, so a change between starts shows as a changed digest.
// Credential files are named by path only; their contents are never read
// here.
func (s *Service) RecordPolicy(ctx context.Context, caller identity.ID) error {
	names := make([]string, 0, len(s.cfg.Tenants))
	for name := range s.cfg.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	digest := func(v any) (string, error) {
		_, d, err := encodeDigested(v)
		return d, err
	}
	all, err := digest(s.cfg.Tenants)
	if err != nil {
		return fmt.Errorf("jobs: policy digest: %w", err)
	}
	parts := []string{fmt.Sprintf("%d tenant(s), policy %s", len(names), all)}
	for _, name := range names {
		d, err := digest(s.cfg.Tenants[name])
		if err != nil {
			return fmt.Errorf("jobs: policy digest: %w", err)
		}
		parts = append(parts, name+" "+d)
	}
	return s.audit(ctx, audit.Event{Kind: audit.KindPolicyLoaded, Caller: caller.String(), Subject: all, Outcome: audit.OutcomeAllowed,
		Reason: strings.Join(parts, "; ")})
}
