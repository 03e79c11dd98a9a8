package runs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
)

// What leaves a sandbox is bounded by its apparent size: the regular files
// of /work's overlay upper layer (git reads each whole, in the job's export
// cgroup) and of /out (the bundle copies each whole) count together
// against the job's disk limit. A job can pass it only with files whose
// blocks are not all there (sparse, hole-punched) or with many names for
// one file (hard links); then it ends disk_full, naming the largest file
// as the job sees it, and nothing of /work or /out leaves: the patch is
// empty and the bundle holds no /out file, so the executor never spends
// more memory or disk on a job than its disk limit. /tmp and $HOME never
// leave the sandbox and do not count.

//
// The git that computes the patch runs in the job's export cgroup, under
// the job's own memory and pids limits (not its CPU quota: a job of a few
// millicores would stretch its export to hours), and the patch it prints
// is held to that limit too: a job whose changes would cost more to diff
// (a line diff takes tens of bytes per line, a binary patch holds both
// versions of a file) ends oom, saying so, with nothing of /work or /out
// exported. Computing the patch has a deadline (Config.ExportTimeout,
// default 10 minutes): past it, git is killed and the job ends timeout,
// saying so, with nothing of /work or /out exported; an executor shutting
// down waits for an export no longer than that.

// defaultExportTimeout is Config.ExportTimeout's default.
const defaultExportTimeout = 10 * time.Minute

// ExportTimeoutError is an export that passed its deadline.
type ExportTimeoutError struct {
	// Timeout is the deadline's length.
	Timeout time.Duration
}

func (e *ExportTimeoutError) Error() string {
	return fmt.Sprintf("computing the patch of the job's changes passed its deadline of %v", e.Timeout)
}

// diffJob computes the job's patch with git confined to the job's export
// cgroup, removed again before it returns, within Config.ExportTimeout:
// past it the error is an *ExportTimeoutError. It ignores ctx's
// cancellation (a cancelled job's patch is still computed), not its values.
func (m *Manager) diffJob(ctx context.Context, src *stage.Source, sb *sandbox.Sandbox, exported *bundle.Tally) ([]byte, worktree.DiffStat, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.ExportTimeout)
	defer cancel()
	patch, stat, err := m.diffConfined(ctx, src, sb, exported)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, worktree.DiffStat{}, fmt.Errorf("%w (%v)", &ExportTimeoutError{Timeout: m.cfg.ExportTimeout}, err)
	}
	return patch, stat, err
}

// diffConfined is diffJob without its deadline.
func (m *Manager) diffConfined(ctx context.Context, src *stage.Source, sb *sandbox.Sandbox, exported *bundle.Tally) ([]byte, worktree.DiffStat, error) {
	cg, err := sb.ExportCgroup()
	if err != nil {
		return nil, worktree.DiffStat{}, err
	}
	defer func() {
		if err := cg.Close(); err != nil {
			m.cfg.Logger.Error("remove a job's export cgroup", "error", err)
		}
	}()
	return src.Repo.Confined(cg).DiffUpper(ctx, src.TreeHash, src.Index, sb.WorkDir(), sb.UpperDir(), exported)
}

// exportRefused reports whether err is one of the bounds above, and if so
// makes result say so: disk_full with the paths and sizes err names, oom
// with what passed the memory limit, or timeout with the export's
// deadline, after what the run's end said.
func exportRefused(result *Result, err error) bool {
	var (
		tooLarge *bundle.TooLargeError
		memory   *worktree.MemoryError
		timeout  *ExportTimeoutError
		note     string
	)
	switch {
	case errors.As(err, &tooLarge):
		result.Reason, note = sandbox.ReasonDiskFull, tooLarge.Error()
	case errors.As(err, &memory):
		result.Reason, note = sandbox.ReasonOOM, memory.Error()
	case errors.As(err, &timeout):
		result.Reason, note = sandbox.ReasonTimeout, timeout.Error()
	default:
		return false
	}
	note += "; nothing of /work or /out was exported"
	result.Message = strings.TrimPrefix(result.Message+"; "+note, "; ")
	return true
}

// setPatch records patch and its stat in result.
func setPatch(result *Result, patch []byte, stat worktree.DiffStat) {
	result.FilesChanged, result.Insertions, result.Deletions = stat.FilesChanged, stat.Insertions, stat.Deletions
	result.PatchSize = int64(len(patch))
}
