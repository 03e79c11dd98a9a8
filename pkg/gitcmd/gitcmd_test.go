package gitcmd_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/gitcmd"
)

// TestHooksAndConfigDoNotRun: a repository's own hooks and the caller's
// environment do not reach git run through gitcmd.
func TestHooksAndConfigDoNotRun(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(t.TempDir(), "hook-ran")
	t.Setenv("GIT_AUTHOR_NAME", "leaked from the caller")
	c := gitcmd.Cmd{Dir: dir, Env: append(gitcmd.Env(dir), "GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@x", "GIT_COMMITTER_NAME=c", "GIT_COMMITTER_EMAIL=c@x")}
	ctx := context.Background()
	if _, err := c.Run(ctx, "init", "-q", "."); err != nil {
		t.Fatal(err)
	}
	hook := filepath.Join(dir, ".git", "hooks", "pre-commit")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx, "commit", "-q", "--allow-empty", "-m", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a repository hook ran")
	}
	out, err := c.Run(ctx, "log", "-1", "--format=%an")
	if err != nil || strings.TrimSpace(string(out)) != "a" {
		t.Errorf("author %q, %v: the caller's environment leaked in", out, err)
	}
	_, err = c.Run(ctx, "no-such-command")
	var ge *gitcmd.Error
	if !errors.As(err, &ge) || ge.Command != "no-such-command" || ge.Stderr == "" {
		t.Errorf("a failed run: %v", err)
	}
}

// TestMaxOutputAndCgroups: output past MaxOutput ends the run with
// ErrOutputLimit and no output (a buffer with ReadFrom would have taken
// it all, bypassing the bound); a cgroup git cannot join fails the run
// before git starts.
func TestMaxOutputAndCgroups(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	c := gitcmd.Cmd{Dir: dir, Env: gitcmd.Env(dir)}
	if _, err := c.Run(ctx, "init", "-q", "."); err != nil {
		t.Fatal(err)
	}
	c.Stdin = strings.NewReader(strings.Repeat("x", 1<<20))
	blob, err := c.Run(ctx, "hash-object", "-w", "--stdin")
	if err != nil {
		t.Fatal(err)
	}
	c.Stdin, c.MaxOutput = nil, 64<<10
	out, err := c.Run(ctx, "cat-file", "blob", strings.TrimSpace(string(blob)))
	var ge *gitcmd.Error
	if !errors.Is(err, gitcmd.ErrOutputLimit) || !errors.As(err, &ge) || ge.Command != "cat-file" || out != nil {
		t.Fatalf("1 MiB printed under a 64 KiB bound: %d bytes, %v", len(out), err)
	}
	c.MaxOutput = 2 << 20
	if out, err := c.Run(ctx, "cat-file", "blob", strings.TrimSpace(string(blob))); err != nil || len(out) != 1<<20 {
		t.Fatalf("within the bound: %d bytes, %v", len(out), err)
	}
	c.Cgroups = []string{filepath.Join(dir, "no-such-cgroup", "cgroup.procs")}
	var ee *exec.ExitError
	if out, err := c.Run(ctx, "version"); !errors.As(err, &ee) || ee.ExitCode() != 125 || len(out) != 0 {
		t.Fatalf("git ran though it could not join its cgroup: %q, %v", out, err)
	}
	c.Cgroups = []string{filepath.Join(dir, "joined")} // a plain file takes the write
	if out, err := c.Run(ctx, "version"); err != nil || !strings.HasPrefix(string(out), "git version") {
		t.Fatalf("through the shell: %q, %v", out, err)
	}
}

// TestOneGit: a run in cgroups goes through a shell whose PATH is Env's,
// one without is started by this process: both used to look "git" up,
// each in its own PATH, so two different gits could run over one
// repository. A "git" first in either PATH (one that only says "fake")
// is never run: both run the absolute path looked up once.
func TestOneGit(t *testing.T) {
	fake := t.TempDir()
	if err := os.WriteFile(filepath.Join(fake, "git"), []byte("#!/bin/sh\necho fake\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	path, err := gitcmd.Path()
	if err != nil || !filepath.IsAbs(path) {
		t.Fatalf("git is %q (%v), want an absolute path", path, err)
	}
	t.Setenv("PATH", fake+":"+os.Getenv("PATH"))
	env := append(gitcmd.Env(t.TempDir()), "PATH="+fake+":/usr/local/bin:/usr/bin:/bin")
	procs := filepath.Join(t.TempDir(), "cgroup.procs") // the shell writes 0 to it
	for _, c := range []struct {
		name string
		cmd  gitcmd.Cmd
	}{
		{"plain", gitcmd.Cmd{Dir: fake, Env: env}},
		{"cgroups", gitcmd.Cmd{Dir: fake, Env: env, Cgroups: []string{procs}}},
	} {
		out, err := c.cmd.Run(context.Background(), "version")
		if err != nil || !strings.HasPrefix(string(out), "git version") {
			t.Errorf("%s: git version printed %q (%v): not the git at %s", c.name, out, err, path)
		}
	}
	if again, _ := gitcmd.Path(); again != path {
		t.Errorf("git was looked up again: %s, then %s", path, again)
	}
}
