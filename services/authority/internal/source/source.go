// Package source owns the authority's read access to tenants' repositories:
// resolving a revision to a full commit and its tree, and streaming the
// commit's tree as a tar archive for FetchSource.
//
// A submission resolves in-process, with no git process: refs are read in
// place (a local path or file:// URL) or listed with one smart-HTTP request
// over a pooled connection (https), and commits are read from the object
// store (package gitobj). git runs only where it must write or pack: to
// fetch a commit a mirror lacks, and to make archives and history packs.
// It runs in a sealed environment (no system or global config, no prompts,
// an empty HOME, only the file and https protocols). Local paths are read
// in place; URLs are fetched into a bare mirror in the data directory. The
// repository's credential goes to git through the environment
// (http.extraHeader in GIT_CONFIG_*) and to the ref listing as a request
// header, never on a command line, in a URL or in a config file, and never
// in an error, a log line or anything the executor receives; an https
// server's certificate is checked against the repository's CA bundle when
// it names one, and no redirect is followed. Only the authority's jobs
// domain uses it, through its own interface.
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
	"github.com/airlockhq/airlock/pkg/gitobj"
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

	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	stores map[string]*gitobj.Store

	http     httpRemotes
	listings flights[refs]
	fetches  flights[struct{}]
}

// New returns a Source keeping its mirrors and git's empty HOME under dir.
func New(dir string, logger *slog.Logger) (*Source, error) {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Source{
		mirrors: filepath.Join(dir, "mirrors"), shadows: filepath.Join(dir, "shadows"), home: filepath.Join(dir, "home"),
		logger: logger, locks: map[string]*sync.Mutex{}, stores: map[string]*gitobj.Store{}, maxHistory: MaxHistoryBytes,
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

// Resolve turns rev into a full commit SHA and its tree hash, in-process:
// no git process runs. A local repository is read in place. For a URL
// repository a name (branch, tag, HEAD) is resolved where it is now on the
// remote, with one request (git ls-remote's), and the commit is read from
// the mirror; a full SHA needs no request at all. Only a commit the mirror
// does not hold yet is fetched (by git, once, whoever else waits for it).
func (s *Source) Resolve(ctx context.Context, repo policy.Repository, rev string) (Revision, error) {
	if err := CheckRevision(rev); err != nil {
		return Revision{}, err
	}
	if repo.IsLocal() {
		gitDir, err := localGitDir(repo.URL)
		if err != nil {
			return Revision{}, fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
		}
		var r refs
		if !isFullSHA(strings.ToLower(rev)) {
			if r, err = readLocalRefs(gitDir); err != nil {
				return Revision{}, fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
			}
		}
		return s.resolveIn(ctx, repo, gitDir, r, rev, nil)
	}
	dir, unlock, err := s.open(ctx, repo)
	if err != nil {
		return Revision{}, err
	}
	unlock()
	var rv Revision
	for attempt := 0; ; attempt++ {
		var r refs
		if !isFullSHA(strings.ToLower(rev)) {
			if r, err = s.remoteRefs(ctx, repo); err != nil {
				return Revision{}, err
			}
		}
		fetched := false
		rv, err = s.resolveIn(ctx, repo, dir, r, rev, func(id string) error {
			fetched = true
			return s.fetchFor(ctx, repo, dir, id)
		})
		// A branch that moved again between the listing and the fetch
		// names a commit the fetch did not bring: list it once more.
		if err == nil || !fetched || attempt > 0 || isFullSHA(strings.ToLower(rev)) || !errors.Is(err, ErrUnknownRevision) {
			break
		}
	}
	if err != nil {
		return Revision{}, err
	}
	// Keep the commit in the mirror even if its branch is rewritten and
	// pruned before the executor fetches it.
	if err := keepRef(dir, rv.Commit); err != nil {
		return Revision{}, err
	}
	return rv, nil
}

// resolveIn resolves rev against refs r and the objects of gitDir. fetch,
// when set, brings an object the directory lacks ("" for "whatever the
// remote has") before resolveIn gives up on it.
func (s *Source) resolveIn(ctx context.Context, repo policy.Repository, gitDir string, r refs, rev string, fetch func(id string) error) (Revision, error) {
	store, err := s.objects(gitDir)
	if err != nil {
		return Revision{}, fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
	}
	unknown := func(why string) error {
		return fmt.Errorf("%w: %q in repository %q%s", ErrUnknownRevision, rev, repo.Name, why)
	}
	// git takes a SHA in either case.
	id, hex := rev, strings.ToLower(rev)
	if isFullSHA(hex) {
		id = hex
	} else {
		named, ok := r.lookup(rev)
		switch {
		case ok:
			id = named
		case isHexPrefix(hex):
			ids, err := commitishPrefix(store, hex)
			if err != nil {
				return Revision{}, fmt.Errorf("source: repository %q: %w", repo.Name, err)
			}
			if len(ids) == 0 && fetch != nil {
				if err := fetch(""); err != nil {
					return Revision{}, err
				}
				if ids, err = commitishPrefix(store, hex); err != nil {
					return Revision{}, fmt.Errorf("source: repository %q: %w", repo.Name, err)
				}
			}
			switch len(ids) {
			case 0:
				return Revision{}, unknown("")
			case 1:
				id = ids[0]
			default:
				return Revision{}, unknown(": the abbreviation is ambiguous; give more of the SHA")
			}
		default:
			return Revision{}, unknown("")
		}
	}
	rv, err := peelCommit(store, id)
	if errors.Is(err, gitobj.ErrNotFound) && fetch != nil {
		if err := fetch(id); err != nil {
			return Revision{}, err
		}
		rv, err = peelCommit(store, id)
	}
	switch {
	case errors.Is(err, gitobj.ErrNotFound):
		return Revision{}, unknown("")
	case errors.Is(err, errNotCommit):
		return Revision{}, unknown(": " + err.Error())
	case err != nil:
		return Revision{}, fmt.Errorf("source: repository %q: %w", repo.Name, err)
	}
	return rv, nil
}

// maxCommitBytes bounds a commit or tag object read to resolve a revision
// (and so, through gitobj, a delta base it is rebuilt from to 64 MiB).
const maxCommitBytes = 1 << 20

// commitishPrefix returns the commits and tags whose ids start with prefix,
// as rev^{commit} disambiguates: a blob or tree sharing the prefix does
// not make it ambiguous.
func commitishPrefix(store *gitobj.Store, prefix string) ([]string, error) {
	ids, err := store.Prefix(prefix, 16)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		typ, _, err := store.Read(id, maxCommitBytes)
		switch {
		case errors.Is(err, gitobj.ErrTooLarge):
			continue // no commit or tag this package would read
		case err != nil:
			return nil, err
		case typ == "commit" || typ == "tag":
			out = append(out, id)
		}
	}
	return out, nil
}

var errNotCommit = errors.New("names no commit")

// peelCommit follows id through annotated tags to a commit and reads its
// tree, as rev^{commit} does.
func peelCommit(store *gitobj.Store, id string) (Revision, error) {
	for range 16 {
		typ, data, err := store.Read(id, maxCommitBytes)
		if err != nil {
			return Revision{}, err
		}
		switch typ {
		case "commit":
			tree, ok := header(data, "tree")
			if !ok || !isFullSHA(tree) {
				return Revision{}, fmt.Errorf("commit %s has no tree line", id)
			}
			return Revision{Commit: id, Tree: tree}, nil
		case "tag":
			target, ok := header(data, "object")
			if !ok || !isFullSHA(target) {
				return Revision{}, fmt.Errorf("tag %s has no object line", id)
			}
			id = target
		default:
			return Revision{}, fmt.Errorf("%w: it names a %s", errNotCommit, typ)
		}
	}
	return Revision{}, fmt.Errorf("%w: tags nested too deep", errNotCommit)
}

// header returns the value of an object header line ("tree ID") before
// the first blank line.
func header(data []byte, key string) (string, bool) {
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			return "", false
		}
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return v, true
		}
	}
	return "", false
}

func isHexPrefix(s string) bool {
	if len(s) < 4 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !('0' <= r && r <= '9') && !('a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// objects returns the object store of gitDir (a linked worktree's is its
// common directory's). A store is kept open and made again when the
// directory's alternates change (a local repository moved, or its owner
// borrowed objects from elsewhere).
func (s *Source) objects(gitDir string) (*gitobj.Store, error) {
	common, err := commonDir(gitDir)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(common, "objects")
	alt, err := gitobj.ReadFile(filepath.Join(dir, "info", "alternates"), maxRefFileBytes)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("alternates: %v", err)
	}
	key := dir + "\x00" + string(alt)
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.stores[key]; ok {
		return st, nil
	}
	st, err := gitobj.Open(dir)
	if err != nil {
		return nil, err
	}
	for k, old := range s.stores {
		if strings.HasPrefix(k, dir+"\x00") {
			old.Close() // reads under way finish with the files they hold
			delete(s.stores, k)
		}
	}
	s.stores[key] = st
	return st, nil
}

// fetchFor fetches the mirror dir unless it already holds id. Concurrent
// submissions that need a fetch share one that started after they asked
// (flights): 8 submissions of a branch that moved fetch once, and a caller
// sending unknown SHAs over and over queues at most one fetch behind the
// one running. Each waits under its own context.
func (s *Source) fetchFor(ctx context.Context, repo policy.Repository, dir, id string) error {
	fetch := func(fctx context.Context) (struct{}, error) {
		lock := s.lock(dir)
		lock.Lock()
		defer lock.Unlock()
		return struct{}{}, s.fetch(fctx, repo, dir)
	}
	if id != "" {
		store, err := s.objects(dir)
		if err != nil {
			return fmt.Errorf("source: repository %q: %w", repo.Name, err)
		}
		// A fetch already running may bring it: wait for it and look
		// again. None running, this caller starts one, in the same step
		// (runningOrStart), so callers that ask together fetch once.
		for range 2 {
			if ok, err := store.Has(id); err == nil && ok {
				return nil
			}
			c, started := s.fetches.runningOrStart(dir, 10*time.Minute, fetch)
			_, err := c.await(ctx)
			if started {
				return err // its own fetch, which started after it asked
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if ok, err := store.Has(id); err == nil && ok {
			return nil
		}
	}
	// One that started after this caller asked, shared with every caller
	// that asked meanwhile.
	_, err := s.fetches.do(ctx, dir, 10*time.Minute, fetch)
	return err
}

// keepRef records refs/airlock/keep/COMMIT in the mirror dir, as a loose
// ref written whole (by rename) once: git keeps what a ref reaches, and no
// fetch prunes outside refs/heads and refs/tags.
func keepRef(dir, commit string) error {
	p := filepath.Join(dir, "refs", "airlock", "keep", commit)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	return writeIfChanged(p, commit+"\n")
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
	store, err := s.objects(gitDir)
	if err != nil {
		return "", fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
	}
	if ok, err := store.Has(commit); err != nil {
		return "", fmt.Errorf("source: repository %q: %w", repo.Name, err)
	} else if !ok {
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
	store, err := s.objects(gitDir)
	if err != nil {
		return nil, fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
	}
	typ, data, err := store.Read(commit, maxCommitBytes)
	if err != nil {
		return nil, fmt.Errorf("source: repository %q: commit %s: %w", repo.Name, commit, err)
	}
	if typ != "commit" {
		return nil, fmt.Errorf("%w: %s in repository %q is a %s, not a commit", errdefs.ErrInvalidArgument, commit, repo.Name, typ)
	}
	return data, nil
}

// archiveDir returns the authority's own git directory to archive repo's
// commits from, making it if needed.
func (s *Source) archiveDir(ctx context.Context, repo policy.Repository) (string, error) {
	if !repo.IsLocal() {
		dir, unlock, err := s.open(ctx, repo)
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
	if gitDir, err = commonDir(gitDir); err != nil {
		return "", fmt.Errorf("%w: repository %q: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
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
// mirror if needed; the returned unlock ends the mirror's exclusive use.
func (s *Source) open(ctx context.Context, repo policy.Repository) (string, func(), error) {
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
		data, err := gitobj.ReadFile(dotGit, maxRefFileBytes)
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
