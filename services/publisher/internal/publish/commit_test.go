package publish_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
)

// remote is a real bare repository protected as the dev remote is
// (no non-fast-forward pushes, no deletions), and a clone beside it that
// plays everyone else who pushes to the branch.
type remote struct {
	t     *testing.T
	bare  string
	other string
	base  string
}

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func newRemote(t *testing.T) *remote {
	t.Helper()
	r := &remote{t: t, bare: filepath.Join(t.TempDir(), "target.git"), other: filepath.Join(t.TempDir(), "other")}
	run(t, ".", "init", "-q", "--bare", "-b", "main", r.bare)
	run(t, r.bare, "config", "receive.denyNonFastForwards", "true")
	run(t, r.bare, "config", "receive.denyDeletes", "true")
	run(t, ".", "clone", "-q", r.bare, r.other)
	r.write("a.txt", "one\ntwo\nthree\n")
	r.write("b.txt", "bee\n")
	run(t, r.other, "add", "-A")
	run(t, r.other, "commit", "-q", "-m", "base")
	run(t, r.other, "push", "-q", "origin", "HEAD:main")
	r.base = run(t, r.other, "rev-parse", "HEAD")
	return r
}

func (r *remote) write(name, content string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.other, name), []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// patchOf is the patch an agent's job would produce from base: files
// written as given ("" removes one), as the executor diffs them (binary, no renames).
func (r *remote) patchOf(files map[string]string) []byte {
	t := r.t
	t.Helper()
	work := filepath.Join(t.TempDir(), "job")
	run(t, ".", "clone", "-q", r.bare, work)
	run(t, work, "checkout", "-q", r.base)
	writeFiles(t, work, files)
	cmd := exec.Command("git", "diff", "--cached", "--binary", "--no-renames", r.base)
	cmd.Dir = work
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// advance pushes a commit by someone else to main.
func (r *remote) advance(name, content string) string {
	r.t.Helper()
	run(r.t, r.other, "pull", "-q", "--ff-only", "origin", "main")
	r.write(name, content)
	run(r.t, r.other, "commit", "-q", "-am", "someone else")
	run(r.t, r.other, "push", "-q", "origin", "HEAD:main")
	return run(r.t, r.other, "rev-parse", "HEAD")
}

func (r *remote) change(patch []byte) publish.Change {
	return publish.Change{Remote: r.bare, Branch: "main", Base: r.base, Patch: patch,
		JobID: "job-1", BundleDigest: "sha256:" + strings.Repeat("b", 64), ApprovalID: "appr-1",
		Approvers: []string{"spiffe://airlock.test/approver/bob", "spiffe://airlock.test/approver/alice"},
		At:        time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func scratch(t *testing.T) *publish.Repo {
	t.Helper()
	r, err := publish.OpenRepo(context.Background(), filepath.Join(t.TempDir(), "scratch.git"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLandOneDeterministicCommit(t *testing.T) {
	ctx := context.Background()
	rm := newRemote(t)
	ch := rm.change(rm.patchOf(map[string]string{"a.txt": "one\n2\nthree\n", "new.bin": "\x00\x01binary\xff"}))
	s := scratch(t)
	tip, err := s.Fetch(ctx, rm.bare, "main", nil)
	if err != nil || tip != rm.base {
		t.Fatalf("fetch: %s %v", tip, err)
	}
	p, err := s.Prepare(ctx, ch, tip)
	if err != nil {
		t.Fatal(err)
	}
	// The same approval on the same parent is the same commit, from any
	// scratch repository.
	s2 := scratch(t)
	tip2, _ := s2.Fetch(ctx, rm.bare, "main", nil)
	if p2, err := s2.Prepare(ctx, ch, tip2); err != nil || p2.Commit != p.Commit {
		t.Fatalf("prepared again: %s %v, want %s", p2.Commit, err, p.Commit)
	}
	if err := s.Push(ctx, rm.bare, "main", p, nil); err != nil {
		t.Fatal(err)
	}
	if got := run(t, rm.bare, "rev-parse", "main"); got != p.Commit {
		t.Fatalf("main is %s, want %s", got, p.Commit)
	}
	msg := run(t, rm.bare, "log", "-1", "--format=%B", "main")
	for _, want := range []string{"Airlock-Job: job-1", "Airlock-Approval: appr-1", "Airlock-Bundle: sha256:bbbb",
		"Approved-by: spiffe://airlock.test/approver/alice\nApproved-by: spiffe://airlock.test/approver/bob"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if got := run(t, rm.bare, "show", "main:new.bin"); got != "\x00\x01binary\xff" {
		t.Errorf("the binary file reads %q", got)
	}
	// A retry finds what landed by its trailer.
	if _, err := s2.Fetch(ctx, rm.bare, "main", nil); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := s2.Find(ctx, "main", "appr-1"); err != nil || !ok || c != p.Commit {
		t.Errorf("find: %s %v %v, want %s", c, ok, err, p.Commit)
	}
	if _, ok, _ := s2.Find(ctx, "main", "appr-2"); ok {
		t.Error("found a commit for another approval")
	}
}

func TestMovedBranch(t *testing.T) {
	ctx := context.Background()
	rm := newRemote(t)
	ch := rm.change(rm.patchOf(map[string]string{"a.txt": "one\n2\nthree\n"}))

	// Moved by an unrelated change: re-applied on the new tip.
	tip := rm.advance("b.txt", "bee bee\n")
	s := scratch(t)
	fetched, _ := s.Fetch(ctx, rm.bare, "main", nil)
	p, err := s.Prepare(ctx, ch, fetched)
	if err != nil || p.Parent != tip {
		t.Fatalf("re-applied: parent %s %v, want %s", p.Parent, err, tip)
	}
	refuse := ch
	refuse.OnMoved = publish.OnMovedRefuse
	if _, err := s.Prepare(ctx, refuse, fetched); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "refuses to re-apply") {
		t.Errorf("policy refuse: %v", err)
	}

	// Moved between prepare and push: the remote's compare-and-swap
	// refuses the push; prepared again on the newer tip it lands.
	rm.advance("b.txt", "bee bee bee\n")
	if err := s.Push(ctx, rm.bare, "main", p, nil); !errors.Is(err, publish.ErrMoved) {
		t.Fatalf("push after the branch moved: %v, want ErrMoved", err)
	}
	fetched, _ = s.Fetch(ctx, rm.bare, "main", nil)
	if p, err = s.Prepare(ctx, ch, fetched); err != nil {
		t.Fatal(err)
	}
	if err := s.Push(ctx, rm.bare, "main", p, nil); err != nil {
		t.Fatalf("push on the new tip: %v", err)
	}

	// Moved by a change to the same lines: refused, naming the path,
	// before anything is pushed.
	rm2 := newRemote(t)
	ch2 := rm2.change(rm2.patchOf(map[string]string{"a.txt": "one\n2\nthree\n"}))
	rm2.advance("a.txt", "one\nTWO\nthree\n")
	s2 := scratch(t)
	fetched, _ = s2.Fetch(ctx, rm2.bare, "main", nil)
	if _, err := s2.Prepare(ctx, ch2, fetched); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "conflicting paths: a.txt") {
		t.Errorf("a conflicting move: %v", err)
	}

	// A base that is no longer on the branch (history rewritten).
	if _, err := s2.Prepare(ctx, publish.Change{Base: strings.Repeat("1", 40), ApprovalID: "x", Branch: "main"}, fetched); err == nil {
		t.Error("prepared on a base that is not on the branch")
	}
}

// TestPatchIntoGitIsRefused: content validation refuses such paths first,
// and the commit step refuses them again (git's own verify_path): a patch
// that writes .git/config or leaves the tree makes no commit.
func TestPatchIntoGitIsRefused(t *testing.T) {
	ctx := context.Background()
	rm := newRemote(t)
	s := scratch(t)
	tip, _ := s.Fetch(ctx, rm.bare, "main", nil)
	for _, path := range []string{".git/config", "../x", ".GIT/hooks/pre-commit"} {
		patch := "diff --git a/" + path + " b/" + path + "\nnew file mode 100644\n--- /dev/null\n+++ b/" + path + "\n@@ -0,0 +1 @@\n+[core]\n"
		if _, err := s.Prepare(ctx, rm.change([]byte(patch)), tip); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("a patch writing %s: %v, want refused", path, err)
		}
	}
	if got := run(t, rm.bare, "rev-parse", "main"); got != rm.base {
		t.Errorf("main moved to %s", got)
	}
}
