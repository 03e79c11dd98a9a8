package gitcmd_test

import (
	"context"
	"errors"
	"os"
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
