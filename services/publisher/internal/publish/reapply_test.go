package publish_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// These tests are the attacker's: an approved change re-applied on a
// branch that moved since its base must land exactly where it was
// approved, or be refused before anything is spent, whatever the branch
// did meanwhile.

// rebase makes a commit on main that writes files (path -> content;
// "" removes the path) and takes it as the base jobs run on.
func (r *remote) rebase(files map[string]string) {
	r.t.Helper()
	run(r.t, r.other, "pull", "-q", "--ff-only", "origin", "main")
	writeFiles(r.t, r.other, files)
	run(r.t, r.other, "commit", "-q", "-m", "new base")
	run(r.t, r.other, "push", "-q", "origin", "HEAD:main")
	r.base = run(r.t, r.other, "rev-parse", "HEAD")
}

// moveTo is someone else's commit on main writing files as rebase does.
func (r *remote) moveTo(files map[string]string) string {
	r.t.Helper()
	run(r.t, r.other, "pull", "-q", "--ff-only", "origin", "main")
	writeFiles(r.t, r.other, files)
	run(r.t, r.other, "commit", "-q", "-m", "someone else")
	run(r.t, r.other, "push", "-q", "origin", "HEAD:main")
	return run(r.t, r.other, "rev-parse", "HEAD")
}

// writeFiles writes files (path -> content; "" removes the path) in the
// work tree dir and stages everything.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if content == "" {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, dir, "add", "-A")
}

// landOn prepares ch on main's tip as fetched, and pushes it.
func landOn(t *testing.T, rm *remote, ch publish.Change) (publish.Prepared, error) {
	t.Helper()
	ctx := context.Background()
	s := scratch(t)
	tip, err := s.Fetch(ctx, rm.bare, "main", nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Prepare(ctx, ch, tip)
	if err != nil {
		return p, err
	}
	return p, s.Push(ctx, rm.bare, "main", p, nil)
}

// wantFile checks path's content on main.
func wantFile(t *testing.T, rm *remote, path, want string) {
	t.Helper()
	cmd := exec.Command("git", "show", "main:"+path)
	cmd.Dir = rm.bare
	got, err := cmd.Output()
	if err != nil || string(got) != want {
		t.Errorf("%s on main reads\n%s\nwant\n%s", path, got, want)
	}
}

// wantRefused checks that err refuses as a conflict naming path and that
// main is still at tip.
func wantRefused(t *testing.T, rm *remote, err error, tip, path string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "conflicting paths: "+path) {
		t.Errorf("re-apply: %v, want refused naming %s", err, path)
	}
	if got := run(t, rm.bare, "rev-parse", "main"); got != tip {
		t.Errorf("main moved to %s, want %s", got, tip)
	}
}

// block is a section of a config file; every section has the same lines
// around its flag.
func block(flag string) string {
	return "[service]\nreplicas = 2\nport = 8080\ntimeout = 30\nflag = " + flag + "\nretries = 3\nlog = info\nmode = strict\n"
}

// The attack of issue 20: two sections whose surrounding lines are
// identical; approved change X turns on the flag of the SECOND section,
// and meanwhile change Y (also approved) inserts lines at the top. Landed
// after Y, X must turn on the second section's flag, not the first's:
// `git apply` on the moved tip found the first section's context nearer
// the hunk's old line number and landed it there.
func TestReapplyIdenticalBlocksLandsInTheApprovedBlock(t *testing.T) {
	rm := newRemote(t)
	rm.rebase(map[string]string{"config.ini": block("off") + block("off")})
	x := rm.change(rm.patchOf(map[string]string{"config.ini": block("off") + block("on")}))
	header := strings.Repeat("# managed by the platform team\n", 8)
	rm.moveTo(map[string]string{"config.ini": header + block("off") + block("off")})

	if _, err := landOn(t, rm, x); err != nil {
		t.Fatal(err)
	}
	wantFile(t, rm, "config.ini", header+block("off")+block("on"))
}

// A hunk at the end of a file (no context after it) that grew on the
// branch by a section ending in the same lines: `git apply` ties such a
// hunk to the end of the file and landed it in the new section. The
// branch's lines touch the approved change: refused.
func TestReapplyHunkAtTheEndOfAGrownFile(t *testing.T) {
	prod := "[prod]\nheader\na\nb\nc\nflag=off\n"
	dev := "[dev]\nheader\na\nb\nc\nflag=off\n"
	rm := newRemote(t)
	rm.rebase(map[string]string{"env.ini": prod})
	x := rm.change(rm.patchOf(map[string]string{"env.ini": strings.Replace(prod, "flag=off", "flag=on", 1)}))
	tip := rm.moveTo(map[string]string{"env.ini": prod + dev})
	_, err := landOn(t, rm, x)
	wantRefused(t, rm, err, tip, "env.ini")

	// The same change one line above the end, apart from what the branch
	// added: landed in the approved section.
	rm = newRemote(t)
	rm.rebase(map[string]string{"env.ini": prod + "end\n"})
	x = rm.change(rm.patchOf(map[string]string{"env.ini": strings.Replace(prod, "flag=off", "flag=on", 1) + "end\n"}))
	rm.moveTo(map[string]string{"env.ini": prod + "end\n" + dev + "end\n"})
	if _, err := landOn(t, rm, x); err != nil {
		t.Fatal(err)
	}
	wantFile(t, rm, "env.ini", strings.Replace(prod, "flag=off", "flag=on", 1)+"end\n"+dev+"end\n")
}

// A file the approved patch changes was renamed on the branch. git's
// merge follows the rename and would carry the change to the new name, a
// path nobody approved: refused naming the approved path.
func TestReapplyFileRenamedOnTheBranchIsRefused(t *testing.T) {
	rm := newRemote(t)
	lines := "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\n"
	rm.rebase(map[string]string{"src/f.txt": lines})
	x := rm.change(rm.patchOf(map[string]string{"src/f.txt": strings.Replace(lines, "l4", "L4", 1)}))
	tip := rm.moveTo(map[string]string{"src/f.txt": "", "src/g.txt": lines})
	_, err := landOn(t, rm, x)
	wantRefused(t, rm, err, tip, "src/f.txt (deleted or renamed on the branch)")

	// The patch moves a file (deletes it, adds its copy elsewhere) that
	// the branch changed: git's merge takes the move as a rename and
	// carries the branch's change into the new file.
	rm = newRemote(t)
	rm.rebase(map[string]string{"src/f.txt": lines})
	x = rm.change(rm.patchOf(map[string]string{"src/f.txt": "", "src/h.txt": lines}))
	tip = rm.moveTo(map[string]string{"src/f.txt": strings.Replace(lines, "l8", "L8", 1)})
	_, err = landOn(t, rm, x)
	wantRefused(t, rm, err, tip, "src/f.txt (the patch deletes what the branch changed)")
}

// The branch edited the approved hunk's context: a line apart from the
// change, the change lands with the branch's edit kept (a three-way
// merge's answer, where `git apply` refused); touching it, refused.
func TestReapplyContextEditedOnTheBranch(t *testing.T) {
	lines := "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\n"
	approved := strings.Replace(lines, "l4", "L4", 1)

	rm := newRemote(t)
	rm.rebase(map[string]string{"f.txt": lines})
	x := rm.change(rm.patchOf(map[string]string{"f.txt": approved}))
	rm.moveTo(map[string]string{"f.txt": strings.Replace(lines, "l2", "edited 2", 1)})
	if _, err := landOn(t, rm, x); err != nil {
		t.Fatal(err)
	}
	wantFile(t, rm, "f.txt", strings.Replace(approved, "l2", "edited 2", 1))

	rm = newRemote(t)
	rm.rebase(map[string]string{"f.txt": lines})
	x = rm.change(rm.patchOf(map[string]string{"f.txt": approved}))
	tip := rm.moveTo(map[string]string{"f.txt": strings.Replace(lines, "l5", "edited 5", 1)})
	_, err := landOn(t, rm, x)
	wantRefused(t, rm, err, tip, "f.txt")
}

// The same lines changed on both sides are refused, even when both made
// the same change: what would land is not what was approved on top of
// what the branch holds.
func TestReapplySameLinesChangedOnBothSidesIsRefused(t *testing.T) {
	lines := "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\n"
	for name, theirs := range map[string]string{
		"different": strings.Replace(lines, "l4", "theirs", 1),
		"identical": strings.Replace(lines, "l4", "L4", 1) + "l9\n",
	} {
		t.Run(name, func(t *testing.T) {
			rm := newRemote(t)
			rm.rebase(map[string]string{"f.txt": lines})
			x := rm.change(rm.patchOf(map[string]string{"f.txt": strings.Replace(lines, "l4", "L4", 1)}))
			tip := rm.moveTo(map[string]string{"f.txt": theirs})
			_, err := landOn(t, rm, x)
			wantRefused(t, rm, err, tip, "f.txt")
		})
	}
}

// Changes the branch made elsewhere in the same file, in other files, a
// mode the patch changed on a file the branch edited, a file without a
// final newline, CRLF lines: each lands exactly.
func TestReapplyIndependentChangesLandExactly(t *testing.T) {
	var long strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&long, "line %d\n", i)
	}
	base := map[string]string{"long.txt": long.String(), "crlf.txt": "a\r\nb\r\nc\r\nd\r\ne\r\nf\r\ng\r\n", "tail.txt": "x\ny\nz\nw\nv\nlast"}
	rm := newRemote(t)
	rm.rebase(base)
	x := rm.change(rm.patchOf(map[string]string{
		"long.txt": strings.Replace(long.String(), "line 30\n", "line thirty\n", 1),
		"crlf.txt": "a\r\nB\r\nc\r\nd\r\ne\r\nf\r\ng\r\n",
		"tail.txt": "x\ny\nz\nw\nv\nlast changed",
		"new.txt":  "new\n",
	}))
	rm.moveTo(map[string]string{
		"long.txt": "top\n" + strings.Replace(long.String(), "line 5\n", "", 1) + "bottom\n",
		"crlf.txt": "a\r\nb\r\nc\r\nd\r\ne\r\nf\r\nG\r\n",
		"tail.txt": "X\ny\nz\nw\nv\nlast",
		"b.txt":    "someone else's\n",
	})
	if _, err := landOn(t, rm, x); err != nil {
		t.Fatal(err)
	}
	wantFile(t, rm, "long.txt", "top\n"+strings.Replace(strings.Replace(long.String(), "line 5\n", "", 1), "line 30\n", "line thirty\n", 1)+"bottom\n")
	wantFile(t, rm, "crlf.txt", "a\r\nB\r\nc\r\nd\r\ne\r\nf\r\nG\r\n")
	wantFile(t, rm, "tail.txt", "X\ny\nz\nw\nv\nlast changed")
	wantFile(t, rm, "new.txt", "new\n")
	wantFile(t, rm, "b.txt", "someone else's\n")
}

// A binary file both sides changed cannot be merged by lines: refused.
func TestReapplyBinaryChangedOnBothSidesIsRefused(t *testing.T) {
	rm := newRemote(t)
	rm.rebase(map[string]string{"blob.bin": "\x00\x01\x02base"})
	x := rm.change(rm.patchOf(map[string]string{"blob.bin": "\x00\x01\x02ours"}))
	tip := rm.moveTo(map[string]string{"blob.bin": "\x00\x01\x02theirs"})
	_, err := landOn(t, rm, x)
	wantRefused(t, rm, err, tip, "blob.bin")
}

// Through the whole flow: the identical-blocks attack lands the approved
// block; a conflict on a moved branch is refused before the consume, and
// the approval, unspent, lands once the branch no longer conflicts.
func TestMovedBranchThroughTheFlow(t *testing.T) {
	h := newHarnessOn(t, map[string]string{"config.ini": block("off") + block("off")},
		map[string]string{"config.ini": block("off") + block("on")})
	header := strings.Repeat("# managed by the platform team\n", 8)
	h.remote.moveTo(map[string]string{"config.ini": header + block("off") + block("off")})
	s, _ := h.service("a")
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, d, store.Succeeded, store.StepRevoked)
	wantFile(t, h.remote, "config.ini", header+block("off")+block("on"))

	h = newHarnessOn(t, map[string]string{"config.ini": block("off") + block("off")},
		map[string]string{"config.ini": block("off") + block("on")})
	tip := h.remote.moveTo(map[string]string{"config.ini": block("off") + block("maybe")})
	s, _ = h.service("a")
	d, err = h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.Failed || !strings.Contains(d.Message, "conflicting paths: config.ini") || !strings.Contains(d.Message, "the approval was not spent") {
		t.Fatalf("deployment is %s (%q), want failed naming config.ini, not spent", d.State, d.Message)
	}
	if got := run(t, h.remote.bare, "rev-parse", "main"); got != tip || h.auth.consumes() != 0 || h.auth.deployLeases() != 0 {
		t.Fatalf("main is %s with %d consumes and %d deploy leases, want %s with none", got, h.auth.consumes(), h.auth.deployLeases(), tip)
	}
	// The approval is still approved: once the branch no longer holds
	// the conflicting edit, asking again lands it.
	h.remote.moveTo(map[string]string{"config.ini": header + block("off") + block("off")})
	if d, err = h.publish(s, "k"); err != nil {
		t.Fatal(err)
	}
	wantState(t, d, store.Succeeded, store.StepRevoked)
	wantFile(t, h.remote, "config.ini", header+block("off")+block("on"))
	if h.auth.consumes() != 1 {
		t.Errorf("%d consumes, want 1", h.auth.consumes())
	}
}

// TestOpenRepoAfterAKilledInit: a git init killed after HEAD but before
// objects/ left a directory git refuses; OpenRepo makes it again rather
// than leaving every publish to the target waiting on it.
func TestOpenRepoAfterAKilledInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "repo")
	if err := os.MkdirAll(filepath.Join(dir, "refs", "heads"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "HEAD"), []byte("ref: refs/heads/main\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config"), []byte("[core]\n\tbare = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := publish.OpenRepo(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "--git-dir", dir, "rev-parse", "--git-dir").CombinedOutput(); err != nil {
		t.Fatalf("the repository is still not one: %v: %s", err, out)
	}
}
