package worktree_test

import (
	"bytes"
	"context"
	"fmt"
	"github.com/airlockhq/airlock/test/gittest"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
)

func gitErr(dir string, args ...string) (string, error) {
	cmd := gittest.Cmd(dir, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func writeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// base is a real repository with one commit: text, an executable, a
// binary, symlinks, nested directories, and a file its .gitignore matches
// that is committed all the same.
type base struct {
	dir, commit, tree string
}

func newBase(t *testing.T) *base {
	t.Helper()
	dir := t.TempDir()
	gittest.Run(t, dir, "init", "--quiet", "-b", "main")
	writeFile(t, filepath.Join(dir, "README.md"), "line1\nline2\nline3\n", 0o644)
	writeFile(t, filepath.Join(dir, "src/main.go"), "package main\n\nfunc main() {}\n", 0o644)
	writeFile(t, filepath.Join(dir, "script.sh"), "#!/bin/sh\necho hi\n", 0o755)
	writeFile(t, filepath.Join(dir, "del.txt"), "a\nb\n", 0o644)
	writeFile(t, filepath.Join(dir, "mode.txt"), "mode\n", 0o644)
	writeFile(t, filepath.Join(dir, "data.bin"), "\x00\x01\x02\x03binary\xff\xfe", 0o644)
	writeFile(t, filepath.Join(dir, ".gitignore"), "*.log\nbuild/\n", 0o644)
	writeFile(t, filepath.Join(dir, "keep.log"), "old\n", 0o644)
	writeFile(t, filepath.Join(dir, "conf/app.txt"), "setting=1\n", 0o644)
	writeFile(t, filepath.Join(dir, "a/b/c/deep.txt"), "deep\n", 0o644)
	symlink(t, "README.md", filepath.Join(dir, "link"))
	gittest.Run(t, dir, "add", "--all", "--force")
	gittest.Run(t, dir, "commit", "--quiet", "-m", "base")
	return &base{
		dir:    dir,
		commit: strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD")),
		tree:   strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD^{tree}")),
	}
}

// export writes the commit's files (no .git) to a new directory, the way
// stage leaves a retained source.
func (b *base) export(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	archive := exec.Command("git", "archive", "--format=tar", "HEAD")
	archive.Dir, archive.Env = b.dir, gittest.Env(b.dir)
	untar := exec.Command("tar", "-x", "-C", dst)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := archive.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	if err := archive.Wait(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// clone is a fresh checkout of the base commit, .git included.
func (b *base) clone(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "clone")
	gittest.Run(t, filepath.Dir(dst), "clone", "--quiet", b.dir, dst)
	return dst
}

func openRepo(t *testing.T) *worktree.Repo {
	t.Helper()
	r, err := worktree.Open(context.Background(), filepath.Join(t.TempDir(), "git"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return r
}

func treeHash(t *testing.T, r *worktree.Repo, dir string) string {
	t.Helper()
	h, err := r.TreeHash(context.Background(), dir)
	if err != nil {
		t.Fatalf("TreeHash: %v", err)
	}
	return h
}

func TestTreeHashMatchesTheCommit(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	for name, dir := range map[string]string{"exported": b.export(t), "cloned": b.clone(t)} {
		if got := treeHash(t, r, dir); got != b.tree {
			t.Errorf("%s: TreeHash = %s, the commit's tree is %s", name, got, b.tree)
		}
	}
	// Reopening the same git directory works and agrees.
	if got := treeHash(t, openRepo(t), b.export(t)); got != b.tree {
		t.Errorf("fresh repo: TreeHash = %s, want %s", got, b.tree)
	}
}

// TestTreeHashSeesEveryChange: the hash is what proves a staged source is
// the commit, so any difference at all must change it.
func TestTreeHashSeesEveryChange(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
	}{
		{"extra ignored file", func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "extra.log"), "x", 0o644) }},
		{"extra file in an ignored directory", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "build/x.o"), "x", 0o644)
		}},
		{"one byte changed", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "README.md"), "line1\nline2\nline4\n", 0o644)
		}},
		{"executable bit", func(t *testing.T, dir string) { os.Chmod(filepath.Join(dir, "mode.txt"), 0o755) }},
		{"symlink retargeted", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "link"))
			symlink(t, "src/main.go", filepath.Join(dir, "link"))
		}},
		{"symlink replaced by its target's content", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "link"))
			writeFile(t, filepath.Join(dir, "link"), "README.md", 0o644)
		}},
		{"file removed", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "keep.log")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := b.export(t)
			tc.change(t, dir)
			if got := treeHash(t, r, dir); got == b.tree {
				t.Fatal("TreeHash did not change")
			}
		})
	}
}

// snapshot describes each path under dir for comparison: type, executable
// bit, and content or link target. Directories show only through their files,
// as in git.
func snapshot(t *testing.T, dir string, skip func(rel string) bool) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if rel == ".git" || (skip != nil && skip(rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			snap[rel] = "link -> " + target
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			snap[rel] = fmt.Sprintf("file exec=%v %q", fi.Mode()&0o100 != 0, data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func diffSnapshots(t *testing.T, got, want map[string]string) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if got[k] != want[k] {
			t.Errorf("%s: got %s, want %s", k, got[k], want[k])
		}
	}
}

// applyTo applies patch to a fresh checkout of the base and returns it.
func applyTo(t *testing.T, b *base, patch []byte) string {
	t.Helper()
	clone := b.clone(t)
	patchFile := filepath.Join(t.TempDir(), "job.patch")
	if err := os.WriteFile(patchFile, patch, 0o644); err != nil {
		t.Fatal(err)
	}
	gittest.Run(t, clone, "apply", "--check", patchFile)
	gittest.Run(t, clone, "apply", patchFile)
	return clone
}

func TestDiffRoundTrip(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	baseTree := treeHash(t, r, b.export(t))
	work := b.export(t)

	// The job's work.
	writeFile(t, filepath.Join(work, "README.md"), "line1\nline2 changed\nline3\nline4\n", 0o644)
	writeFile(t, filepath.Join(work, "src/new.go"), "package main\n\nfunc f() {}\n", 0o644)
	if err := os.Remove(filepath.Join(work, "del.txt")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(work, "new.bin"), "\x00\xff\x00\xfe\x89PNG\r\n\x1a\n"+strings.Repeat("\x00", 100), 0o644)
	if err := os.Chmod(filepath.Join(work, "mode.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(work, "keep.log"), "new\n", 0o644)
	if err := os.Remove(filepath.Join(work, "link")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "src/main.go", filepath.Join(work, "link"))
	writeFile(t, filepath.Join(work, "space dir/ünï code.txt"), "unicode\n", 0o644)
	// New files the repository's .gitignore matches: left out.
	writeFile(t, filepath.Join(work, "build/out.o"), "object\n", 0o644)
	writeFile(t, filepath.Join(work, "debug.log"), "noise\n", 0o644)

	patch, stat, err := r.Diff(context.Background(), baseTree, work)
	if err != nil {
		t.Fatalf("Diff: %v", err)
	}
	for _, s := range []string{"build/out.o", "debug.log"} {
		if bytes.Contains(patch, []byte(s)) {
			t.Errorf("the patch includes the ignored new file %s", s)
		}
	}
	if !bytes.Contains(patch, []byte("diff --git a/keep.log b/keep.log")) {
		t.Error("the patch leaves out the edit to keep.log, tracked although ignored")
	}
	if !bytes.Contains(patch, []byte("GIT binary patch")) {
		t.Error("the binary file is not in the patch as a binary patch")
	}

	applied := applyTo(t, b, patch)
	ignoredNew := func(rel string) bool { return rel == "build" || rel == "debug.log" }
	diffSnapshots(t, snapshot(t, applied, nil), snapshot(t, work, ignoredNew))

	// README +2 -1, src/new.go +3, del.txt -2, new.bin binary, mode.txt
	// mode only, keep.log +1 -1, link +1 -1, space dir file +1.
	wantStat := worktree.DiffStat{FilesChanged: 8, Insertions: 8, Deletions: 5}
	if !sameCounts(stat, wantStat) {
		t.Errorf("DiffStat = %+v, want %+v", stat, wantStat)
	}
}

func TestDiffOfAnUntouchedTreeIsEmpty(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	baseTree := treeHash(t, r, b.export(t))
	patch, stat, err := r.Diff(context.Background(), baseTree, b.export(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(patch) != 0 || !sameCounts(stat, worktree.DiffStat{}) {
		t.Errorf("Diff of the base itself = %q, %+v", patch, stat)
	}
}

func TestDiffUnknownBase(t *testing.T) {
	b := newBase(t)
	r := openRepo(t) // has never seen the base's objects
	if _, _, err := r.Diff(context.Background(), b.tree, b.export(t)); err == nil {
		t.Fatal("Diff against a tree the repository does not hold succeeded")
	}
}

// trap fills dir/.git with a configuration, hooks and attributes that run
// scripts writing to markers/ whenever a git that honours them touches the
// tree, and returns the marker names.
func trap(t *testing.T, dir, markers string) []string {
	t.Helper()
	scripts := filepath.Join(filepath.Dir(markers), "scripts-"+filepath.Base(markers))
	names := []string{"fsmonitor", "post-index-change", "pre-commit", "reference-transaction", "filter-clean", "filter-smudge", "filter-process", "textconv", "external-diff"}
	for _, n := range names {
		body := fmt.Sprintf("#!/bin/sh\necho ran >> %s\n", filepath.Join(markers, n))
		if strings.HasPrefix(n, "filter-") {
			body += "cat\n"
		}
		writeFile(t, filepath.Join(scripts, n), body, 0o755)
	}
	// A repository with a commit, armed afterwards, so that it is a valid
	// repository any git would accept.
	gittest.Run(t, dir, "init", "--quiet")
	gittest.Run(t, dir, "commit", "--quiet", "--allow-empty", "-m", "job's own commit")
	cfg := fmt.Sprintf(`
[core]
	fsmonitor = %[1]s/fsmonitor
[filter "evil"]
	clean = %[1]s/filter-clean
	smudge = %[1]s/filter-smudge
	required = true
[diff "evil"]
	textconv = %[1]s/textconv
	command = %[1]s/external-diff
[diff]
	external = %[1]s/external-diff
# airlock-trap-config
`, scripts)
	f, err := os.OpenFile(filepath.Join(dir, ".git", "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(cfg); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, hook := range []string{"post-index-change", "pre-commit", "reference-transaction"} {
		writeFile(t, filepath.Join(dir, ".git", "hooks", hook), fmt.Sprintf("#!/bin/sh\necho ran >> %s\n", filepath.Join(markers, hook)), 0o755)
	}
	writeFile(t, filepath.Join(dir, ".gitattributes"), "* filter=evil diff=evil\n", 0o644)
	if err := os.MkdirAll(markers, 0o755); err != nil {
		t.Fatal(err)
	}
	return names
}

func fired(t *testing.T, markers string) []string {
	t.Helper()
	entries, err := os.ReadDir(markers)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestGitNeverRunsTheJobsConfiguration: a job controls everything in its
// work tree, .git included. The executor's git must read none of it.
func TestGitNeverRunsTheJobsConfiguration(t *testing.T) {
	b := newBase(t)
	tmp := t.TempDir()

	// Control: the traps work against a git that honours the work tree's
	// own repository, so their silence below means something.
	control := b.export(t)
	controlMarkers := filepath.Join(tmp, "control")
	trap(t, control, controlMarkers)
	writeFile(t, filepath.Join(control, "README.md"), "changed\n", 0o644)
	for _, args := range [][]string{{"add", "--all"}, {"status"}, {"commit", "-q", "-m", "x"}, {"diff", "HEAD~0", "--", "."}} {
		gitErr(control, args...) // failures are fine; only the markers matter
	}
	got := fired(t, controlMarkers)
	for _, want := range []string{"fsmonitor", "post-index-change", "filter-clean"} {
		if !slices.Contains(got, want) {
			t.Fatalf("control: %q fired, not %s; the traps are not armed", got, want)
		}
	}

	r := openRepo(t)
	baseTree := treeHash(t, r, b.export(t))
	work := b.export(t)
	markers := filepath.Join(tmp, "job")
	trap(t, work, markers)
	writeFile(t, filepath.Join(work, "README.md"), "changed\n", 0o644)
	// A nested repository with the same traps.
	sub := filepath.Join(work, "vendor", "lib")
	writeFile(t, filepath.Join(sub, "lib.go"), "package lib\n", 0o644)
	trap(t, sub, markers)

	patch, _, err := r.Diff(context.Background(), baseTree, work)
	if err != nil {
		t.Fatalf("Diff: %v", err)
	}
	if _, err := r.TreeHash(context.Background(), work); err != nil {
		t.Fatalf("TreeHash: %v", err)
	}
	if got := fired(t, markers); len(got) != 0 {
		t.Fatalf("the executor's git ran the job's %q", got)
	}
	for _, s := range []string{"airlock-trap-config", "diff --git a/.git/", "diff --git a/vendor/lib/.git/", "[filter \"evil\"]"} {
		if bytes.Contains(patch, []byte(s)) {
			t.Errorf("the patch carries the job's .git (%q)", s)
		}
	}
	if !bytes.Contains(patch, []byte("diff --git a/README.md b/README.md")) || !bytes.Contains(patch, []byte("+changed")) {
		t.Error("the patch lost the job's real edit")
	}
	if !bytes.Contains(patch, []byte("diff --git a/.gitattributes b/.gitattributes")) {
		t.Error("the patch lost the job's .gitattributes, an ordinary file")
	}
	// The edit is recorded as bytes, not through the job's clean filter.
	applied := applyTo(t, b, patch)
	if got, err := os.ReadFile(filepath.Join(applied, "README.md")); err != nil || string(got) != "changed\n" {
		t.Errorf("applied README.md = %q, %v", got, err)
	}
}

// TestDiffDoesNotReadThroughSymlinkedDirectories: a job replaces a tracked
// directory with a link to a host directory holding a file of the same name.
// The patch may record the link, never the host file.
func TestDiffDoesNotReadThroughSymlinkedDirectories(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	baseTree := treeHash(t, r, b.export(t))

	host := t.TempDir()
	secret := "AIRLOCK-DUMMY-SECRET-0b5e"
	writeFile(t, filepath.Join(host, "app.txt"), secret+"\n", 0o600)
	writeFile(t, filepath.Join(host, "deep.txt"), secret+"\n", 0o600)

	work := b.export(t)
	for _, d := range []string{"conf", "a/b/c"} {
		if err := os.RemoveAll(filepath.Join(work, d)); err != nil {
			t.Fatal(err)
		}
		symlink(t, host, filepath.Join(work, d))
	}
	writeFile(t, filepath.Join(work, "README.md"), "edited\n", 0o644)

	patch, _, err := r.Diff(context.Background(), baseTree, work)
	if err != nil {
		t.Fatalf("Diff: %v", err)
	}
	if bytes.Contains(patch, []byte(secret)) {
		t.Fatal("the patch carries a host file read through a job's symlink")
	}
	if !bytes.Contains(patch, []byte("+"+host)) {
		t.Error("the patch does not record the symlink itself")
	}
	if h, err := r.TreeHash(context.Background(), work); err != nil || h == baseTree {
		t.Errorf("TreeHash = %s, %v; want a new tree", h, err)
	}

	applied := applyTo(t, b, patch)
	if got, err := os.Readlink(filepath.Join(applied, "conf")); err != nil || got != host {
		t.Errorf("applied conf -> %q, %v; want a link to %s", got, err, host)
	}
}

func TestDiffIgnoredFiles(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	baseTree := treeHash(t, r, b.export(t))
	work := b.export(t)
	writeFile(t, filepath.Join(work, "keep.log"), "edited tracked log\n", 0o644)
	writeFile(t, filepath.Join(work, "new.log"), "new ignored log\n", 0o644)
	writeFile(t, filepath.Join(work, "build/gen.go"), "package build\n", 0o644)
	writeFile(t, filepath.Join(work, "src/visible.go"), "package main\n", 0o644)

	patch, stat, err := r.Diff(context.Background(), baseTree, work)
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{
		"diff --git a/keep.log b/keep.log":             true,
		"+edited tracked log":                          true,
		"diff --git a/src/visible.go b/src/visible.go": true,
		"new.log":         false,
		"new ignored log": false,
		"build/gen.go":    false,
	} {
		if got := bytes.Contains(patch, []byte(s)); got != want {
			t.Errorf("patch contains %q = %v, want %v", s, got, want)
		}
	}
	if want := (worktree.DiffStat{FilesChanged: 2, Insertions: 2, Deletions: 1}); !sameCounts(stat, want) {
		t.Errorf("DiffStat = %+v, want %+v", stat, want)
	}
}

func TestOpenIsIdempotent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "git")
	b := newBase(t)
	r1, err := worktree.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	tree := treeHash(t, r1, b.export(t))
	r2, err := worktree.Open(context.Background(), dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	// The reopened repository still holds the objects the first wrote.
	patch, _, err := r2.Diff(context.Background(), tree, b.export(t))
	if err != nil || len(patch) != 0 {
		t.Fatalf("Diff after reopen = %q, %v", patch, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "objects")); err != nil {
		t.Errorf("no objects directory: %v", err)
	}
}

// TestDiffNestedRepositories: a job may leave a repository inside its tree
// (a "git init", a cloned dependency) or a .git file naming any host path.
// The executor's git must neither read those repositories nor let them
// decide what the patch holds.
func TestDiffNestedRepositories(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	baseTree := treeHash(t, r, b.export(t))

	// Stands for any repository on the executor's host: the authority's
	// sources on a single-machine install, another checkout.
	hostRepo := newBase(t)
	writeFile(t, filepath.Join(hostRepo.dir, "host.txt"), "host\n", 0o644)
	gittest.Run(t, hostRepo.dir, "add", "host.txt")
	gittest.Run(t, hostRepo.dir, "commit", "--quiet", "-m", "host commit")
	hostHead := strings.TrimSpace(gittest.Run(t, hostRepo.dir, "rev-parse", "HEAD"))

	for _, tc := range []struct {
		name string
		make func(t *testing.T, work string)
	}{
		{"repository without a commit", func(t *testing.T, work string) {
			gittest.Run(t, filepath.Join(work, "sub"), "init", "--quiet")
		}},
		{"repository with a commit", func(t *testing.T, work string) {
			sub := filepath.Join(work, "sub")
			gittest.Run(t, sub, "init", "--quiet")
			gittest.Run(t, sub, "add", "file.txt")
			gittest.Run(t, sub, "commit", "--quiet", "-m", "nested")
		}},
		{".git file naming a host repository", func(t *testing.T, work string) {
			writeFile(t, filepath.Join(work, "sub", ".git"), "gitdir: "+filepath.Join(hostRepo.dir, ".git")+"\n", 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := b.export(t)
			writeFile(t, filepath.Join(work, "sub", "file.txt"), "job output\n", 0o644)
			tc.make(t, work)
			patch, _, err := r.Diff(context.Background(), baseTree, work)
			if err != nil {
				t.Fatalf("Diff: %v", err)
			}
			if bytes.Contains(patch, []byte(hostHead)) {
				t.Errorf("the patch carries the HEAD of a host repository: %s", patch)
			}
			if bytes.Contains(patch, []byte("160000")) || bytes.Contains(patch, []byte("Subproject commit")) {
				t.Errorf("the patch records a gitlink the job chose:\n%s", patch)
			}
			if !bytes.Contains(patch, []byte("+job output")) {
				t.Errorf("the patch lost sub/file.txt:\n%s", patch)
			}
		})
	}
}

// sameCounts compares the totals, and the file lists where both have one.
func sameCounts(a, b worktree.DiffStat) bool {
	if a.Files != nil && b.Files != nil && !reflect.DeepEqual(a.Files, b.Files) {
		return false
	}
	return a.FilesChanged == b.FilesChanged && a.Insertions == b.Insertions && a.Deletions == b.Deletions
}

// TestDiffFromKeptIndexEqualsDiff: starting from the index kept at staging
// must give exactly the patch a fresh index gives, on the staged directory
// itself (stat data matches) and on a copy (it does not).
func TestDiffFromKeptIndexEqualsDiff(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	staged := b.export(t)
	index := filepath.Join(t.TempDir(), "kept.index")
	tree, err := r.TreeHashIndex(context.Background(), staged, index)
	if err != nil {
		t.Fatal(err)
	}
	for name, work := range map[string]string{"same files": staged, "a copy": b.export(t)} {
		t.Run(name, func(t *testing.T) {
			writeFile(t, filepath.Join(work, "README.md"), "changed by the job\n", 0o644)
			writeFile(t, filepath.Join(work, "added.txt"), "new\n", 0o644)
			want, wantStat, err := r.Diff(context.Background(), tree, work)
			if err != nil {
				t.Fatal(err)
			}
			got, gotStat, err := r.DiffFrom(context.Background(), tree, index, work)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) || !sameCounts(gotStat, wantStat) || len(want) == 0 {
				t.Fatalf("DiffFrom differs from Diff:\n%s\n---\n%s", got, want)
			}
		})
	}
}

// TestDiffUpperEqualsDiff mounts a real overlay over a staged tree, makes
// every kind of change through it, and checks that reading only the upper
// layer gives exactly the patch a walk of the whole tree gives.
func TestDiffUpperEqualsDiff(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts overlayfs and needs root (CI runs as root)")
	}
	b := newBase(t)
	r := openRepo(t)
	lower := b.export(t)
	index := filepath.Join(t.TempDir(), "kept.index")
	tree, err := r.TreeHashIndex(context.Background(), lower, index)
	if err != nil {
		t.Fatal(err)
	}
	lowerFiles := snapshot(t, lower, nil)
	var names []string
	for name := range lowerFiles {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) < 3 {
		t.Fatalf("base has too few files to exercise deletions: %v", names)
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, work string)
	}{
		{"nothing", func(*testing.T, string) {}},
		{"edit add delete", func(t *testing.T, work string) {
			writeFile(t, filepath.Join(work, names[0]), "edited through the overlay\n", 0o644)
			writeFile(t, filepath.Join(work, "brand", "new.txt"), "new\n", 0o644)
			if err := os.Remove(filepath.Join(work, names[1])); err != nil {
				t.Fatal(err)
			}
		}},
		{"replace a directory", func(t *testing.T, work string) {
			dir := filepath.Dir(filepath.Join(work, names[len(names)-1]))
			if dir == work {
				t.Skip("base has no subdirectory")
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, "only.txt"), "the directory's new content\n", 0o644)
		}},
		{"remove a directory", func(t *testing.T, work string) {
			dir := filepath.Dir(filepath.Join(work, names[len(names)-1]))
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}},
		{"mode and link", func(t *testing.T, work string) {
			if err := os.Chmod(filepath.Join(work, names[0]), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("../elsewhere", filepath.Join(work, "newlink")); err != nil {
				t.Fatal(err)
			}
		}},
		{"nested repository", func(t *testing.T, work string) {
			writeFile(t, filepath.Join(work, "vendor", "dep", "code.txt"), "vendored\n", 0o644)
			gittest.Run(t, filepath.Join(work, "vendor", "dep"), "init", "--quiet")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			merged, upper := overlay(t, lower)
			tc.change(t, merged)
			got, gotStat, err := r.DiffUpper(context.Background(), tree, index, merged, upper, &bundle.Tally{Limit: 1 << 30})
			if err != nil {
				t.Fatalf("DiffUpper: %v", err)
			}
			// The reference: a full walk of a plain copy of the merged view.
			want, wantStat, err := r.Diff(context.Background(), tree, copyTree(t, merged))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) || !sameCounts(gotStat, wantStat) {
				t.Fatalf("DiffUpper differs from a full Diff:\n--- upper\n%s\n--- full\n%s", got, want)
			}
			if tc.name != "nothing" && len(want) == 0 {
				t.Fatal("the change produced no patch; the comparison proves nothing")
			}
		})
	}
	if after := snapshot(t, lower, nil); len(after) != len(lowerFiles) {
		t.Errorf("the lower layer changed: %d files, was %d", len(after), len(lowerFiles))
	}
}

// copyTree copies dir (files, links, directories) to a new directory.
func copyTree(t *testing.T, dir string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	out, err := exec.Command("cp", "-a", dir+"/.", dst+"/").CombinedOutput()
	if err != nil {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err = exec.Command("cp", "-a", dir+"/.", dst+"/").CombinedOutput(); err != nil {
			t.Fatalf("cp: %v\n%s", err, out)
		}
	}
	return dst
}

// TestOpenSurvivesAnInterruptedInit: a job cancelled while its
// repository's git directory was first made used to leave an init half
// done (objects/ and HEAD.lock, no HEAD), and every later job of the
// repository failed staging. Open with a cancelled context still makes a
// whole directory, and Open repairs one an earlier process left half made.
func TestOpenSurvivesAnInterruptedInit(t *testing.T) {
	b := newBase(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := filepath.Join(t.TempDir(), "git")
	r, err := worktree.Open(ctx, dir)
	if err != nil {
		t.Fatalf("Open with a cancelled context: %v", err)
	}
	if got := treeHash(t, r, b.export(t)); got != b.tree {
		t.Errorf("TreeHash = %s, want %s", got, b.tree)
	}

	half := filepath.Join(t.TempDir(), "git")
	for _, d := range []string{"objects/info", "refs/heads", "airlock-home"} {
		if err := os.MkdirAll(filepath.Join(half, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(half, "HEAD.lock"), []byte("ref: refs/heads/master\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err = worktree.Open(context.Background(), half)
	if err != nil {
		t.Fatalf("Open of a half-made directory: %v", err)
	}
	if got := treeHash(t, r, b.export(t)); got != b.tree {
		t.Errorf("after the repair: TreeHash = %s, want %s", got, b.tree)
	}
	if _, err := os.Stat(filepath.Join(half, "HEAD.lock")); err == nil {
		t.Error("HEAD.lock is still there")
	}
}
