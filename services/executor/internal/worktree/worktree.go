// Package worktree owns every git command the executor runs: hashing a
// staged source tree to check it against the commit's tree, and computing a
// job's patch against its base. Git always runs with the executor's own git
// directory and a scrubbed environment; it never reads a .git, config,
// hook or attribute driver the job could have written, because the job's
// files are only ever a work tree here. Only the executor's run manager
// imports it.
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
	"strconv"
	"strings"
)

// ErrTreeMismatch means a staged tree is not the commit's tree.
var ErrTreeMismatch = errors.New("staged source does not match the commit's tree")

// DiffStat summarizes a patch.
type DiffStat struct {
	FilesChanged, Insertions, Deletions int64
	// GitPaths are the .git entries Diff removed from the work tree.
	GitPaths []string
}

// Repo is an executor-owned git directory. It holds only objects the
// executor wrote from trees it staged or a finished job left behind.
type Repo struct {
	gitDir string
	home   string
}

// Open initializes (if needed) a bare git directory at gitDir.
func Open(ctx context.Context, gitDir string) (*Repo, error) {
	r := &Repo{gitDir: gitDir, home: filepath.Join(gitDir, "airlock-home")}
	if err := os.MkdirAll(r.home, 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(gitDir, "objects")); err != nil {
		if _, err := r.git(ctx, "", nil, "init", "--quiet", "--bare", gitDir); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// env is the whole environment git gets: nothing from the executor's own,
// no system or global config, no prompts, no pager.
func (r *Repo) env(index string) []string {
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + r.home,
		"GIT_DIR=" + r.gitDir,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_OPTIONAL_LOCKS=0",
		"LC_ALL=C",
	}
	if index != "" {
		env = append(env, "GIT_INDEX_FILE="+index)
	}
	return env
}

// git runs one git command. workTree, when set, is the tree git reads files
// from; it is data only.
func (r *Repo) git(ctx context.Context, workTree string, extraEnv []string, args ...string) ([]byte, error) {
	base := []string{
		"-c", "core.hooksPath=/dev/null",
		"-c", "core.fsmonitor=false",
		"-c", "core.symlinks=true",
		"-c", "core.autocrlf=false",
		"-c", "core.quotePath=false",
		"-c", "safe.directory=*",
		"-c", "diff.external=",
	}
	if workTree != "" {
		base = append(base, "--work-tree", workTree)
	}
	cmd := exec.CommandContext(ctx, "git", append(base, args...)...)
	cmd.Env = append(r.env(""), extraEnv...)
	cmd.Dir = r.home
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
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
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, to)
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
	patch, err := r.git(ctx, workDir, env, "diff-index", "--cached", "--patch", "--binary", "--full-index", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", baseTree)
	if err != nil {
		return nil, DiffStat{}, err
	}
	numstat, err := r.git(ctx, workDir, env, "diff-index", "--cached", "--numstat", "--no-renames", baseTree)
	if err != nil {
		return nil, DiffStat{}, err
	}
	st := parseNumstat(numstat)
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

func parseNumstat(out []byte) DiffStat {
	var st DiffStat
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			continue
		}
		st.FilesChanged++
		// Binary files show "-" for both counts.
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			st.Insertions += n
		}
		if n, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			st.Deletions += n
		}
	}
	return st
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
