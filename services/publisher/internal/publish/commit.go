package publish

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitcmd"
	"github.com/airlockhq/airlock/pkg/ids"
)

// The commit an approval lands is made without a work tree: the patch is
// applied to an index read from the base commit (`git apply --cached`), so
// nothing the job wrote is ever checked out — no symlink is followed, no
// attribute or filter of the repository runs — and the commit is written
// from that index with fixed author, committer and times taken from the
// approval. The same approval on the same parent always yields the same
// commit id. On a branch that moved past the base, the change is merged
// onto the tip with the base as merge base, and the result is proved to
// be exactly the approved change (merge.go), never placed by context.

// Change is what one approval lands.
type Change struct {
	// Remote is the target repository's fetch and push URL; Branch the
	// protected branch.
	Remote, Branch string
	// Base is the commit the job ran on.
	Base string
	// Patch is the bundle's whole patch (git diff --binary, no renames).
	Patch []byte
	// JobID, BundleDigest and ApprovalID go into the trailers; Approvers
	// are the SPIFFE IDs of the approving votes.
	JobID, BundleDigest, ApprovalID string
	Approvers                       []string
	// At is when the approval was approved: the commit's author and
	// committer time.
	At time.Time
	// OnMoved says what to do when the branch has moved past Base: merge
	// onto its tip when the change merges exactly (OnMovedReapply, the
	// default) or refuse (OnMovedRefuse).
	OnMoved string
}

// What a change does when the branch moved past its base.
const (
	OnMovedReapply = "reapply"
	OnMovedRefuse  = "refuse"
)

// Author is the identity every published commit carries.
const (
	authorName  = "Airlock"
	authorEmail = "airlock@localhost"
)

// Prepared is a commit made for a change, not yet pushed.
type Prepared struct {
	Commit string
	// Parent is the commit it was made on: Base, or the branch's tip when
	// it moved and the patch was re-applied.
	Parent string
	// Tip is the branch's tip when it was fetched; a push must find it
	// still there.
	Tip string
}

// ErrMoved is a push that found the branch moved since it was fetched:
// prepare again against the new tip.
var ErrMoved = errors.New("the branch moved since it was fetched")

// Repo is a scratch bare repository the publisher prepares commits in.
type Repo struct {
	dir string
	// Env is added to every git run that talks to the remote: how the
	// credential reaches git (GIT_CONFIG_* variables), never arguments.
	env []string
}

// indexPrefix starts the names of the index files Prepare uses.
const indexPrefix = "airlock-index-"

// OpenRepo makes (or reuses) the scratch bare repository at dir. The
// caller holds dir alone (one process per data directory, one run per
// repository in it), so what a killed run left — its index files, git's
// lock files — is removed.

func OpenRepo(ctx context.Context, dir string) (*Repo, error) {
	r := &Repo{dir: dir}
	if err := removeLeftovers(dir); err != nil {
		return nil, err
	}
	if !gitcmd.Initialized(dir) {
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if _, err := r.git(ctx, nil, nil, "init", "-q", "--bare", "."); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// gitTimeout bounds one git run: a remote that hangs must not hold the
// repository's lock, and the run, for ever.
const gitTimeout = 10 * time.Minute

func (r *Repo) git(ctx context.Context, extraEnv []string, stdin []byte, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	c := gitcmd.Cmd{Dir: r.dir, Env: append(append(gitcmd.Env(r.dir), "GIT_DIR="+r.dir), extraEnv...), DieWithParent: true}
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	return c.Run(ctx, args...)
}

// trackingRef is where the remote branch is fetched to.
func trackingRef(branch string) string { return "refs/airlock/remote/" + branch }

var fullSHA = regexp.MustCompile(`^[0-9a-f]{40}$`)

// Fetch brings the remote branch (and its history) into the scratch
// repository and returns its tip. remoteEnv carries the read credential.
func (r *Repo) Fetch(ctx context.Context, remote, branch string, remoteEnv []string) (string, error) {
	if _, err := r.git(ctx, remoteEnv, nil, "fetch", "-q", "--no-tags", "--", remote, "+refs/heads/"+branch+":"+trackingRef(branch)); err != nil {
		return "", fmt.Errorf("%w: fetch %s of the target: %v", errdefs.ErrUnavailable, branch, err)
	}
	out, err := r.git(ctx, nil, nil, "rev-parse", "--verify", trackingRef(branch)+"^{commit}")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// Find looks for a commit carrying approval's trailer among the branch's
// last commits (as fetched): the one an earlier attempt landed.
func (r *Repo) Find(ctx context.Context, branch, approvalID string) (string, bool, error) {
	out, err := r.git(ctx, nil, nil, "log", "-n", "10000", "--format=%H %(trailers:key=Airlock-Approval,valueonly,separator=%x2C)", trackingRef(branch), "--")
	if err != nil {
		return "", false, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		commit, values, _ := strings.Cut(line, " ")
		for _, v := range strings.Split(values, ",") {
			if strings.TrimSpace(v) == approvalID && approvalID != "" {
				return commit, true, nil
			}
		}
	}
	return "", false, nil
}

// Prepare makes the commit for c on the fetched branch tip: on Base when
// the tip is Base, else re-applied on the tip (or refused, as c.OnMoved
// says). A patch that does not apply is refused naming the paths. Nothing
// is pushed.
func (r *Repo) Prepare(ctx context.Context, c Change, tip string) (Prepared, error) {
	if !fullSHA.MatchString(c.Base) || !fullSHA.MatchString(tip) {
		return Prepared{}, fmt.Errorf("%w: base %q and tip %q must be full commit ids", errdefs.ErrInvalidArgument, c.Base, tip)
	}
	parent := c.Base
	if tip != c.Base {
		if _, err := r.git(ctx, nil, nil, "merge-base", "--is-ancestor", c.Base, tip); err != nil {
			return Prepared{}, fmt.Errorf("%w: the approved base %s is not on branch %s (tip %s): it was rewritten", errdefs.ErrFailedPrecondition, c.Base, c.Branch, tip)
		}
		if c.OnMoved != "" && c.OnMoved != OnMovedReapply {
			return Prepared{}, fmt.Errorf("%w: branch %s moved from the approved base %s to %s, and the tenant's policy refuses to re-apply", errdefs.ErrFailedPrecondition, c.Branch, c.Base, tip)
		}
		parent = tip
	}
	tree, err := r.applyOnBase(ctx, c)
	if err != nil {
		return Prepared{}, err
	}
	if parent != c.Base {
		if tree, err = r.reapply(ctx, c, tip, tree); err != nil {
			return Prepared{}, err
		}
	}
	out, err := r.git(ctx, commitEnv(c), []byte(message(c)), "commit-tree", tree, "-p", parent, "-F", "-")
	if err != nil {
		return Prepared{}, err
	}
	return Prepared{Commit: strings.TrimSpace(string(out)), Parent: parent, Tip: tip}, nil
}

// applyOnBase returns the tree of c's patch applied on its base, where
// it was made: there every hunk's line numbers and context are exact.
func (r *Repo) applyOnBase(ctx context.Context, c Change) (string, error) {
	// An index of its own per attempt: one a killed git left locked
	// never blocks the next.
	index := filepath.Join(r.dir, indexPrefix+c.ApprovalID+"-"+ids.New()[:8])
	defer os.Remove(index)
	ienv := []string{"GIT_INDEX_FILE=" + index}
	if _, err := r.git(ctx, ienv, nil, "read-tree", c.Base); err != nil {
		return "", err
	}
	if len(c.Patch) > 0 {
		if _, err := r.git(ctx, ienv, c.Patch, "apply", "--cached", "--binary", "--whitespace=nowarn", "-"); err != nil {
			return "", fmt.Errorf("%w: the patch does not apply on its base %s: %s", errdefs.ErrFailedPrecondition, c.Base, conflictPaths(err))
		}
	}
	tree, err := r.git(ctx, ienv, nil, "write-tree")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(tree)), nil
}

// message is the commit message: a subject, and the trailers that link
// the commit to its job, bundle, approval and approvers.
func message(c Change) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Airlock: land job %s\n\n", c.JobID)
	fmt.Fprintf(&b, "Airlock-Job: %s\n", c.JobID)
	fmt.Fprintf(&b, "Airlock-Bundle: %s\n", c.BundleDigest)
	fmt.Fprintf(&b, "Airlock-Approval: %s\n", c.ApprovalID)
	approvers := append([]string(nil), c.Approvers...)
	sort.Strings(approvers)
	for _, a := range approvers {
		fmt.Fprintf(&b, "Approved-by: %s\n", a)
	}
	return b.String()
}

// conflictPaths names the paths git apply could not patch.
func conflictPaths(err error) string {
	var ge *gitcmd.Error
	if !errors.As(err, &ge) {
		return err.Error()
	}
	var paths []string
	for _, line := range strings.Split(ge.Stderr, "\n") {
		switch {
		case strings.HasPrefix(line, "error: patch failed: "):
			p := strings.TrimPrefix(line, "error: patch failed: ")
			if i := strings.LastIndexByte(p, ':'); i > 0 {
				p = p[:i]
			}
			paths = append(paths, p)
		case strings.HasSuffix(line, ": does not exist in index"):
			paths = append(paths, strings.TrimSuffix(strings.TrimPrefix(line, "error: "), ": does not exist in index"))
		case strings.HasSuffix(line, ": already exists in index"):
			paths = append(paths, strings.TrimSuffix(strings.TrimPrefix(line, "error: "), ": already exists in index"))
		}
	}
	if len(paths) == 0 {
		return ge.Stderr
	}
	return "conflicting paths: " + strings.Join(paths, ", ")
}

// Push sends p's commit to the branch without force: the remote takes it
// only as a fast-forward of what it has, which is its compare-and-swap. A
// branch that moved meanwhile is ErrMoved (prepare again on the new tip).
// remoteEnv carries the deploy credential.
func (r *Repo) Push(ctx context.Context, remote, branch string, p Prepared, remoteEnv []string) error {
	// The lease names the tip the commit was made on: a branch moved (or
	// rewound) since is refused, not fast-forwarded from elsewhere.
	_, err := r.git(ctx, remoteEnv, nil, "push", "-q", "--force-with-lease=refs/heads/"+branch+":"+p.Tip, "--", remote, p.Commit+":refs/heads/"+branch)
	if err == nil {
		return nil
	}
	var ge *gitcmd.Error
	if errors.As(err, &ge) && (strings.Contains(ge.Stderr, "non-fast-forward") || strings.Contains(ge.Stderr, "fetch first") ||
		strings.Contains(ge.Stderr, "[rejected]") || strings.Contains(ge.Stderr, "stale info")) {
		return fmt.Errorf("%w: %s", ErrMoved, ge.Stderr)
	}
	return fmt.Errorf("%w: push to %s: %v", errdefs.ErrUnavailable, branch, err)
}

// Tree lists the tree of commit as the content checks read it: every
// entry's path and mode, and each symlink's target.
func (r *Repo) Tree(ctx context.Context, commit string) ([]contentcheck.TreeEntry, error) {
	out, err := r.git(ctx, nil, nil, "ls-tree", "-r", "-z", "--full-tree", commit)
	if err != nil {
		return nil, err
	}
	var (
		entries []contentcheck.TreeEntry
		links   []int
		batch   bytes.Buffer
	)
	for _, rec := range bytes.Split(out, []byte{0}) {
		meta, path, ok := bytes.Cut(rec, []byte{'\t'})
		if !ok {
			continue
		}
		f := strings.Fields(string(meta))
		if len(f) != 3 {
			return nil, fmt.Errorf("publish: ls-tree: unexpected line %q", meta)
		}
		mode, err := strconv.ParseUint(f[0], 8, 32)
		if err != nil {
			return nil, fmt.Errorf("publish: ls-tree: mode %q", f[0])
		}
		if mode == 0o120000 {
			links = append(links, len(entries))
			batch.WriteString(f[2] + "\n")
		}
		entries = append(entries, contentcheck.TreeEntry{Path: string(path), Mode: uint32(mode)})
	}
	if len(links) > 0 {
		out, err := r.git(ctx, nil, batch.Bytes(), "cat-file", "--batch")
		if err != nil {
			return nil, err
		}
		for _, i := range links {
			header, rest, ok := bytes.Cut(out, []byte{'\n'})
			f := strings.Fields(string(header))
			if !ok || len(f) != 3 {
				return nil, fmt.Errorf("publish: cat-file: unexpected header %q", header)
			}
			n, err := strconv.Atoi(f[2])
			if err != nil || n+1 > len(rest) {
				return nil, fmt.Errorf("publish: cat-file: bad size %q", f[2])
			}
			entries[i].Target = string(rest[:n])
			out = rest[n+1:]
		}
	}
	return entries, nil
}

// Changed returns the sorted paths commit changes against parent.
func (r *Repo) Changed(ctx context.Context, parent, commit string) ([]string, error) {
	out, err := r.git(ctx, nil, nil, "diff-tree", "-r", "-z", "--no-renames", "--name-only", "--no-commit-id", parent, commit)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, p := range bytes.Split(out, []byte{0}) {
		if len(p) > 0 {
			paths = append(paths, string(p))
		}
	}
	sort.Strings(paths)
	return paths, nil
}

// Parent returns commit's first parent.
func (r *Repo) Parent(ctx context.Context, commit string) (string, error) {
	out, err := r.git(ctx, nil, nil, "rev-parse", "--verify", commit+"^1^{commit}")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// removeLeftovers removes the index files and git lock files a killed run
// left in the scratch repository at dir.
func removeLeftovers(dir string) error {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != dir && d.Name() == "objects" {
			// The object store holds no lock files (a killed fetch's
			// tmp_pack files are harmless), and it is the large part.
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(d.Name(), ".lock") || strings.HasPrefix(d.Name(), indexPrefix)) {
			return os.Remove(p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
