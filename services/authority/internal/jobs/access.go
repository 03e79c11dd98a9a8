package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Who may see which job: a tenant's clients its jobs, the executor a job
// dispatched to it; and reading jobs for them.

// visible returns job id if caller acts for its tenant; any other job,
// existing or not, is NotFound, so ids reveal nothing across tenants.
func (s *Service) visible(ctx context.Context, caller identity.ID, id string) (store.Job, error) {
	if id == "" {
		return store.Job{}, fmt.Errorf("%w: job_id: required", errdefs.ErrInvalidArgument)
	}
	j, err := s.cfg.Store.GetJob(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Job{}, notFound(id)
	}
	if err != nil {
		return store.Job{}, err
	}
	if s.clientTenant(caller, j.Tenant) == nil {
		return store.Job{}, notFound(id)
	}
	return j, nil
}

// clientTenant returns tenant's policy if caller is a client of tenant, as
// the tenants' policy says now, and nil otherwise.
func (s *Service) clientTenant(caller identity.ID, tenant string) *policy.Tenant {
	t := s.cfg.Tenants[tenant]
	if t == nil || caller.Kind != identity.KindClient || !t.HasClient(caller.Principal()) {
		return nil
	}
	return t
}

func notFound(id string) error { return fmt.Errorf("%w: job %q", errdefs.ErrNotFound, id) }

// tenantFor returns the tenant named if caller acts for it. An unknown
// tenant gets the same answer as a foreign one.
func (s *Service) tenantFor(caller identity.ID, name string) (*policy.Tenant, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: tenant: required", errdefs.ErrInvalidArgument)
	}
	if len(name) > maxNameBytes {
		// Not echoed: it is the caller's bytes, and the refusal is audited.
		return nil, fmt.Errorf("%w: tenant: at most %d bytes (got %d)", errdefs.ErrInvalidArgument, maxNameBytes, len(name))
	}
	t := s.clientTenant(caller, name)
	if t == nil {
		return nil, fmt.Errorf("%w: tenant: %s does not act for tenant %q", errdefs.ErrPermissionDenied, caller.Principal(), name)
	}
	return t, nil
}

// maxNameBytes bounds a tenant, repository, revision or branch name a
// caller sends.
const maxNameBytes = 256

func isExecutor(id identity.ID) bool { return id.IsExecutor() }

// dispatchedTo refuses caller unless it is the executor job j is placed
// on: another executor of the fleet, or any executor while the job is
// placed nowhere, gets nothing of it.
func dispatchedTo(j store.Job, caller identity.ID) error {
	switch {
	case j.Executor == "":
		return fmt.Errorf("%w: job %q is placed on no executor", errdefs.ErrPermissionDenied, j.ID)
	case j.Executor != caller.String():
		return fmt.Errorf("%w: job %q is placed on %s, not on %s", errdefs.ErrPermissionDenied, j.ID, j.Executor, caller.String())
	}
	return nil
}

// Get returns a job the caller may see.
func (s *Service) Get(ctx context.Context, caller identity.ID, id string) (store.Job, error) {
	return s.visible(ctx, caller, id)
}

// ListRequest selects jobs for List.
type ListRequest struct {
	Tenant    string
	States    []store.State
	PageSize  int
	PageToken string
}

// List returns a page of the tenant's jobs, newest first.
func (s *Service) List(ctx context.Context, caller identity.ID, req ListRequest) ([]store.Job, string, error) {
	if _, err := s.tenantFor(caller, req.Tenant); err != nil {
		return nil, "", err
	}
	switch {
	case req.PageSize < 0:
		return nil, "", fmt.Errorf("%w: page_size: must not be negative", errdefs.ErrInvalidArgument)
	case req.PageSize == 0:
		req.PageSize = 50
	case req.PageSize > 500:
		req.PageSize = 500
	}
	return s.cfg.Store.ListJobs(ctx, store.ListOptions{Tenant: req.Tenant, States: req.States, Limit: req.PageSize, PageToken: req.PageToken})
}
