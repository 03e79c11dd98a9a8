package jobs

import (
	"context"
	"fmt"
	"io"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Serving a job's source to the executor it was dispatched to.

// SourceWriter receives a job's source: the header, then the archive,
// then, when the header's history depth is above 1, the history.
type SourceWriter interface {
	Header(commit, tree string, commitObject []byte, historyDepth int) error
	io.Writer
	// History ends the archive and starts the history pack of the given
	// depth and number of commits, which the returned writer takes.
	History(depth, commits int) (io.Writer, error)
}

// FetchSource streams the job's recorded commit, read with the authority's
// credential, to the executor it was dispatched to, while it may run: the
// header, the tree's archive and the history the job's grant gives its
// .git, from the job's own repository.
func (s *Service) FetchSource(ctx context.Context, caller identity.ID, id string, w SourceWriter) error {
	j, err := s.servedJob(ctx, caller, id, "source")
	if err != nil {
		return err
	}
	repo, ok := s.repository(j)
	if !ok {
		return fmt.Errorf("%w: repository %q is no longer in tenant %q's policy", errdefs.ErrFailedPrecondition, j.Repository, j.Tenant)
	}
	obj, err := s.cfg.Source.CommitObject(ctx, repo, j.Commit)
	if err != nil {
		return err
	}
	g, err := s.grantOf(j)
	if err != nil {
		return err
	}
	depth := max(1, g.HistoryDepth)
	hw := &headerFirst{w: w, commit: j.Commit, tree: j.TreeHash, object: obj, depth: depth}
	if err := s.cfg.Source.Archive(ctx, repo, j.Commit, hw); err != nil {
		return err
	}
	if err := hw.ensureHeader(); err != nil {
		return err
	}
	history := ""
	if depth > 1 {
		h, err := s.cfg.Source.PlanHistory(ctx, repo, j.Commit, depth)
		if err != nil {
			return err
		}
		pw, err := w.History(h.Depth, h.Commits)
		if err != nil {
			return err
		}
		if h.Commits > 0 {
			if err := s.cfg.Source.WritePack(ctx, repo, h, pw); err != nil {
				return err
			}
		}
		history = fmt.Sprintf(", git history depth %d of %d (%d commits)", h.Depth, depth, h.Commits)
	}
	return s.audit(ctx, audit.Event{Kind: audit.KindSourceFetched, Caller: caller.String(), Subject: j.ID, Tenant: j.Tenant, JobID: j.ID,
		Outcome: audit.OutcomeAllowed, Reason: fmt.Sprintf("repository %s at %s (tree %s)%s", j.Repository, j.Commit, j.TreeHash, history)})
}

// servedJob is job id, which the executor caller may be served what (its
// source, its image) for: a job dispatched to it that has not ended.
func (s *Service) servedJob(ctx context.Context, caller identity.ID, id, what string) (store.Job, error) {
	if !isExecutor(caller) {
		return store.Job{}, fmt.Errorf("%w: only the executor fetches %s", errdefs.ErrPermissionDenied, what)
	}
	if id == "" {
		return store.Job{}, fmt.Errorf("%w: job_id: required", errdefs.ErrInvalidArgument)
	}
	j, err := s.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return store.Job{}, err
	}
	switch j.State {
	case store.StateQueued, store.StateStaging, store.StateRunning:
	default:
		return store.Job{}, fmt.Errorf("%w: job %q is %s; its %s is served only while it runs", errdefs.ErrFailedPrecondition, id, j.State, what)
	}
	if j.DispatchedAt.IsZero() {
		return store.Job{}, fmt.Errorf("%w: job %q has not been dispatched", errdefs.ErrFailedPrecondition, id)
	}
	return j, dispatchedTo(j, caller)
}

// historyDepth is the git history depth the tenant's policy gives a job's
// .git: at least 1. It is read once, into the job's grant.
func (s *Service) historyDepth(tenant string) int {
	if t := s.cfg.Tenants[tenant]; t != nil && t.GitHistoryDepth > 1 {
		return t.GitHistoryDepth
	}
	return 1
}

func (s *Service) repository(j store.Job) (policy.Repository, bool) {
	t := s.cfg.Tenants[j.Tenant]
	if t == nil {
		return policy.Repository{}, false
	}
	r, ok := t.Repositories[j.Repository]
	return r, ok
}

// headerFirst sends the header just before the first archive bytes, so a
// failure before any bytes leaves the stream without a misleading header.
type headerFirst struct {
	w            SourceWriter
	commit, tree string
	object       []byte
	depth        int
	sent         bool
}

func (h *headerFirst) ensureHeader() error {
	if h.sent {
		return nil
	}
	h.sent = true
	return h.w.Header(h.commit, h.tree, h.object, h.depth)
}

func (h *headerFirst) Write(p []byte) (int, error) {
	if err := h.ensureHeader(); err != nil {
		return 0, err
	}
	return h.w.Write(p)
}
