package runs

import (
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/cache"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// A job's named caches (Grant.Caches, package cache): each run takes the
// cache's current generation when its sandbox is made, and its writes are
// committed when it ends, if it ended as a run that completed: a job that
// exited (any status), a session its client finished or that sat idle.
// A run cancelled, timed out, killed for memory or disk, or cut off by
// the executor or an error commits nothing: what it left may be half
// written. The bundle records each cache's use (Result.Caches).

// CacheUse is what one run did with one named cache.
type CacheUse struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	SizeBefore int64  `json:"size_before"`
	SizeAfter  int64  `json:"size_after"`
	Committed  bool   `json:"committed"`
	Evicted    bool   `json:"evicted,omitempty"`
	// Message says why nothing was committed, or what the commit left out.
	Message string `json:"message,omitempty"`
}

// commits reports whether a run that ended for reason commits its caches.
func commits(reason sandbox.Reason) bool {
	switch reason {
	case sandbox.ReasonExited, ReasonFinished, ReasonIdleTimeout:
		return true
	}
	return false
}

// checkCaches refuses a grant naming caches this executor cannot keep.
func (m *Manager) checkCaches(g Grant) error {
	if len(g.Caches) > 0 && m.cfg.Caches == nil {
		return fmt.Errorf("%w: grant caches: this executor keeps no caches", errdefs.ErrFailedPrecondition)
	}
	if g.Image != nil && m.cfg.Images == nil {
		return fmt.Errorf("%w: grant image: this executor runs no images (the host template only)", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// openCaches takes the current generation of each of g's caches for the
// job, as sandbox mounts. On an error it holds nothing.
func (m *Manager) openCaches(g Grant) ([]cache.Lease, []sandbox.CacheMount, error) {
	var (
		leases []cache.Lease
		mounts []sandbox.CacheMount
	)
	for _, c := range g.Caches {
		l, err := m.cfg.Caches.Open(cache.Key{Tenant: g.Tenant, Repository: g.Repository, Name: c.Name}, g.JobID)
		if err != nil {
			m.releaseCaches(leases)
			return nil, nil, fmt.Errorf("cache %s: %w", c.Name, err)
		}
		leases = append(leases, l)
		mounts = append(mounts, sandbox.CacheMount{Path: c.Path, Lower: l.Lower})
	}
	return leases, mounts, nil
}

// releaseCaches drops the job's holds on its caches' generations.
func (m *Manager) releaseCaches(leases []cache.Lease) {
	for _, l := range leases {
		if err := m.cfg.Caches.Release(l); err != nil {
			m.cfg.Logger.Error("release a cache", "cache", l.Key.String(), "job_id", l.JobID, "error", err)
		}
	}
}

// commitCaches commits, or not, what the ended run wrote to each cache
// (sb's upper layers), and says what it did.
func (m *Manager) commitCaches(g Grant, leases []cache.Lease, sb *sandbox.Sandbox, reason sandbox.Reason) []CacheUse {
	var uses []CacheUse
	for i, l := range leases {
		c := g.Caches[i]
		u := CacheUse{Name: c.Name, Path: c.Path, SizeBefore: l.SizeBefore, SizeAfter: l.SizeBefore}
		if !commits(reason) {
			u.Message = fmt.Sprintf("the run ended %s", reason)
			uses = append(uses, u)
			continue
		}
		out, err := m.cfg.Caches.Commit(l, sb.CacheUpper(i), c.MaxSize)
		if err != nil {
			m.cfg.Logger.Error("commit a cache", "cache", l.Key.String(), "job_id", g.JobID, "error", err)
			u.Message = commitError(err)
			uses = append(uses, u)
			continue
		}
		u.Committed, u.Evicted, u.SizeAfter = true, out.Evicted, out.SizeAfter
		var notes []string
		if out.Dropped > 0 {
			notes = append(notes, fmt.Sprintf("%d device nodes, FIFOs or sockets left out", out.Dropped))
		}
		if out.Evicted {
			notes = append(notes, fmt.Sprintf("over its max size of %d bytes: wiped", c.MaxSize))
		}
		for _, n := range notes {
			u.Message = joinNote(u.Message, n)
		}
		uses = append(uses, u)
	}
	return uses
}

// commitError is what a caller may read of a commit's error: a refusal
// of the job's layer names only the job's own path; anything else names
// host paths, which go to the log alone.
func commitError(err error) string {
	if errors.Is(err, cache.ErrRefused) {
		return "commit refused: " + err.Error()
	}
	return "the commit failed (the executor's log says why)"
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
