package runs

import (
	"errors"
	"strings"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
)

// What leaves a sandbox is bounded by its apparent size: the regular files
// of /work's overlay upper layer (git reads each whole, outside the job's
// cgroup) and of /out (the bundle copies each whole) count together
// against the job's disk limit. A job can pass it only with files whose
// blocks are not all there (sparse, hole-punched) or with many names for
// one file (hard links); then it ends disk_full, naming the largest file
// as the job sees it, and nothing of /work or /out leaves: the patch is
// empty and the bundle holds no /out file, so the executor never spends
// more memory or disk on a job than its disk limit. /tmp and $HOME never
// leave the sandbox and do not count.

// exportRefused reports whether err is the bound above, and if so makes
// result say so: disk_full, with the paths and sizes err names after what
// the run's end said.
func exportRefused(result *Result, err error) bool {
	var tooLarge *bundle.TooLargeError
	if !errors.As(err, &tooLarge) {
		return false
	}
	result.Reason = sandbox.ReasonDiskFull
	note := tooLarge.Error() + "; nothing of /work or /out was exported"
	result.Message = strings.TrimPrefix(result.Message+"; "+note, "; ")
	return true
}

// setPatch records patch and its stat in result.
func setPatch(result *Result, patch []byte, stat worktree.DiffStat) {
	result.FilesChanged, result.Insertions, result.Deletions = stat.FilesChanged, stat.Insertions, stat.Deletions
	result.PatchSize = int64(len(patch))
}
