package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A job's /work is a git repository at its base commit, as a shallow clone
// is (of depth 1 unless its tenant's policy gives it history; see
// history.go): its .git is the job's own, made fresh in the job's upper
// layer (so whatever the job does to it is thrown away with the sandbox
// and never reaches the patch, which the executor computes with its own
// git directory), and it borrows the base commit's objects, read-only,
// through alternates from a pack of exactly those objects: the commit,
// its tree and their blobs, and the checked history pack. Nothing else of the executor's object store
// (other jobs' work among it) is in the pack.

// ErrBadCommit is wrapped when a commit object is not the commit it is
// said to be.
var ErrBadCommit = errors.New("the commit object does not match")

// GitObjectsMount is where a job's base objects are mounted, read-only.
const GitObjectsMount = "/.airlock/git-objects"

// PackCommit checks that object is the commit object of commit whose tree
// is tree, stores it, and writes a pack of the commit, its tree and every
// tree and blob below into dir/pack. Submodule entries (commits of other
// repositories) are left out.
func (r *Repo) PackCommit(ctx context.Context, commit, tree string, object []byte, dir string) error {
	if len(commit) != 40 {
		return fmt.Errorf("%w: commit %s: only SHA-1 repositories get a .git", ErrBadCommit, commit)
	}
	first, _, _ := bytes.Cut(object, []byte("\n"))
	if string(first) != "tree "+tree {
		return fmt.Errorf("%w: commit %s names %q, want tree %s", ErrBadCommit, commit, first, tree)
	}
	// --literally: a genuine historical commit that git's fsck rules
	// would reject (a bad time zone, say) is still the commit; the hash
	// check below is what proves it is the one named.
	out, err := r.gitInput(ctx, "", nil, object, "hash-object", "-t", "commit", "-w", "--literally", "--stdin")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(string(out)); got != commit {
		return fmt.Errorf("%w: it hashes to %s, want %s", ErrBadCommit, got, commit)
	}
	list, err := r.git(ctx, "", nil, "ls-tree", "-r", "-t", "-z", "--full-tree", tree)
	if err != nil {
		return err
	}
	names := []string{commit, tree}
	for _, rec := range bytes.Split(list, []byte{0}) {
		// "<mode> <type> <object>\t<path>"
		meta, _, ok := bytes.Cut(rec, []byte("\t"))
		f := strings.Fields(string(meta))
		if !ok || len(f) != 3 || f[1] == "commit" {
			continue
		}
		names = append(names, f[2])
	}
	if err := os.MkdirAll(filepath.Join(dir, "pack"), 0o755); err != nil {
		return err
	}
	// --window=0: no delta search. The objects of one tree seldom delta
	// against each other and the pack stays on this disk; the search took
	// 6 to 55 s of staging a 66 MB, 6,813-file tree on a loaded machine,
	// 2.4 times the pack without it (docs/performance.md).
	_, err = r.gitInput(ctx, "", nil, []byte(strings.Join(names, "\n")+"\n"), "pack-objects", "--quiet", "--window=0", filepath.Join(dir, "pack", "pack"))
	return err
}

// SeedGitDir makes workDir/.git: a repository at commit with HEAD
// detached there, shallow at the given boundary (the commits whose parents
// are not there: the base alone at depth 1, none when the history reaches
// its root), its index a copy of index (the staged tree's), and its
// objects borrowed from GitObjectsMount. Everything is owned by uid:gid
// (the host ids of the job's user).
func SeedGitDir(workDir, commit string, shallow []string, index string, uid, gid int) error {
	git := filepath.Join(workDir, ".git")
	if _, err := os.Lstat(git); err == nil {
		// The repository has a .git of its own in its tree (a file or a
		// directory): the job keeps it as it is.
		return nil
	}
	files := map[string]string{
		"HEAD": commit + "\n",
		"config": "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n" +
			"[user]\n\tname = Airlock job\n\temail = job@airlock.invalid\n",
		"description":             "Airlock job: a disposable repository at the job's base commit\n",
		"objects/info/alternates": GitObjectsMount + "\n",
	}
	if len(shallow) > 0 {
		files["shallow"] = strings.Join(shallow, "\n") + "\n"
	}
	for _, d := range []string{"", "objects", "objects/info", "objects/pack", "refs", "refs/heads", "refs/tags", "info", "hooks"} {
		p := filepath.Join(git, d)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(index)
	if err != nil {
		return err
	}
	write := func(name string, content []byte) error {
		p := filepath.Join(git, name)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	}
	if err := write("index", data); err != nil {
		return err
	}
	for name, content := range files {
		if err := write(name, []byte(content)); err != nil {
			return err
		}
	}
	return nil
}
