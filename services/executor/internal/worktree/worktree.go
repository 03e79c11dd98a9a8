// Package worktree owns every git command the executor runs: hashing a
// staged source tree to check it against the commit's tree, packing and
// checking the objects of a job's own .git (gitdir.go, history.go), and
// computing a job's patch against its base. Git always runs with the executor's own git
// directory and a scrubbed environment; it never reads a .git, config,
// hook or attribute driver the job could have written, because the job's
// files are only ever a work tree here, and the repository's
// info/attributes overrides every attribute that would convert or filter
// them. Over a job's files it runs Confined: in the job's cgroup, under
// its memory limit. Only the executor's run manager imports it.
package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/gitcmd"
)

// ErrTreeMismatch means a staged tree is not the commit's tree.
var ErrTreeMismatch = errors.New("staged source does not match the commit's tree")

// DiffStat summarizes a patch.
type DiffStat struct {
	FilesChanged, Insertions, Deletions int64
	// Files is every file the patch changes, in the patch's order; the
	// counts above are their sums.
	Files []bundle.FileChange
	// GitPaths are the .git entries Diff removed from the work tree.
	GitPaths []string
}

// Repo is an executor-owned git directory. It holds only objects the
// executor wrote from trees it staged or a finished job left behind.
type Repo struct {
	gitDir string
	home   string
	// conf, when set, is where every git runs (Confined).
	conf Confinement
}

// Confinement is where git runs over a finished job's files: its memory is
// the job's to spend, not the host's (sandbox.Cgroup is one). git holds a
// changed file whole, and a line diff takes tens of bytes per line, so a
// job could otherwise leave, within its disk limit, files that cost the
// executor many times its memory limit.
type Confinement interface {
	// CgroupProcs are the cgroup.procs files git joins before it starts.
	CgroupProcs() []string
	// MemoryBytes is the memory limit there. What git prints, which the
	// executor holds (the patch), is bounded by it too.
	MemoryBytes() int64
	// OOMKills counts the kernel's OOM kills there so far.
	OOMKills() int64
}

// Confined is r with every git it runs in c.
func (r *Repo) Confined(c Confinement) *Repo {
	cp := *r
	cp.conf = c
	return &cp
}

// MemoryError is a job's patch that would have cost more memory than the
// job's limit: git, computing it in the job's Confinement, was killed by
// the kernel's OOM killer or could not allocate, or what it printed passed
// the limit. Nothing of the patch is returned.
type MemoryError struct {
	// Command is the git command that failed ("diff-index", ...).
	Command string
	// Limit is the job's memory limit in bytes.
	Limit int64
	// Output is set when the patch itself passed the limit.
	Output bool
}

func (e *MemoryError) Error() string {
	if e.Output {
		return fmt.Sprintf("the patch of the job's changes is larger than its memory limit of %d bytes", e.Limit)
	}
	return fmt.Sprintf("computing the patch of the job's changes (git %s) needed more than its memory limit of %d bytes", e.Command, e.Limit)
}

// Open initializes (if needed) a bare git directory at gitDir.
//
// A directory git init did not finish in (gitcmd.Initialized: the process
// died in it) never stored anything, and it is made again from nothing. The init itself is not cut short when
// ctx ends (a cancelled job used to leave HEAD.lock behind, failing every
// later job of the repository); it takes milliseconds and is bounded.
func Open(ctx context.Context, gitDir string) (*Repo, error) {
	r := &Repo{gitDir: gitDir, home: filepath.Join(gitDir, "airlock-home")}
	if !gitcmd.Initialized(gitDir) {
		if err := os.RemoveAll(gitDir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(r.home, 0o700); err != nil {
			return nil, err
		}
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), initTimeout)
		defer cancel()
		if _, err := r.git(ictx, "", nil, "init", "--quiet", "--bare", gitDir); err != nil {
			return nil, err
		}
		if err := r.writeAttributes(); err != nil {
			return nil, err
		}
		return r, nil
	}
	if err := os.MkdirAll(r.home, 0o700); err != nil {
		return nil, err
	}
	if err := r.writeAttributes(); err != nil {
		return nil, err
	}
	return r, nil
}

// writeAttributes writes gitcmd.PlainAttributes where it is not already.
func (r *Repo) writeAttributes() error {
	p := filepath.Join(r.gitDir, "info", "attributes")
	if b, err := os.ReadFile(p); err == nil && string(b) == gitcmd.PlainAttributes {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, []byte(gitcmd.PlainAttributes), 0o644, atomicfile.Durable)
}

// initTimeout bounds one git init.
const initTimeout = 30 * time.Second

// env is the whole environment git gets: gitcmd's, with this directory.
func (r *Repo) env(index string) []string {
	env := append(gitcmd.Env(r.home), "GIT_DIR="+r.gitDir)
	if index != "" {
		env = append(env, "GIT_INDEX_FILE="+index)
	}
	return env
}

// git runs one git command. workTree, when set, is the tree git reads files
// from; it is data only.
func (r *Repo) git(ctx context.Context, workTree string, extraEnv []string, args ...string) ([]byte, error) {
	return r.gitInput(ctx, workTree, extraEnv, nil, args...)
}

// gitInput is git with stdin.
func (r *Repo) gitInput(ctx context.Context, workTree string, extraEnv []string, stdin []byte, args ...string) ([]byte, error) {
	if workTree != "" {
		args = append([]string{"--work-tree", workTree}, args...)
	}
	c := gitcmd.Cmd{Dir: r.home, Env: append(r.env(""), extraEnv...)}
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	return r.run(ctx, c, args...)
}

// run runs c, in r's Confinement when it has one, and turns a run that
// passed the memory limit there into a *MemoryError.
func (r *Repo) run(ctx context.Context, c gitcmd.Cmd, args ...string) ([]byte, error) {
	if r.conf == nil {
		return c.Run(ctx, args...)
	}
	c.Cgroups, c.MaxOutput = r.conf.CgroupProcs(), r.conf.MemoryBytes()
	// One thread: the job's pids limit binds there too, and git dies
	// when it cannot start the threads it would use on a large index.
	args = append([]string{"-c", "core.preloadIndex=false", "-c", "index.threads=1"}, args...)
	before := r.conf.OOMKills()
	out, err := c.Run(ctx, args...)
	var ge *gitcmd.Error
	if err == nil || !errors.As(err, &ge) {
		return out, err
	}
	switch {
	case errors.Is(err, gitcmd.ErrOutputLimit):
		return nil, &MemoryError{Command: ge.Command, Limit: c.MaxOutput, Output: true}
	case r.conf.OOMKills() > before || strings.Contains(ge.Stderr, "fatal: Out of memory"):
		// Killed by the kernel, or git's own "fatal: Out of memory,
		// malloc failed" (an allocation the limit refused outright).
		return nil, &MemoryError{Command: ge.Command, Limit: c.MaxOutput}
	}
	return out, err
}

// TreeHash writes every file under dir (ignored ones too: this is the
// commit's content, not a work product) and returns the tree hash.
func (r *Repo) TreeHash(ctx context.Context, dir string) (string, error) {
	return r.TreeHashIndex(ctx, dir, "")
}

// TreeHashIndex is TreeHash that also keeps the index it built at keep
// (when not empty). Its stat data lets a later Diff against a view of the
// same files skip re-reading every unchanged one.
func (r *Repo) TreeHashIndex(ctx context.Context, dir, keep string) (string, error) {
	index, cleanup, err := r.tempIndex()
	if err != nil {
		return "", err
	}
	defer cleanup()
	env := []string{"GIT_INDEX_FILE=" + index}
	if _, err := r.git(ctx, dir, env, "add", "--all", "--force", "--", "."); err != nil {
		return "", err
	}
	out, err := r.git(ctx, dir, env, "write-tree")
	if err != nil {
		return "", err
	}
	if keep != "" {
		if err := copyFile(index, keep); err != nil {
			return "", err
		}
	}
	return strings.TrimSpace(string(out)), nil
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return atomicfile.Write(to, data, 0o600, atomicfile.Fast)
}

// Diff returns the binary-safe patch that turns baseTree into the content of
// workDir, and its stat. The index starts from baseTree, so files the base
// tracks stay tracked even where the repository's .gitignore matches them;
// new files the .gitignore matches are left out, as git would.
//
// workDir must be a disposable view (a finished job's overlay): Diff first
// deletes every .git entry in it. A directory holding .git would otherwise
// be read as a repository — a .git file may name any repository on the
// host — and recorded as a gitlink the job chose; without it, its files are
// ordinary content of the patch.
func (r *Repo) Diff(ctx context.Context, baseTree, workDir string) ([]byte, DiffStat, error) {
	return r.DiffFrom(ctx, baseTree, "", workDir)
}

// DiffFrom is Diff starting from baseIndex, an index of baseTree kept by
// TreeHashIndex (empty: build one from the tree). With it, git re-reads only
// files whose stat data changed, so the cost follows the job's changes, not
// the repository's size.
func (r *Repo) DiffFrom(ctx context.Context, baseTree, baseIndex, workDir string) ([]byte, DiffStat, error) {
	removed, err := removeGitEntries(workDir)
	if err != nil {
		return nil, DiffStat{}, fmt.Errorf("remove .git entries: %w", err)
	}
	index, cleanup, err := r.tempIndex()
	if err != nil {
		return nil, DiffStat{}, err
	}
	defer cleanup()
	env := []string{"GIT_INDEX_FILE=" + index}
	if baseIndex != "" {
		if err := copyFile(baseIndex, index); err != nil {
			return nil, DiffStat{}, err
		}
	} else if _, err := r.git(ctx, "", env, "read-tree", baseTree); err != nil {
		return nil, DiffStat{}, err
	}
	if _, err := r.git(ctx, workDir, env, "add", "--all", "--", "."); err != nil {
		return nil, DiffStat{}, err
	}
	patch, err := r.git(ctx, "", env, "diff-index", "--cached", "--patch", "--binary", "--full-index", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", baseTree)
	if err != nil {
		return nil, DiffStat{}, err
	}
	st, err := r.fileChanges(ctx, env, baseTree, patch)
	if err != nil {
		return nil, DiffStat{}, err
	}
	st.GitPaths = removed
	return patch, st, nil
}

// removeGitEntries deletes every entry named .git under root (not following
// symlinks) and returns their paths relative to root.
func removeGitEntries(root string) ([]string, error) {
	var removed []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() != ".git" || p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		removed = append(removed, rel)
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		if d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
	return removed, err
}

func (r *Repo) tempIndex() (string, func(), error) {
	f, err := os.CreateTemp(r.home, "index-*")
	if err != nil {
		return "", nil, err
	}
	name := f.Name()
	f.Close()
	// git refuses an empty file as an index; it creates one where none is.
	os.Remove(name)
	return name, func() { os.Remove(name); os.Remove(name + ".lock") }, nil
}

// DiffUpper is DiffFrom for a work tree that is an overlay whose upper
// layer is upperDir: only the paths the upper layer holds are handed to
// git, so the cost follows what the job changed, not the repository's size.
// Anything it cannot read exactly (a directory renamed with overlayfs
// redirects) falls back to DiffFrom over the whole tree.
//
// Before git runs, every regular file of the upper layer (but .git
// entries, which are removed) is counted in exported by its apparent size,
// as /work/PATH; past exported's limit DiffUpper returns the
// *bundle.TooLargeError and git never runs. git reads a changed file whole
// (and diff-index --binary holds it in memory): a sparse file of a few
// blocks inside the job would otherwise cost the executor its full size.
// What it costs within that bound is the job's memory when r is Confined.
func (r *Repo) DiffUpper(ctx context.Context, baseTree, baseIndex, workDir, upperDir string, exported *bundle.Tally) ([]byte, DiffStat, error) {
	changes, err := scanUpper(upperDir, exported)
	var tooLarge *bundle.TooLargeError
	if errors.As(err, &tooLarge) {
		return nil, DiffStat{}, err
	}
	if err != nil {
		return nil, DiffStat{}, fmt.Errorf("read overlay upper layer: %w", err)
	}
	if changes.redirect {
		return r.DiffFrom(ctx, baseTree, baseIndex, workDir)
	}
	var removed []string
	for _, rel := range changes.gitPaths {
		if err := os.RemoveAll(filepath.Join(workDir, rel)); err != nil {
			return nil, DiffStat{}, fmt.Errorf("remove .git entries: %w", err)
		}
		removed = append(removed, rel)
	}
	if len(changes.paths) == 0 {
		return nil, DiffStat{GitPaths: removed}, nil
	}
	index, cleanup, err := r.tempIndex()
	if err != nil {
		return nil, DiffStat{}, err
	}
	defer cleanup()
	// The index first; literal pathspecs so a name with * or ? is just a name
	// (check-ignore, which takes paths, refuses the setting).
	env := []string{"GIT_INDEX_FILE=" + index, "GIT_LITERAL_PATHSPECS=1"}
	if baseIndex != "" {
		if err := copyFile(baseIndex, index); err != nil {
			return nil, DiffStat{}, err
		}
	} else if _, err := r.git(ctx, "", env, "read-tree", baseTree); err != nil {
		return nil, DiffStat{}, err
	}
	// Naming an ignored new file to git add is an error; leave such files
	// out, as a plain `git add --all` would.
	ignored, err := r.ignored(ctx, workDir, env[:1], changes.files)
	if err != nil {
		return nil, DiffStat{}, err
	}
	var spec []byte
	for _, p := range changes.paths {
		if !ignored[p] {
			spec = append(append(spec, p...), 0)
		}
	}
	specFile, err := os.CreateTemp(r.home, "pathspec-*")
	if err != nil {
		return nil, DiffStat{}, err
	}
	defer os.Remove(specFile.Name())
	if _, err := specFile.Write(spec); err != nil {
		specFile.Close()
		return nil, DiffStat{}, err
	}
	specFile.Close()
	if len(spec) > 0 {
		if _, err := r.git(ctx, workDir, env, "add", "--all", "--pathspec-from-file="+specFile.Name(), "--pathspec-file-nul"); err != nil {
			var mem *MemoryError
			if errors.As(err, &mem) {
				return nil, DiffStat{}, err
			}
			// A layer git cannot take path by path (say, a whiteout for a
			// path the base never had) is still diffed exactly, the slow way.
			return r.DiffFrom(ctx, baseTree, baseIndex, workDir)
		}
	}
	patch, err := r.git(ctx, "", env, "diff-index", "--cached", "--patch", "--binary", "--full-index", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", baseTree)
	if err != nil {
		return nil, DiffStat{}, err
	}
	st, err := r.fileChanges(ctx, env, baseTree, patch)
	if err != nil {
		return nil, DiffStat{}, err
	}
	st.GitPaths = removed
	return patch, st, nil
}

// ignored returns which of paths the work tree's ignore rules exclude
// (tracked paths never count as ignored).
func (r *Repo) ignored(ctx context.Context, workDir string, env []string, paths []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(paths) == 0 {
		return out, nil
	}
	var in bytes.Buffer
	for _, p := range paths {
		in.WriteString(p)
		in.WriteByte(0)
	}
	c := gitcmd.Cmd{Dir: r.home, Env: append(r.env(""), env...), Stdin: &in}
	stdout, err := r.run(ctx, c, "--work-tree", workDir, "check-ignore", "-z", "--stdin")
	if err != nil {
		// Exit status 1 means "none of them is ignored".
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			return nil, err
		}
	}
	for _, p := range bytes.Split(stdout, []byte{0}) {
		if len(p) > 0 {
			out[string(p)] = true
		}
	}
	return out, nil
}

// upperChanges is what an overlay upper layer says a job changed.
type upperChanges struct {
	paths    []string // every path to hand to git add: files, links, whiteouts, opaque directories
	files    []string // the non-directory ones among them (candidates for ignore rules)
	gitPaths []string // .git entries, to remove
	redirect bool     // a renamed directory: the layer alone does not say what moved
}

// scanUpper reads an overlayfs upper layer without following links or
// reading a file, and counts every regular file but .git entries in
// exported (as /work/PATH), its error once they pass its limit.
func scanUpper(upper string, exported *bundle.Tally) (*upperChanges, error) {
	c := &upperChanges{}
	covered := "" // an opaque directory: git takes all of it by its path
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == upper {
			return nil
		}
		rel, _ := filepath.Rel(upper, p)
		if d.Name() == ".git" {
			c.gitPaths = append(c.gitPaths, rel)
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			exported.Add("/work/"+filepath.ToSlash(rel), info.Size())
		}
		if c.redirect || (covered != "" && strings.HasPrefix(rel, covered+"/")) {
			return nil // only counted: its paths are decided already
		}
		if d.IsDir() {
			if xattr(p, "trusted.overlay.redirect") != "" {
				c.redirect = true
			} else if xattr(p, "trusted.overlay.opaque") == "y" {
				c.paths = append(c.paths, rel)
				covered = rel
			}
			return nil
		}
		c.paths = append(c.paths, rel)
		c.files = append(c.files, rel)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, exported.Err()
}

func xattr(path, name string) string {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil || n <= 0 {
		return ""
	}
	return string(buf[:n])
}
