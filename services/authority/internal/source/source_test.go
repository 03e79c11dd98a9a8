package source_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"github.com/airlockhq/airlock/test/gittest"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/logging/logtest"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/source"
)

// newRepo makes a repository with two commits on main, a feature branch,
// a lightweight tag v1 and an annotated tag v2.
func newRepo(t testing.TB) *gittest.Repo {
	t.Helper()
	r := gittest.Init(t, filepath.Join(t.TempDir(), "origin"))
	r.Write("README.md", "hello\n")
	r.Write("src/main.go", "package main\n")
	r.Commit("first")
	r.Run("tag", "v1")
	r.Write("src/lib.go", "package main\n\nfunc f() {}\n")
	r.Commit("second")
	r.Run("tag", "-a", "-m", "release", "v2")
	r.Run("checkout", "-q", "-b", "feature")
	r.Write("feature.txt", "feature\n")
	r.Commit("feature")
	r.Run("checkout", "-q", "main")
	return r
}

func newSource(t testing.TB) (*source.Source, *logtest.Buffer, string) {
	t.Helper()
	logs := &logtest.Buffer{}
	dir := filepath.Join(t.TempDir(), "source")
	s, err := source.New(dir, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return s, logs, dir
}

// repos returns the same origin as a local path and as a file:// URL
// fetched into a mirror.
func repos(r *gittest.Repo) map[string]policy.Repository {
	return map[string]policy.Repository{
		"local":  {Tenant: "dev", Name: "demo", URL: r.Dir},
		"mirror": {Tenant: "dev", Name: "demo", URL: "file://" + r.Dir},
	}
}

func TestResolve(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	main, feature := r.RevParse("main"), r.RevParse("feature")
	for kind, repo := range repos(r) {
		for _, tc := range []struct {
			rev  string
			want string
		}{
			{"main", main},
			{"feature", feature},
			{"v1", r.RevParse("v1^{commit}")},
			{"v2", r.RevParse("v2^{commit}")}, // annotated: the commit, not the tag object
			{"refs/heads/feature", feature},
			{main[:7], main},
			{main, main},
			{"HEAD", main}, // the checked-out branch; a mirror follows the remote's HEAD
		} {
			t.Run(kind+"/"+tc.rev, func(t *testing.T) {
				got, err := s.Resolve(t.Context(), repo, tc.rev)
				if err != nil {
					t.Fatalf("Resolve(%q): %v", tc.rev, err)
				}
				if got.Commit != tc.want {
					t.Errorf("commit = %s, want %s", got.Commit, tc.want)
				}
				if want := r.RevParse(tc.want + "^{tree}"); got.Tree != want {
					t.Errorf("tree = %s, want %s (git rev-parse %s^{tree})", got.Tree, want, tc.want)
				}
			})
		}
	}
}

func TestResolveRefusals(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	marker := filepath.Join(t.TempDir(), "pwned")
	for kind, repo := range repos(r) {
		for _, tc := range []struct {
			rev  string
			want error
		}{
			{"nope", source.ErrUnknownRevision},
			{"0000000000000000000000000000000000000000", source.ErrUnknownRevision},
			{"deadbeef", source.ErrUnknownRevision},
			{"", source.ErrBadRevision},
			{"--output=" + marker, source.ErrBadRevision},
			{"-c", source.ErrBadRevision},
			{"main..feature", source.ErrBadRevision},
			{"HEAD~1", source.ErrBadRevision},
			{"main^", source.ErrBadRevision},
			{"HEAD:README.md", source.ErrBadRevision},
			{"@{-1}", source.ErrBadRevision},
			{"main feature", source.ErrBadRevision},
			{"ma\nin", source.ErrBadRevision},
		} {
			t.Run(kind+"/"+tc.rev, func(t *testing.T) {
				_, err := s.Resolve(t.Context(), repo, tc.rev)
				if !errors.Is(err, tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("Resolve(%q) = %v, want %v (an invalid argument)", tc.rev, err, tc.want)
				}
			})
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a '-'-prefixed revision reached git as an option")
	}
}

func TestArchiveIsGitArchive(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	for kind, repo := range repos(r) {
		for _, rev := range []string{"main", "feature", "v1"} {
			t.Run(kind+"/"+rev, func(t *testing.T) {
				res, err := s.Resolve(t.Context(), repo, rev)
				if err != nil {
					t.Fatal(err)
				}
				var got bytes.Buffer
				if err := s.Archive(t.Context(), repo, res.Commit, &got); err != nil {
					t.Fatalf("Archive: %v", err)
				}
				want := r.Run("archive", "--format=tar", res.Commit)
				if got.String() != want {
					t.Fatalf("archive of %s: %d bytes, want the %d bytes of git archive", rev, got.Len(), len(want))
				}
			})
		}
	}
}

func TestArchiveRefusals(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	repo := repos(r)["local"]
	var buf bytes.Buffer
	if err := s.Archive(t.Context(), repo, "main", &buf); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("archive of a non-SHA: %v", err)
	}
	if err := s.Archive(t.Context(), repo, strings.Repeat("ab", 20), &buf); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("archive of a missing commit: %v", err)
	}
	missing := policy.Repository{Tenant: "dev", Name: "gone", URL: filepath.Join(t.TempDir(), "nothing")}
	if _, err := s.Resolve(t.Context(), missing, "main"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("resolve in a missing local repository: %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("refused archives wrote %d bytes", buf.Len())
	}
}

func TestMirrorFollowsAndKeepsCommits(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	repo := repos(r)["mirror"]
	before, err := s.Resolve(t.Context(), repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite main: the old commit is no longer on any branch of the origin.
	r.Run("reset", "-q", "--hard", "v1")
	r.Write("other.txt", "x\n")
	after := r.Commit("rewritten")
	r.Run("tag", "-d", "v2")
	got, err := s.Resolve(t.Context(), repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	if got.Commit != after {
		t.Fatalf("main resolved to %s after it moved, want %s", got.Commit, after)
	}
	var buf bytes.Buffer
	if err := s.Archive(t.Context(), repo, before.Commit, &buf); err != nil || buf.Len() == 0 {
		t.Fatalf("the commit a job resolved to was lost from the mirror: %v", err)
	}
}

func TestSealedEnvironment(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	// A global config and GIT_* variables around the authority must not
	// reach git: this one would send every file:// fetch nowhere.
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[url \"file:///nonexistent/\"]\n\tinsteadOf = file://\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", home)
	t.Setenv("GIT_DIR", "/nonexistent")
	t.Setenv("GIT_CONFIG_PARAMETERS", "'protocol.allow'='always'")
	for kind, repo := range repos(r) {
		if _, err := s.Resolve(t.Context(), repo, "main"); err != nil {
			t.Errorf("%s: the authority's environment leaked into git: %v", kind, err)
		}
	}
	marker := filepath.Join(t.TempDir(), "pwned")
	ext := policy.Repository{Tenant: "dev", Name: "ext", URL: "ext::sh -c touch% " + marker}
	if _, err := s.Resolve(t.Context(), ext, "main"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("ext:: transport: %v, want a refused fetch", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("git ran a command through the ext:: transport")
	}
}

// TestCredentialNeverLeaks fetches with a credential, once successfully and
// once from a missing origin, through a git wrapper that records every
// command line, and checks that the secret appears nowhere: not in errors,
// logs, argv or the mirror on disk.
func TestCredentialNeverLeaks(t *testing.T) {
	r := newRepo(t)
	const secret = "s3cr3t-t0ken-value-9f8e7d"
	credFile := filepath.Join(t.TempDir(), "demo.token")
	if err := os.WriteFile(credFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	realGit, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	wrapDir := t.TempDir()
	argvLog := filepath.Join(wrapDir, "argv.log")
	envLog := filepath.Join(wrapDir, "env.log")
	script := "#!/bin/sh\nprintf '%s\\n' \"$*\" >> " + argvLog + "\nenv >> " + envLog + "\nexec " + realGit + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(wrapDir, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", wrapDir+string(os.PathListSeparator)+os.Getenv("PATH"))

	s, logs, dir := newSource(t)
	good := policy.Repository{Tenant: "dev", Name: "demo", URL: "file://" + r.Dir, Credential: credFile}
	if _, err := s.Resolve(t.Context(), good, "main"); err != nil {
		t.Fatalf("fetch with a credential: %v", err)
	}
	// An origin whose main names a commit it does not hold: the ref
	// listing answers, the fetch of the commit fails.
	broken := filepath.Join(t.TempDir(), "broken.git")
	for _, d := range []string{"objects", "refs/heads"} {
		if err := os.MkdirAll(filepath.Join(broken, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range map[string]string{"HEAD": "ref: refs/heads/main\n", "refs/heads/main": strings.Repeat("1", 40) + "\n"} {
		if err := os.WriteFile(filepath.Join(broken, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad := policy.Repository{Tenant: "dev", Name: "gone", URL: "file://" + broken, Credential: credFile}
	_, err = s.Resolve(t.Context(), bad, "main")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("fetch from a missing origin: %v, want unavailable", err)
	}
	if _, err := s.Resolve(t.Context(), good, "no-such-branch"); err == nil {
		t.Fatal("resolved a missing branch")
	}

	forms := []string{secret, base64.StdEncoding.EncodeToString([]byte("x-access-token:" + secret))}
	check := func(what, text string) {
		t.Helper()
		for _, f := range forms {
			if strings.Contains(text, f) {
				t.Errorf("the credential (%q) appears in %s", f, what)
			}
		}
	}
	check("an error", err.Error())
	check("the log", logs.String())
	argv, _ := os.ReadFile(argvLog)
	check("git's command line", string(argv))
	if !strings.Contains(string(argv), "fetch") {
		t.Fatalf("the wrapper saw no fetch; the test is not testing anything:\n%s", argv)
	}
	env, _ := os.ReadFile(envLog)
	if !strings.Contains(string(env), "Authorization: Basic "+forms[1]) {
		t.Errorf("git was not given the credential through its environment")
	}
	if !strings.Contains(logs.String(), "git failed") {
		t.Errorf("the failed fetch was not logged:\n%s", logs.String())
	}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			data, _ := os.ReadFile(path)
			check(path, string(data))
		}
		return nil
	})
}

// TestArchiveIgnoresAttributes checks that an archive is the commit's tree
// exactly, even when the repository's attributes would have git archive
// drop, rewrite or convert files: the executor checks the staged tree
// against the tree hash and would refuse anything else.
func TestArchiveIgnoresAttributes(t *testing.T) {
	r := newRepo(t)
	r.Write(".gitattributes", "secret.txt export-ignore\nsub.txt export-subst\nid.txt ident\n*.txt text eol=crlf\n")
	r.Write("secret.txt", "kept\n")
	r.Write("sub.txt", "$Format:%H$\n")
	r.Write("id.txt", "$Id$\n")
	commit := r.Commit("attributes")
	s, _, _ := newSource(t)
	for kind, repo := range repos(r) {
		t.Run(kind, func(t *testing.T) {
			res, err := s.Resolve(t.Context(), repo, "main")
			if err != nil || res.Commit != commit {
				t.Fatalf("Resolve: %v %v", res, err)
			}
			var buf bytes.Buffer
			if err := s.Archive(t.Context(), repo, commit, &buf); err != nil {
				t.Fatal(err)
			}
			out := gittest.At(t, t.TempDir())
			cmd := exec.Command("tar", "-x", "-C", out.Dir)
			cmd.Stdin = &buf
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("tar: %v\n%s", err, b)
			}
			out.Run("init", "-q")
			out.Run("-c", "core.autocrlf=false", "add", "-A")
			if got := strings.TrimSpace(out.Run("write-tree")); got != res.Tree {
				t.Fatalf("the extracted archive's tree is %s, the commit's is %s", got, res.Tree)
			}
		})
	}
	for _, f := range []string{"info/attributes", "objects/info/alternates"} {
		if _, err := os.Stat(filepath.Join(r.Dir, ".git", f)); err == nil {
			t.Errorf("the authority wrote %s into the tenant's repository", f)
		}
	}
}

// TestLinkedWorktree reads a repository configured as a linked worktree,
// whose .git is a file and whose objects live in the main repository.
func TestLinkedWorktree(t *testing.T) {
	r := newRepo(t)
	wt := filepath.Join(t.TempDir(), "wt")
	r.Run("worktree", "add", "-q", wt, "feature")
	s, _, _ := newSource(t)
	repo := policy.Repository{Tenant: "dev", Name: "wt", URL: wt}
	res, err := s.Resolve(t.Context(), repo, "HEAD")
	if err != nil || res.Commit != r.RevParse("feature") {
		t.Fatalf("Resolve(HEAD) in a worktree = %v, %v; want feature's commit", res, err)
	}
	var buf bytes.Buffer
	if err := s.Archive(t.Context(), repo, res.Commit, &buf); err != nil {
		t.Fatal(err)
	}
	if want := r.Run("archive", "--format=tar", res.Commit); buf.String() != want {
		t.Fatalf("archive from a worktree differs from git archive")
	}
}
