// Package source owns the authority's read access to tenants' repositories:
// resolving a revision to a full commit and its tree, and streaming the
// commit's tree as a tar archive for FetchSource. It runs git as a
// subprocess in a sealed environment (no system or global config, no
// prompts, an empty HOME, only the file and https protocols). Local paths
// are read in place; URLs are fetched into a bare mirror in the data
// directory, with the repository's credential handed to git through the
// environment (http.extraHeader in GIT_CONFIG_*), never on a command line,
// in a URL or in a config file, and never in an error, a log line or
// anything the executor receives; an https server's certificate is checked
// against the repository's CA bundle when it names one. Only the
// authority's jobs domain uses it, through its own interface.
package source

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitcmd"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// Errors callers test with errors.Is. Both also wrap
// errdefs.ErrInvalidArgument.
var (
	// ErrBadRevision is a revision this package refuses to hand to git.
	ErrBadRevision = fmt.Errorf("%w: not an acceptable revision", errdefs.ErrInvalidArgument)
	// ErrUnknownRevision is a revision that names no commit.
	ErrUnknownRevision = fmt.Errorf("%w: revision does not resolve to a commit", errdefs.ErrInvalidArgument)
)

// Revision is what a revision resolved to.
type Revision struct {
	// Commit is the full commit SHA.
	Commit string
	// Tree is the commit's tree hash.
	Tree string
}

// Source reads repositories. It is safe for concurrent use.
type Source struct {
	mirrors string
	shadows string
	home    string
	logger  *slog.Logger
	// maxHistory is MaxHistoryBytes but in tests.
	maxHistory int64

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// New returns a Source keeping its mirrors and git's empty HOME under dir.
func New(dir string, logger *slog.Logger) (*Source, error) {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Source{
		mirrors: filepath.Join(dir, "mirrors"), shadows: filepath.Join(dir, "shadows"), home: filepath.Join(dir, "home"),
		logger: logger, locks: map[string]*sync.Mutex{}, maxHistory: MaxHistoryBytes,
	}
	for _, d := range []string{s.mirrors, s.shadows, s.home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("source: %w", err)
		}
	}
	if _, err := exec.LookPath("git"); err != nil {
		return nil, fmt.Errorf("source: git is required: %w", err)
	}
	return s, nil
}

// CheckRevision refuses what must never reach git's command line: option
// look-alikes (argument injection), and revision syntax beyond a plain
// branch, tag or SHA (ranges, reflog, paths, parent walks).
func CheckRevision(rev string) error {
	switch {
	case rev == "":
		return fmt.Errorf("%w: empty", ErrBadRevision)
	case strings.HasPrefix(rev, "-"):
		return fmt.Errorf("%w: must not start with '-'", ErrBadRevision)
	case len(rev) > 255:
		return fmt.Errorf("%w: longer than 255 characters", ErrBadRevision)
	case strings.Contains(rev, ".."), strings.Contains(rev, "@{"), strings.Contains(rev, "//"),
		strings.HasSuffix(rev, "/"), strings.HasSuffix(rev, ".lock"), strings.HasPrefix(rev, "/"):
		return fmt.Errorf("%w: %q is not a branch, tag or commit SHA", ErrBadRevision, rev)
	}
	for _, r := range rev {
		if r <= ' ' || r == 0x7f || strings.ContainsRune(`~^:?*[\`, r) {
			return fmt.Errorf("%w: %q has %q; give a branch, tag or commit SHA", ErrBadRevision, rev, r)
		}
	}
	return nil
}

// Resolve turns rev into a full commit SHA and its tree hash. A URL
// repository is fetched first, so a branch resolves to where it is now.
func (s *Source) Resolve(ctx context.Context, repo policy.Repository, rev string) (Revision, error) {
	if err := CheckRevision(rev); err != nil {
		return Revision{}, err
	}
	gitDir, unlock, err := s.open(ctx, repo, true)
	if err != nil {
		return Revision{}, err
	}
	defer unlock()
	if rev == "HEAD" && !repo.IsLocal() {
		if err := s.followHead(ctx, repo, gitDir); err != nil {
			return Revision{}, err
		}
	}
	commit, err := s.revParse(ctx, repo, gitDir, rev+"^{commit}")
	if err != nil {
		return Revision{}, err
	}
	tree, err := s.revParse(ctx, repo, gitDir, commit+"^{tree}")
	if err != nil {
		return Revision{}, err
	}
	if !repo.IsLocal() {
		// Keep the commit in the mirror even if its branch is rewritten
		// and pruned before the executor fetches it.
		if _, err := s.git(ctx, repo, gitDir, nil, nil, "update-ref", "refs/airlock/keep/"+commit, commit); err != nil {
			return Revision{}, err
		}
	}
	return Revision{Commit: commit, Tree: tree}, nil
}

func (s *Source) revParse(ctx context.Context, repo policy.Repository, gitDir, expr string) (string, error) {
	out, err := s.git(ctx, repo, gitDir, nil, nil, "rev-parse", "--verify", "--quiet", "--end-of-options", expr)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return "", fmt.Errorf("%w: %q in repository %q", ErrUnknownRevision, strings.TrimSuffix(expr, "^{commit}"), repo.Name)
	}
	if err != nil {
		return "", err
	}
	sha := strings.TrimSpace(string(out))
	if !isFullSHA(sha) {
		return "", fmt.Errorf("source: rev-parse printed %q", sha)
	}
	return sha, nil
}

// Archive writes `git archive --format=tar <commit>` to w. commit must be a
// full SHA this package resolved.
//
// The archive is the commit's tree exactly, whatever the repository's
// attributes say: git archive would otherwise drop export-ignore paths,
// expand export-subst and ident, and convert line endings, and the
// executor, which checks the staged tree against the tree hash, would
// refuse it. So it runs in a git directory of the authority's own whose
// info/attributes (which outranks every .gitattributes) turns all of that
// off: the mirror itself for a URL, and for a local path a "shadow" that
// borrows the repository's objects through alternates without writing to
// it.
func (s *Source) Archive(ctx context.Context, repo policy.Repository, commit string, w io.Writer) error {
	if !isFullSHA(commit) {
		return fmt.Errorf("%w: commit %q is not a full SHA", errdefs.ErrInvalidArgument, commit)
	}
	gitDir, err := s.commitDir(ctx, repo, commit)
	if err != nil {
		return err
	}
	_, err = s.git(ctx, repo, gitDir, nil, w, "archive", "--format=tar", "--end-of-options", commit)
	return err
}

// commitDir returns the git directory to read commit from, fetching again
// if the mirror lost it.
func (s *Source) commitDir(ctx context.Context, repo policy.Repository, commit string) (string, error) {
	gitDir, err := s.archiveDir(ctx, repo)
	if err != nil {
		return "", err
	}
	if _, err := s.git(ctx, repo, gitDir, nil, nil, "cat-file", "-e", "--end-of-options", commit+"^{commit}"); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return "", err
		}
		if repo.IsLocal() {
			return "", fmt.Errorf("%w: commit %s is no longer in repository %q", errdefs.ErrFailedPrecondition, commit, repo.Name)
		}
		// The mirror may have been lost with the data directory; fetch
		// again before giving up.
		if _, err := s.Resolve(ctx, repo, commit); err != nil {
			return "", fmt.Errorf("%w: commit %s is no longer in repository %q", errdefs.ErrFailedPrecondition, commit, repo.Name)
		}
	}
	return gitDir, nil
}

// CommitObject returns commit's commit object as git stores it (the bytes
// git cat-file commit prints), for the job's own .git.
func (s *Source) CommitObject(ctx context.Context, repo policy.Repository, commit string) ([]byte, error) {
	if !isFullSHA(commit) {
		return nil, fmt.Errorf("%w: commit %q is not a full SHA", errdefs.ErrInvalidArgument, commit)
	}
	gitDir, err := s.commitDir(ctx, repo, commit)
	if err != nil {
		return nil, err
	}
	return s.git(ctx, repo, gitDir, nil, nil, "cat-file", "commit", commit)
}

// archiveDir returns the authority's own git directory to archive repo's
// commits from, making it if needed.
func (s *Source) archiveDir(ctx context.Context, repo policy.Repository) (string, error) {
	if !repo.IsLocal() {
		dir, unlock, err := s.open(ctx, repo, false)
		if err != nil {
			return "", err
		}
		unlock()
		return dir, nil
	}
	gitDir, err := localGitDir(repo.URL)
	if err != nil {
		return "", fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
	}
	// A linked worktree's objects live in its common directory.
	if data, err := os.ReadFile(filepath.Join(gitDir, "commondir")); err == nil {
		common := strings.TrimSpace(string(data))
		if !filepath.IsAbs(common) {
			common = filepath.Join(gitDir, common)
		}
		gitDir = common
	}
	objects, err := filepath.Abs(filepath.Join(gitDir, "objects"))
	if err != nil {
		return "", fmt.Errorf("source: %w", err)
	}
	sum := sha256.Sum256([]byte(repo.URL))
	dir := filepath.Join(s.shadows, repo.Tenant, repo.Name+"-"+hex.EncodeToString(sum[:6])+".git")
	lock := s.lock(dir)
	lock.Lock()
	defer lock.Unlock()
	if err := s.initBare(ctx, repo, dir); err != nil {
		return "", err
	}
	// Checked every time, in case the repository moved. Alternates are
	// read-only use of its objects.
	if err := writeIfChanged(filepath.Join(dir, "objects", "info", "alternates"), objects+"\n"); err != nil {
		return "", err
	}
	return dir, nil
}

// writeIfChanged replaces path's content by rename, and only when it
// differs, so a git process reading it at the same time never sees it
// half written.
func writeIfChanged(path, content string) error {
	if old, err := os.ReadFile(path); err == nil && string(old) == content {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("source: %w", err)
	}
	return nil
}

// initBare makes an empty bare repository at dir, if there is none, with
// attributes that keep archives equal to their trees.
func (s *Source) initBare(ctx context.Context, repo policy.Repository, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); err != nil {
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return fmt.Errorf("source: %w", err)
		}
		if _, err := s.git(ctx, repo, "", nil, nil, "init", "--quiet", "--bare", "--template=", dir); err != nil {
			return err
		}
	}
	for _, d := range []string{filepath.Join(dir, "info"), filepath.Join(dir, "objects", "info")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("source: %w", err)
		}
	}
	return writeIfChanged(filepath.Join(dir, "info", "attributes"), gitcmd.PlainAttributes)
}

// open returns the git directory to read repo from. For a URL it makes the
// mirror if needed and, when fetch is set, fetches into it; the returned
// unlock ends the mirror's exclusive use.
func (s *Source) open(ctx context.Context, repo policy.Repository, fetch bool) (string, func(), error) {
	if repo.IsLocal() {
		dir, err := localGitDir(repo.URL)
		if err != nil {
			return "", nil, fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
		}
		return dir, func() {}, nil
	}
	dir := s.mirrorDir(repo)
	lock := s.lock(dir)
	lock.Lock()
	if err := s.initBare(ctx, repo, dir); err != nil {
		lock.Unlock()
		return "", nil, err
	}
	if fetch {
		if err := s.fetch(ctx, repo, dir); err != nil {
			lock.Unlock()
			return "", nil, err
		}
	}
	return dir, lock.Unlock, nil
}

// remoteConfig is the config a command that talks to repo's URL gets on
// top of the sealed one: the credential, as an HTTP header, through the
// environment only.
func remoteConfig(repo policy.Repository) ([][2]string, error) {
	if repo.Credential == "" {
		return nil, nil
	}
	header, err := authHeader(repo.Credential)
	if err != nil {
		// The path is configuration, not a secret; the content never
		// appears in err.
		return nil, fmt.Errorf("%w: repository %q: credential: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
	}
	return [][2]string{{"http.extraHeader", header}}, nil
}

func (s *Source) fetch(ctx context.Context, repo policy.Repository, dir string) error {
	cfg, err := remoteConfig(repo)
	if err != nil {
		return err
	}
	start := time.Now()
	_, err = s.git(ctx, repo, dir, cfg, nil, "fetch", "--quiet", "--prune", "--force", "--no-tags", "--no-write-fetch-head",
		"--end-of-options", repo.URL, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: repository %q could not be fetched", errdefs.ErrUnavailable, repo.Name)
	}
	s.logger.Debug("fetched repository", "tenant", repo.Tenant, "repository", repo.Name, "duration", time.Since(start))
	return nil
}

// followHead points the mirror's HEAD at the branch the remote's HEAD
// names, so that "HEAD" means in a mirror what it means in a local
// repository: the default branch, as it is now. A remote whose HEAD names
// no branch leaves the mirror's HEAD as it was.
func (s *Source) followHead(ctx context.Context, repo policy.Repository, dir string) error {
	cfg, err := remoteConfig(repo)
	if err != nil {
		return err
	}
	out, err := s.git(ctx, repo, dir, cfg, nil, "ls-remote", "--symref", "--end-of-options", repo.URL, "HEAD")
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: repository %q could not be reached", errdefs.ErrUnavailable, repo.Name)
	}
	for line := range strings.Lines(string(out)) {
		target, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "ref: ")
		if !ok {
			continue
		}
		ref, name, ok := strings.Cut(target, "\t")
		branch, isBranch := strings.CutPrefix(ref, "refs/heads/")
		if !ok || name != "HEAD" || !isBranch || CheckRevision(branch) != nil {
			continue
		}
		_, err := s.git(ctx, repo, dir, nil, nil, "symbolic-ref", "HEAD", ref)
		return err
	}
	return nil
}

func (s *Source) mirrorDir(repo policy.Repository) string {
	sum := sha256.Sum256([]byte(repo.URL))
	return filepath.Join(s.mirrors, repo.Tenant, repo.Name+"-"+hex.EncodeToString(sum[:6])+".git")
}

func (s *Source) lock(dir string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.locks[dir]
	if !ok {
		l = &sync.Mutex{}
		s.locks[dir] = l
	}
	return l
}

// localGitDir finds the git directory of a local repository without git's
// own discovery, which would walk up into parent directories.
func localGitDir(path string) (string, error) {
	dotGit := filepath.Join(path, ".git")
	if st, err := os.Stat(dotGit); err == nil {
		if st.IsDir() {
			return dotGit, nil
		}
		data, err := os.ReadFile(dotGit)
		if err != nil {
			return "", err
		}
		target, ok := strings.CutPrefix(strings.TrimSpace(string(data)), "gitdir: ")
		if !ok {
			return "", fmt.Errorf("%s is not a gitdir file", dotGit)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(path, target)
		}
		return target, nil
	}
	if st, err := os.Stat(filepath.Join(path, "objects")); err == nil && st.IsDir() {
		if _, err := os.Stat(filepath.Join(path, "HEAD")); err == nil {
			return path, nil
		}
	}
	return "", errors.New("not a git repository")
}

// authHeader turns the credential file into the HTTP header git sends:
// "user:secret" as HTTP Basic, a bare token as Basic with the user
// x-access-token, which GitHub and GitLab accept for tokens.
func authHeader(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return "", pe.Err
		}
		return "", errors.New("unreadable")
	}
	return gitcmd.AuthHeader(data)
}

// git runs git with GIT_DIR=gitDir (unless empty) in the sealed
// environment plus extra config, writing stdout to w when given and
// otherwise returning it. A failure's stderr goes to the log with the
// repository's credential removed; the returned error carries no git
// output at all.
func (s *Source) git(ctx context.Context, repo policy.Repository, gitDir string, extra [][2]string, w io.Writer, args ...string) ([]byte, error) {
	return s.gitInput(ctx, repo, gitDir, extra, nil, w, args...)
}

// command is git with args in the sealed environment, not yet started.
func (s *Source) command(ctx context.Context, repo policy.Repository, gitDir string, extra [][2]string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = s.env(gitDir, append(sealedConfig(repo, gitDir), extra...))
	cmd.Dir = s.home
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// gitInput is git with stdin.
func (s *Source) gitInput(ctx context.Context, repo policy.Repository, gitDir string, extra [][2]string, stdin io.Reader, w io.Writer, args ...string) ([]byte, error) {
	cmd := s.command(ctx, repo, gitDir, extra, args...)
	cmd.Stdin = stdin
	var stdout bytes.Buffer
	stderr := &limitedBuffer{max: 8 << 10}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if w != nil {
		cmd.Stdout = w
	}
	err := cmd.Run()
	if err != nil {
		msg := redact(repo, stderr.String())
		level := slog.LevelWarn
		if args[0] == "rev-parse" || args[0] == "cat-file" {
			level = slog.LevelDebug // an unknown revision is the caller's mistake
		}
		s.logger.Log(ctx, level, "git failed", "tenant", repo.Tenant, "repository", repo.Name, "command", args[0], "error", err, "stderr", msg)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil, exit
		}
		return nil, fmt.Errorf("source: git %s: %w", args[0], err)
	}
	return stdout.Bytes(), nil
}

// sealedConfig is the config every git command gets on top of nothing:
// only file and https transports, no automatic gc (it would drop kept
// commits' neighbours and stall requests), no credential helpers, no
// redirects that could carry the credential to another host, no
// fsmonitor command from a repository's own config, and the server's
// certificate always checked, against the repository's CA when it names
// one.
func sealedConfig(repo policy.Repository, gitDir string) [][2]string {
	cfg := append(gitcmd.RemoteConfig(repo.CA), [][2]string{
		{"gc.auto", "0"},
		{"maintenance.auto", "false"},
		{"core.fsmonitor", "false"},
		{"core.autocrlf", "false"},
		{"core.hooksPath", os.DevNull},
	}...)
	if repo.IsLocal() && gitDir != "" {
		cfg = append(cfg, [2]string{"safe.directory", gitDir}, [2]string{"safe.directory", repo.URL})
	}
	return cfg
}

// env is git's sealed environment (gitcmd.Env), with GIT_DIR when given
// and cfg passed where no command line shows it.
func (s *Source) env(gitDir string, cfg [][2]string) []string {
	env := gitcmd.Env(s.home)
	if gitDir != "" {
		env = append(env, "GIT_DIR="+gitDir)
	}
	return append(env, gitcmd.ConfigEnv(cfg)...)
}

// redact removes every form of the repository's credential from text.
func redact(repo policy.Repository, text string) string {
	if repo.Credential == "" {
		return text
	}
	data, err := os.ReadFile(repo.Credential)
	if err != nil {
		return text
	}
	secret := strings.TrimSpace(string(data))
	forms := []string{secret, "x-access-token:" + secret}
	if _, pass, ok := strings.Cut(secret, ":"); ok {
		forms = append(forms, pass)
	}
	for _, f := range forms {
		if f == "" {
			continue
		}
		text = strings.ReplaceAll(text, f, "[REDACTED]")
		text = strings.ReplaceAll(text, base64.StdEncoding.EncodeToString([]byte(f)), "[REDACTED]")
	}
	return text
}

func isFullSHA(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !('0' <= r && r <= '9') && !('a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string { return b.buf.String() }
