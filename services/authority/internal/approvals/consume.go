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

// ConsumeRequest is what the publisher is about to publish.
type ConsumeRequest struct {
	ID, JobID, BundleDigest string
	Target                  Target
}

// Consume turns an approved request into consumed, once, for exactly its
// job, digest and target; anything else fails naming what differs.
func (s *Service) Consume(ctx context.Context, caller identity.ID, req ConsumeRequest) (store.Approval, error) {
	ev := audit.Event{Kind: audit.KindApprovalConsumed, Caller: caller.String(), Subject: req.ID, JobID: req.JobID}
	a, err := s.checkConsume(ctx, caller, req, &ev)
	if err != nil {
		return store.Approval{}, s.Refused(ctx, ev, err)
	}
	now := s.now()
	e := ev
	e.Time, e.Outcome = now, audit.OutcomeAllowed
	e.Reason = fmt.Sprintf("bundle %s to %s:%s", a.BundleDigest, a.TargetRepo, a.TargetBranch)
	out, err := s.cfg.Store.ConsumeApprovalAudited(ctx, store.ConsumeRequest{
		ID: req.ID, JobID: req.JobID, BundleDigest: req.BundleDigest, TargetRepo: req.Target.Repo, TargetBranch: req.Target.Branch,
		By: caller.String(), At: now,
	}, e)
	if err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			err = precondition("approval %q was consumed, or changed, concurrently", req.ID)
		}
		return store.Approval{}, s.Refused(ctx, ev, err)
	}
	return out, nil
}

func (s *Service) checkConsume(ctx context.Context, caller identity.ID, req ConsumeRequest, ev *audit.Event) (store.Approval, error) {
	if !IsPublisher(caller) {
		return store.Approval{}, denied("only the publisher consumes approvals")
	}
	switch {
	case req.ID == "":
		return store.Approval{}, invalid("approval_id", "required")
	case req.JobID == "":
		return store.Approval{}, invalid("job_id", "required")
	case req.BundleDigest == "":
		return store.Approval{}, invalid("bundle_digest", "required")
	case req.Target.Repo == "" || req.Target.Branch == "":
		return store.Approval{}, invalid("target", "repository and branch are required")
	}
	a, err := s.cfg.Store.GetApproval(ctx, req.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Approval{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, req.ID)
	}
	if err != nil {
		return store.Approval{}, err
	}
	ev.Tenant = a.Tenant
	switch {
	case req.JobID != a.JobID:
		return a, precondition("job_id: approval %q is for job %q, not %q", a.ID, a.JobID, req.JobID)
	case req.BundleDigest != a.BundleDigest:
		return a, precondition("bundle_digest: approval %q is for %s, not %s", a.ID, a.BundleDigest, req.BundleDigest)
	case req.Target.Repo != a.TargetRepo || req.Target.Branch != a.TargetBranch:
		return a, precondition("target: approval %q is for %s:%s, not %s:%s", a.ID, a.TargetRepo, a.TargetBranch, req.Target.Repo, req.Target.Branch)
	}
	if st := Effective(a, s.now()); st != store.ApprovalApproved {
		return a, precondition("state: approval %q is %s, not approved", a.ID, st)
	}
	return a, nil
}

// PublishSpec is what the publisher needs to publish one approval.
type PublishSpec struct {
	Approval store.Approval
	// Repository is the publish target, from the tenant's policy.
	Repository policy.Repository
	// Base is the commit the job ran on.
	Base string
	// Approvers are the approving votes' SPIFFE IDs in the order cast;
	// ApprovedAt is when the deciding one was cast.
	Approvers  []string
	ApprovedAt time.Time
	Policy     policy.Publish
	// TenantApprovers are the approvers the tenant lists (empty: any).
	TenantApprovers []string
	// DeployCredential says whether the tenant has a deploy credential
	// for the target.
	DeployCredential bool
}

// PublishSpec returns the publish spec of approval id. Only the publisher
// asks; a change request has none.
func (s *Service) PublishSpec(ctx context.Context, caller identity.ID, id string) (PublishSpec, error) {
	if !IsPublisher(caller) {
		return PublishSpec{}, denied("only the publisher reads publish specs")
	}
	switch {
	case id == "":
		return PublishSpec{}, invalid("approval_id", "required")
	case len(id) > MaxIDBytes:
		return PublishSpec{}, invalid("approval_id", "at most %d bytes", MaxIDBytes)
	}
	a, err := s.cfg.Store.GetApproval(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return PublishSpec{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return PublishSpec{}, err
	}
	if a.Kind != store.KindPublish && a.Kind != "" || a.TargetRepo == "" {
		return PublishSpec{}, precondition("approval_id: %q is not a publish request", id)
	}
	t := s.cfg.Tenants[a.Tenant]
	if t == nil {
		return PublishSpec{}, precondition("approval_id: tenant %q of approval %q is no longer configured", a.Tenant, id)
	}
	repo, ok := t.Repositories[a.TargetRepo]
	if !ok {
		return PublishSpec{}, precondition("target: %q is no longer a repository of tenant %q", a.TargetRepo, a.Tenant)
	}
	j, err := s.cfg.Store.GetJob(ctx, a.JobID)
	if err != nil {
		return PublishSpec{}, err
	}
	spec := PublishSpec{Approval: a, Repository: repo, Base: j.Commit, Policy: t.Publish, TenantApprovers: t.Approvals.Approvers,
		DeployCredential: t.DeployCredentials[a.TargetRepo] != ""}
	for _, v := range a.Votes {
		if v.Decision == store.DecisionApprove {
			spec.Approvers = append(spec.Approvers, v.Approver)
			if len(spec.Approvers) == a.Required {
				spec.ApprovedAt = v.DecidedAt
			}
		}
	}
	return spec, nil
}
