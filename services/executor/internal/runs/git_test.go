package runs

import (
	"bytes"
	"context"
	"fmt"
	"github.com/airlockhq/airlock/test/gittest"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/runspec"
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
			g, run := gitJob(t, h, class, gitScript,
				"status:[]", "log:1", "head:"+h.commit, "diff:ok", "stash:ok", "blame:ok", "commit:2", "amend:ok", "objects:readonly")
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
			src, err := h.m.cfg.Sources.Get(t.Context(), stageKey(h, g), func(ctx context.Context) (stage.Header, io.ReadCloser, error) {
				return h.auth.FetchSource(ctx, g.JobID)
			})
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

// TestJobGitRepositoryAsAgent: a job running as agent finds its /work a
// git repository it owns (the seeded .git included), works in it as root's
// job does, under runc and runsc, and its patch is exactly its changes:
// no mode or owner of the idmapped source leaks into it.
func TestJobGitRepositoryAsAgent(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			script := `echo "user:$(id -un):$(stat -c %U:%G README .git .git/index | tr '\n' ' ')"` + "\n" + gitScript
			g, run := gitJobAs(t, h, class, runspec.Agent, script,
				"user:agent:agent:agent agent:agent agent:agent ", "status:[]", "log:1", "head:"+h.commit, "diff:ok", "stash:ok", "blame:ok", "commit:2", "amend:ok", "objects:readonly")
			patch, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "review.patch"))
			p := string(patch)
			if run.Result.FilesChanged != 2 || !strings.Contains(p, "+changed") || !strings.Contains(p, "new.txt") || strings.Contains(p, ".git/") ||
				strings.Contains(p, "old mode") || strings.Contains(p, "new mode 10") {
				t.Fatalf("the patch is not exactly the job's changes (%d files):\n%s", run.Result.FilesChanged, p)
			}
		})
	}
}

// gitJob runs script as a job under class, and checks it exits 0 and
// prints every line of want.
func gitJob(t *testing.T, h *harness, class sandbox.Class, script string, want ...string) (*Grant, Run) {
	t.Helper()
	return gitJobAs(t, h, class, runspec.Root, script, want...)
}

// gitJobAs is gitJob with the job running as user.
func gitJobAs(t *testing.T, h *harness, class sandbox.Class, user runspec.User, script string, want ...string) (*Grant, Run) {
	t.Helper()
	g := h.grantFor(script)
	g.Class, g.User = class, user
	h.start(t, g)
	run := h.waitEnd(t, g.JobID)
	out, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stdout.log"))
	errOut, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stderr.log"))
	if run.Result.ExitCode != 0 {
		t.Fatalf("the git job failed: %+v\nstdout:\n%s\nstderr:\n%s", run.Result, out, errOut)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w+"\n") {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", w, out, errOut)
		}
	}
	return g, run
}

func stageKey(h *harness, g *Grant) stage.Key {
	return stage.Key{Tenant: g.Tenant, Repository: g.Repository, Commit: g.Commit, Depth: g.HistoryDepth}
}

// historyScript is a job that reads the history its tenant's depth of 3
// gives its .git, and looks past it.
const historyScript = `set -e
echo "log:$(git log --oneline | wc -l)"
echo "first:$(git log --format=%s | tail -1)"
git diff HEAD~2 --stat > /tmp/stat
grep -q 'f9.txt' /tmp/stat && grep -q 'README' /tmp/stat && echo diff:ok
git diff HEAD~1 --quiet -- f9.txt && echo unchanged:ok
git blame README | grep -q 'version 10' && echo blame:ok
if git rev-parse -q --verify HEAD~3 >/dev/null 2>&1; then echo beyond:there; else echo beyond:absent; fi
echo "status:[$(git status --porcelain)]"
echo "shallow:$(cat .git/shallow)"
`

// TestJobGitHistory: a job whose tenant's policy gives depth 3 sees
// exactly three commits in /work (log, diff against HEAD~2, blame), and
// nothing beyond, under runc and runsc; the patch is still against the
// base alone.
func TestJobGitHistory(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			parents := withHistory(t, h, 10, 3)
			g, run := gitJob(t, h, class, historyScript+"echo changed >> README\n",
				"log:3", "first:commit 8", "diff:ok", "unchanged:ok", "blame:ok", "beyond:absent", "status:[]", "shallow:"+parents[1])
			patch, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "review.patch"))
			if run.Result.FilesChanged != 1 || !strings.Contains(string(patch), "+changed") || strings.Contains(string(patch), "f9.txt") {
				t.Fatalf("the patch is not the job's one change against the base:\n%s", patch)
			}
		})
	}
}

// withHistory makes the harness serve a repository of n commits whose
// header promises depth, with the history pack an honest authority sends
// (the base's ancestors within depth, less the base tree's objects). It
// returns the base's ancestors in that history.
func withHistory(t *testing.T, h *harness, n, depth int) []string {
	t.Helper()
	dir := t.TempDir()
	gittest.Run(t, dir, "init", "--quiet", "-b", "main")
	for i := 1; i <= n; i++ {
		for name, data := range map[string]string{"README": fmt.Sprintf("version %d\n", i), fmt.Sprintf("f%d.txt", i): "file\n"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		gittest.Run(t, dir, "add", "--all")
		gittest.Run(t, dir, "commit", "--quiet", "-m", fmt.Sprintf("commit %d", i))
	}
	var parents []string
	for d := 1; d < depth; d++ {
		parents = append(parents, strings.TrimSpace(gittest.Run(t, dir, "rev-parse", fmt.Sprintf("HEAD~%d", d))))
	}
	inTree := map[string]bool{}
	for _, line := range strings.Split(gittest.Run(t, dir, "rev-list", "--objects", "HEAD^{tree}"), "\n") {
		inTree[strings.Fields(line + " x")[0]] = true
	}
	var list bytes.Buffer
	for _, line := range strings.Split(strings.TrimSpace(gittest.Run(t, dir, append([]string{"rev-list", "--objects", "--no-walk"}, parents...)...)), "\n") {
		if id := strings.Fields(line)[0]; !inTree[id] {
			list.WriteString(id + "\n")
		}
	}
	cmd := exec.Command("git", "pack-objects", "--stdout", "--quiet")
	cmd.Dir, cmd.Stdin = dir, &list
	pack, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	h.commit = strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD"))
	h.auth.archive = []byte(gittest.Run(t, dir, "archive", "--format=tar", "HEAD"))
	h.auth.hdr = stage.Header{
		Commit:       h.commit,
		TreeHash:     strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD^{tree}")),
		CommitObject: []byte(gittest.Run(t, dir, "cat-file", "commit", "HEAD")),
		HistoryDepth: depth,
		History: func() (stage.History, error) {
			return stage.History{Depth: depth, Commits: len(parents), Pack: bytes.NewReader(pack)}, nil
		},
	}
	return parents
}
