package approvals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Open opens the approval request for job j's result, bound to its bundle
// digest and target, unless the job already has one (then it returns that
// one): calling it again after a retried report is safe. A job that did
// not finish, has no bundle digest or no target gets none, and Open
// returns created=false with a zero approval.
func (s *Service) Open(ctx context.Context, caller identity.ID, j store.Job, t Target) (store.Approval, bool, error) {
	if j.State != store.StateFinished || j.BundleDigest == "" || t.Repo == "" {
		return store.Approval{}, false, nil
	}
	tenant := s.cfg.Tenants[j.Tenant]
	if tenant == nil {
		return store.Approval{}, false, fmt.Errorf("approvals: job %q belongs to unknown tenant %q", j.ID, j.Tenant)
	}
	now := s.now()
	a := store.Approval{
		ID: newID(), JobID: j.ID, Tenant: j.Tenant, Requester: j.Requester, BundleDigest: j.BundleDigest,
		TargetRepo: t.Repo, TargetBranch: t.Branch, State: store.ApprovalPending,
		Required: max(tenant.Approvals.Required, 1), CreatedAt: now, ExpiresAt: now.Add(orDefault(tenant.Approvals.TTL, policy.DefaultApprovalTTL)),
	}
	stored, created, err := s.cfg.Store.CreateApprovalAudited(ctx, a, audit.Event{
		Time: now, Kind: audit.KindApprovalOpened, Caller: caller.String(), Subject: a.ID, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("bundle %s to %s:%s, %d approval(s) needed by %s", a.BundleDigest, a.TargetRepo, a.TargetBranch, a.Required, a.ExpiresAt.Format(time.RFC3339)),
	})
	if err != nil {
		return store.Approval{}, false, fmt.Errorf("approvals: open for job %q: %w", j.ID, err)
	}
	return stored, created, nil
}

// ListRequest selects approval requests.
type ListRequest struct {
	Tenant    string
	States    []store.ApprovalState
	PageSize  int
	PageToken string
}

// List returns a page of approval requests, newest first. Approvers see
// the tenants that list them; a client must name a tenant it acts for. A state filter
// applies to the state callers see (expired included), so a page may hold
// fewer requests than asked even when more follow.
func (s *Service) List(ctx context.Context, caller identity.ID, req ListRequest) ([]store.Approval, string, error) {
	size, err := PageSize(req.PageSize)
	if err != nil {
		return nil, "", err
	}
	switch caller.Kind {
	case identity.KindApprover:
		if req.Tenant != "" && !s.ApproverOf(caller, req.Tenant) {
			return nil, "", denied("tenant: %s is not an approver of tenant %q", caller.Principal(), req.Tenant)
		}
	case identity.KindClient:
		if req.Tenant == "" {
			return nil, "", invalid("tenant", "required for a client")
		}
		if t := s.cfg.Tenants[req.Tenant]; t == nil || !t.HasClient(caller.Principal()) {
			return nil, "", denied("tenant: %s does not act for tenant %q", caller.Principal(), req.Tenant)
		}
	default:
		return nil, "", denied("%s may not list approvals", caller.Principal())
	}
	want := map[store.ApprovalState]bool{}
	var stored []store.ApprovalState
	for _, st := range req.States {
		want[st] = true
		if st == store.ApprovalExpired {
			stored = append(stored, store.ApprovalPending, store.ApprovalApproved)
		} else {
			stored = append(stored, st)
		}
	}
	list, next, err := s.cfg.Store.ListApprovals(ctx, store.ApprovalFilter{Tenant: req.Tenant, States: stored, Limit: size, PageToken: req.PageToken})
	if err != nil {
		return nil, "", err
	}
	now := s.now()
	out := list[:0]
	for _, a := range list {
		// An approver sees only the tenants it approves for.
		if caller.Kind == identity.KindApprover && !s.ApproverOf(caller, a.Tenant) {
			continue
		}
		if len(want) == 0 || want[Effective(a, now)] {
			out = append(out, a)
		}
	}
	return out, next, nil
}

// Get returns one approval request and its job (whose record holds the
// review material). A client sees only its tenant's, an approver only the
// tenants that list it; any other request, existing or not, is NotFound.
func (s *Service) Get(ctx context.Context, caller identity.ID, id string) (store.Approval, store.Job, error) {
	if id == "" {
		return store.Approval{}, store.Job{}, invalid("approval_id", "required")
	}
	a, err := s.cfg.Store.GetApproval(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Approval{}, store.Job{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return store.Approval{}, store.Job{}, err
	}
	switch caller.Kind {
	case identity.KindApprover, identity.KindClient:
		if !s.readsTenant(caller, a.Tenant) {
			return store.Approval{}, store.Job{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, id)
		}
	default:
		return store.Approval{}, store.Job{}, denied("%s may not read approvals", caller.Principal())
	}
	j, err := s.cfg.Store.GetJob(ctx, a.JobID)
	if err != nil {
		return store.Approval{}, store.Job{}, err
	}
	return a, j, nil
}

// IDForJob returns the id of job jobID's approval, or "" if it has none.
func (s *Service) IDForJob(ctx context.Context, jobID string) (string, error) {
	a, err := s.cfg.Store.ApprovalForJob(ctx, jobID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", nil
	}
	return a.ID, err
}

// State returns a's state as callers see it now (see Effective).
func (s *Service) State(a store.Approval) store.ApprovalState { return Effective(a, s.now()) }

// OpenMissing opens the approval of every finished job that has a bundle
// digest and a publish target (as targetOf reads it from the job) but no
// approval yet: what a crash between recording a result and opening its
// approval, with no retried report to follow, would leave. The authority
// runs it at start-up. It returns how many it opened.
func (s *Service) OpenMissing(ctx context.Context, caller identity.ID, targetOf func(store.Job) (Target, error)) (int, error) {
	finished, err := s.cfg.Store.JobsInStates(ctx, store.StateFinished)
	if err != nil {
		return 0, fmt.Errorf("approvals: open missing: %w", err)
	}
	opened := 0
	for _, j := range finished {
		if j.BundleDigest == "" {
			continue
		}
		t, err := targetOf(j)
		if err != nil {
			return opened, fmt.Errorf("approvals: open missing: job %q: %w", j.ID, err)
		}
		if t.Repo == "" {
			continue
		}
		if _, err := s.cfg.Store.ApprovalForJob(ctx, j.ID); err == nil {
			continue
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return opened, err
		}
		_, created, err := s.Open(ctx, caller, j, t)
		if err != nil {
			return opened, err
		}
		if created {
			opened++
		}
	}
	return opened, nil
}
