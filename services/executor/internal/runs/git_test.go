package runs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
)

// gitScript is a job that uses its /work as the clone it looks like, then
// attacks it: commits, rewrites history, adds hooks, points core.fsmonitor
// and core.hooksPath at its own programs, tells info/exclude to hide its
// change, and tries to write to the borrowed objects.
const gitScript = `set -e
echo "status:[$(git status --porcelain)]"
echo "log:$(git log --oneline | wc -l)"
echo "head:$(git rev-parse HEAD)"
echo changed >> README
git diff --stat | grep -q README && echo diff:ok
git stash -q && git stash pop -q && echo stash:ok
git blame README | head -1 | grep -q hello && echo blame:ok
git add -A && git commit -qm "the job's commit" && echo "commit:$(git log --oneline | wc -l)"
git commit -q --amend -m rewritten && echo amend:ok
printf '#!/bin/sh\ntouch /out/hook-ran\n' > .git/hooks/post-commit && chmod +x .git/hooks/post-commit
git config core.fsmonitor 'touch /out/fsmonitor-ran; false'
git config core.hooksPath /work/.git/hooks
echo README >> .git/info/exclude
echo new > new.txt
if echo x > /.airlock/git-objects/pack/planted 2>/dev/null; then echo objects:writable; else echo objects:readonly; fi
`

// TestJobGitRepository: a job's /work is a git repository at its base
// commit (status, diff, log, stash, blame, commit work), under runc and
// runsc; whatever the job does to its .git changes nothing outside the
// sandbox, and the patch is exactly its changes against the base.
func TestJobGitRepository(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			g := h.grantFor(gitScript)
			g.Class = class
			h.start(t, g)
			run := h.waitEnd(t, g.JobID)
			out, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stdout.log"))
			errOut, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stderr.log"))
			if run.Result.ExitCode != 0 {
				t.Fatalf("the git job failed: %+v\nstdout:\n%s\nstderr:\n%s", run.Result, out, errOut)
			}
			for _, want := range []string{"status:[]", "log:1", "head:" + h.commit, "diff:ok", "stash:ok", "blame:ok", "commit:2", "amend:ok", "objects:readonly"} {
				if !strings.Contains(string(out), want+"\n") {
					t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
				}
			}
			patch, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "review.patch"))
			p := string(patch)
			if run.Result.FilesChanged != 2 || !strings.Contains(p, "+changed") || !strings.Contains(p, "new.txt") || strings.Contains(p, ".git/") {
				t.Fatalf("the patch is not exactly the job's changes (%d files):\n%s", run.Result.FilesChanged, p)
			}
			if strings.Contains(run.Result.Message, ".git") {
				t.Errorf("the job's own .git is reported as left out: %q", run.Result.Message)
			}
			// Nothing the job's git config or hooks named ran outside, and
			// the borrowed objects are as staged.
			src, err := h.m.cfg.Sources.Get(t.Context(), stageKey(h, g), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(src.GitObjects, "pack", "planted")); err == nil {
				t.Fatal("the job wrote into the borrowed objects")
			}
			if data, _ := os.ReadFile(filepath.Join(src.Dir, "README")); string(data) != "hello\n" {
				t.Fatalf("the staged source changed: %q", data)
			}
		})
	}
}

func stageKey(h *harness, g *Grant) stage.Key {
	return stage.Key{Tenant: g.Tenant, Repository: g.Repository, Commit: g.Commit}
}
