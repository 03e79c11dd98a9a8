// Package gittest runs git for tests: the sealed environment (gitcmd.Env)
// with fixed identities and dates, so a test's commits are the same on every
// run and nothing of the developer's configuration reaches them; Run, which
// fails the test with git's standard error; and Repo, a working repository a
// test builds commits in. Only tests import it.
package gittest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/gitcmd"
)

// Date is the author and committer date of every commit a test makes.
const Date = "2030-01-02T03:04:05Z"

// Env is the whole environment of a git a test runs itself; home is HOME.
func Env(home string) []string {
	return append(gitcmd.Env(home),
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com", "GIT_AUTHOR_DATE="+Date,
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com", "GIT_COMMITTER_DATE="+Date,
	)
}

// Cmd is git with args in dir, in Env(dir), not yet run.
func Cmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = Env(dir)
	return cmd
}

// Run runs git with args in dir and returns its standard output; a failure
// fails t with git's standard error.
func Run(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := Cmd(dir, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// Repo is a working repository made for a test.
type Repo struct {
	t   testing.TB
	Dir string
}

// Init makes dir (and its parents) and a repository in it whose first
// branch is main.
func Init(t testing.TB, dir string) *Repo {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Repo{t: t, Dir: dir}
	r.Run("init", "-q", "-b", "main")
	return r
}

// Run runs git with args in the repository (see Run).
func (r *Repo) Run(args ...string) string {
	r.t.Helper()
	return Run(r.t, r.Dir, args...)
}

// Write writes content to name in the work tree, making its directories.
func (r *Repo) Write(name, content string) {
	r.t.Helper()
	p := filepath.Join(r.Dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// Commit commits everything in the work tree with msg and returns the new
// commit's id.
func (r *Repo) Commit(msg string) string {
	r.t.Helper()
	r.Run("add", "-A")
	r.Run("commit", "-q", "-m", msg)
	return r.RevParse("HEAD")
}

// RevParse is the object id expr names.
func (r *Repo) RevParse(expr string) string {
	r.t.Helper()
	return strings.TrimSpace(r.Run("rev-parse", "--verify", expr))
}

// At is a Repo over dir as it is (a bare repository, one made elsewhere).
func At(t testing.TB, dir string) *Repo { return &Repo{t: t, Dir: dir} }
