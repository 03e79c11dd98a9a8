package jobs

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// IsSession reports whether j is a session: its grant says so.
func (s *Service) IsSession(j store.Job) bool {
	if len(j.Grant) == 0 {
		return false
	}
	g, err := s.grantOf(j)
	return err == nil && g.Session != nil
}

// PublishTarget is where job j's approved result may be published, as
// its grant says; nil when nowhere, or when j was never granted.
func (s *Service) PublishTarget(j store.Job) (*PublishTarget, error) {
	if len(j.Grant) == 0 {
		return nil, nil
	}
	g, err := s.grantOf(j)
	if err != nil {
		return nil, err
	}
	return g.PublishTarget, nil
}

// Session returns the session id if caller's tenant holds it; a job that
// is not a session is ErrFailedPrecondition, naming what it is.
func (s *Service) Session(ctx context.Context, caller identity.ID, id string) (store.Job, error) {
	j, err := s.visible(ctx, caller, id)
	if err != nil {
		return store.Job{}, err
	}
	if !s.IsSession(j) {
		return store.Job{}, fmt.Errorf("%w: session_id %q is a job, not a session", errdefs.ErrFailedPrecondition, id)
	}
	return j, nil
}

// ListSessions returns a page of the tenant's sessions, newest first. It
// reads pages of jobs until the page is full or none are left.
func (s *Service) ListSessions(ctx context.Context, caller identity.ID, req ListRequest) ([]store.Job, string, error) {
	want := req.PageSize
	if want == 0 {
		want = 50
	}
	var out []store.Job
	for {
		// Pages of want jobs: a page of sessions is then at most twice
		// want long, within any message bound a page of jobs keeps.
		page, next, err := s.List(ctx, caller, ListRequest{Tenant: req.Tenant, States: req.States, PageSize: min(want, 500), PageToken: req.PageToken})
		if err != nil {
			return nil, "", err
		}
		for _, j := range page {
			if s.IsSession(j) {
				out = append(out, j)
			}
		}
		// The token resumes after the last job read: a page may hold
		// more than want sessions rather than skip some.
		if next == "" || len(out) >= want {
			return out, next, nil
		}
		req.PageToken = next
	}
}

// RecordWrite appends a client's upload into a session to the audit log.
func (s *Service) RecordWrite(ctx context.Context, caller identity.ID, j store.Job, path string, size int64) error {
	if len(path) > 1024 {
		path = strings.ToValidUTF8(path[:1024], "") + "…"
	}
	_, err := s.cfg.Store.AppendAudit(ctx, audit.Event{
		Kind: audit.KindFileWritten, Caller: caller.String(), Subject: j.ID, Tenant: j.Tenant, JobID: j.ID, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("%q: %d bytes", path, size),
	})
	return err
}

// CheckExecEnv checks an exec's environment by the rules a job's is.
func (s *Service) CheckExecEnv(ctx context.Context, env map[string]string) error {
	return checkEnv(ctx, s.cfg.Secrets, env)
}
