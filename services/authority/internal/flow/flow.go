// Package flow is the authority's workflow across its two domains: a
// result recorded for a job with a publish target opens its approval, and
// the deciding vote on a change request applies the change. It keeps the
// API a thin adapter: the api package converts and calls flow, jobs and
// approvals; nothing here knows of gRPC or proto. Only the authority's api
// and server packages import it.
package flow

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Config is what the workflow drives.
type Config struct {
	Jobs      *jobs.Service
	Approvals *approvals.Service
}

// Service runs the workflow.
type Service struct{ cfg Config }

// New returns the workflow.
func New(cfg Config) (*Service, error) {
	if cfg.Jobs == nil || cfg.Approvals == nil {
		return nil, errors.New("flow: jobs and approvals are required")
	}
	return &Service{cfg: cfg}, nil
}

// ReportResult records the executor's report and opens the job's approval
// when it has a publish target. The approval opens right after the result
// is recorded, not in its transaction; opening is idempotent, so if it
// fails the executor's retry of the same report (which changes nothing
// else) opens it. approvalID is "" when no approval applies.
func (s *Service) ReportResult(ctx context.Context, caller identity.ID, id string, r jobs.Report) (j store.Job, approvalID string, err error) {
	j, err = s.cfg.Jobs.ReportResult(ctx, caller, id, r)
	if err != nil {
		return store.Job{}, "", err
	}
	t, err := s.Target(j)
	if err != nil {
		return store.Job{}, "", err
	}
	if t.Repo == "" {
		return j, "", nil
	}
	a, _, err := s.cfg.Approvals.Open(ctx, caller, j, t)
	if err != nil {
		return store.Job{}, "", err
	}
	return j, a.ID, nil
}

// Target is where job j's approved result may be published, as its grant
// says (zero when nowhere); approvals.OpenMissing takes it.
func (s *Service) Target(j store.Job) (approvals.Target, error) {
	p, err := s.cfg.Jobs.PublishTarget(j)
	if err != nil || p == nil {
		return approvals.Target{}, err
	}
	return approvals.Target{Repo: p.Repository, Branch: p.Branch}, nil
}

// Decide records an approver's vote. The deciding vote on a change request
// applies the change: the approval is spent with the job's new grant in
// one transaction. The deciding vote on a start request drives its job:
// to an executor, or (denied) to its end. It returns the approval as it
// then is.
func (s *Service) Decide(ctx context.Context, caller identity.ID, req approvals.DecideRequest) (store.Approval, error) {
	a, err := s.cfg.Approvals.Decide(ctx, caller, req)
	if err != nil {
		return store.Approval{}, err
	}
	if a.Kind == store.KindStart {
		// Approved, the job goes to an executor; denied, it ends.
		s.cfg.Jobs.StartDecided(a)
		return a, nil
	}
	if a.Kind != store.KindChange || a.State != store.ApprovalApproved {
		return a, nil
	}
	if _, err := s.cfg.Jobs.ApplyApproved(ctx, caller, a.ID); err != nil {
		return store.Approval{}, fmt.Errorf("the decision is recorded and approval %s is approved, but its change did not apply: %w", a.ID, err)
	}
	a, _, err = s.cfg.Approvals.Get(ctx, caller, a.ID)
	return a, err
}
