// Package stage owns the executor's retained sources: each (tenant,
// repository, commit) tree is fetched once through the authority, extracted
// without ever writing outside its directory, checked against the commit's
// git tree hash, and then kept read-only as the lower layer every job on
// that commit starts from; beside it, the git objects of the job's .git,
// per history depth, the history checked to be exactly the commit's
// (worktree.AddHistory). Trees are never shared across tenants. Only the
// executor's run manager imports it.
package stage

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
)

// Key names one retained source: a tree, and its git objects at a history
// depth (the job's grant's; 0 is 1).
type Key struct {
	Tenant, Repository, Commit string
	Depth                      int
}

var (
	safeName  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	shaFormat = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)
)

func (k Key) validate() error {
	switch {
	case !safeName.MatchString(k.Tenant):
		return fmt.Errorf("%w: tenant %q is not a safe name", errdefs.ErrInvalidArgument, k.Tenant)
	case !safeName.MatchString(k.Repository):
		return fmt.Errorf("%w: repository %q is not a safe name", errdefs.ErrInvalidArgument, k.Repository)
	case !shaFormat.MatchString(k.Commit):
		return fmt.Errorf("%w: commit %q is not a full SHA", errdefs.ErrInvalidArgument, k.Commit)
	case k.Depth < 0 || k.Depth > MaxHistoryDepth:
		return fmt.Errorf("%w: git history depth %d: want 1 to %d", errdefs.ErrInvalidArgument, k.Depth, MaxHistoryDepth)
	}
	return nil
}

// Header is what the authority says about the tree it streams.
type Header struct {
	Commit, TreeHash string
	// CommitObject is the commit object itself, for the job's .git; nil
	// when the authority sent none.
	CommitObject []byte
	// HistoryDepth is how many commits of history the job's .git gets,
	// the base commit included; 0 (an authority that predates it) and 1
	// are the base commit alone.
	HistoryDepth int
	// History opens the history that follows the archive, when
	// HistoryDepth is above 1; the archive need not have been read.
	History func() (History, error)
}

// History is the git history the authority sends after the archive.
type History struct {
	// Depth is the depth it was taken at: at most the header's
	// HistoryDepth, less when the authority's size bound cut it.
	Depth int
	// Commits is how many ancestors the authority says Pack holds.
	Commits int
	// Pack is one git pack; empty when Commits is 0.
	Pack io.Reader
}

// MaxHistoryDepth bounds a header's HistoryDepth (the authority's policy
// bound).
const MaxHistoryDepth = 1000

// FetchFunc opens the authority's stream of the tree as a tar archive. Get
// calls it only when the tree or its git objects at the key's depth are
// not retained yet.
type FetchFunc func(ctx context.Context) (Header, io.ReadCloser, error)

// Source is a staged tree.
type Source struct {
	// Dir is the tree: read-only to jobs, owned by the sandbox's root uid.
	Dir string
	// TreeHash is the verified git tree hash of Dir.
	TreeHash string
	// Repo is the executor's own git directory for this tenant and
	// repository, holding the tree's objects (for patches).
	Repo *worktree.Repo
	// Index is a git index of Dir kept from verification, for fast patches.
	Index string
	// Cached is true when no fetch was needed.
	Cached bool
	// GitObjects, if set, is a git objects directory holding exactly the
	// commit, its tree and their blobs, and its history within the
	// tenant's depth (for the job's own .git).
	GitObjects string
	// Shallow is the history's boundary for the job's .git: the commits
	// in GitObjects whose parents are not there.
	Shallow []string
	// HistoryDepth is the depth GitObjects holds.
	HistoryDepth int
}

// Cache holds retained sources under Root.
type Cache struct {
	root     string
	uid, gid int
	mu       sync.Mutex
	locks    map[Key]*sync.Mutex
}

// New returns a cache in root whose trees are owned by uid:gid (the host
// ids of root inside the sandbox, so a job can edit its overlay copy).
func New(root string, uid, gid int) (*Cache, error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, err
	}
	return &Cache{root: root, uid: uid, gid: gid, locks: map[Key]*sync.Mutex{}}, nil
}

func (c *Cache) lock(k Key) func() {
	c.mu.Lock()
	l, ok := c.locks[k]
	if !ok {
		l = &sync.Mutex{}
		c.locks[k] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Repositories are the repositories the cache holds source of, as
// TENANT/REPOSITORY, sorted, at most limit of them.
func (c *Cache) Repositories(limit int) ([]string, error) {
	tenants, err := os.ReadDir(c.root)
	if err != nil {
		return nil, fmt.Errorf("stage: %w", err)
	}
	var out []string
	for _, t := range tenants {
		if !t.IsDir() || !safeName.MatchString(t.Name()) {
			continue
		}
		repos, err := os.ReadDir(filepath.Join(c.root, t.Name()))
		if err != nil {
			return nil, fmt.Errorf("stage: %w", err)
		}
		for _, r := range repos {
			if r.IsDir() && safeName.MatchString(r.Name()) {
				out = append(out, t.Name()+"/"+r.Name())
			}
		}
	}
	// ReadDir sorts by name, and a name has no "/".
	return out[:min(len(out), limit)], nil
}

// Get returns the staged tree for k, with the job's git objects at k's
// history depth, fetching and verifying what is not yet retained: the
// tree is kept per commit, the git objects per commit and depth. The
// authority must send the depth k names. Concurrent calls for one key
// fetch once; a retained key needs no fetch at all.
func (c *Cache) Get(ctx context.Context, k Key, fetch FetchFunc) (*Source, error) {
	if err := k.validate(); err != nil {
		return nil, err
	}
	// One lock for every depth: they share the tree.
	defer c.lock(Key{Tenant: k.Tenant, Repository: k.Repository, Commit: k.Commit})()
	repoDir := filepath.Join(c.root, k.Tenant, k.Repository)
	repo, err := worktree.Open(ctx, filepath.Join(repoDir, "git"))
	if err != nil {
		return nil, fmt.Errorf("stage: %w", err)
	}
	depth := max(1, k.Depth)
	dir := filepath.Join(repoDir, "trees", k.Commit)
	objects := dir + ".objects"
	if depth > 1 {
		objects = fmt.Sprintf("%s.objects-%d", dir, depth)
	}
	if src, ok := c.retained(repo, dir, objects, depth); ok {
		return src, nil
	}
	hdr, rc, err := fetch(ctx)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if hdr.Commit != k.Commit {
		return nil, fmt.Errorf("stage: authority sent commit %s, want %s", hdr.Commit, k.Commit)
	}
	if got := max(1, hdr.HistoryDepth); got != depth {
		return nil, fmt.Errorf("stage %s@%s: the authority sends a git history depth of %d; the job's grant says %d", k.Repository, k.Commit, got, depth)
	}
	src, err := c.tree(ctx, k, repo, hdr, rc, dir)
	if err != nil {
		return nil, err
	}
	if hdr.CommitObject == nil {
		return src, nil
	}
	if data, err := os.ReadFile(objects + ".ready"); err == nil {
		src.GitObjects, src.Shallow, src.HistoryDepth = objects, strings.Fields(string(data)), depth
		return src, nil
	}
	// Objects without their ready marker are a leftover of an
	// interrupted staging: start over.
	if err := os.RemoveAll(objects); err != nil {
		return nil, err
	}
	shallow, err := c.gitObjects(ctx, repo, k, hdr, depth, src.TreeHash, objects)
	if err != nil {
		os.RemoveAll(objects)
		return nil, fmt.Errorf("stage %s@%s: %w", k.Repository, k.Commit, err)
	}
	if err := writeMarker(objects+".ready", strings.Join(shallow, "\n")); err != nil {
		return nil, err
	}
	src.GitObjects, src.Shallow, src.HistoryDepth = objects, shallow, depth
	return src, nil
}

// retained is the source staged already for the tree at dir with its git
// objects at depth, if both are there.
func (c *Cache) retained(repo *worktree.Repo, dir, objects string, depth int) (*Source, bool) {
	tree, err := os.ReadFile(dir + ".ready")
	if err != nil {
		return nil, false
	}
	shallow, err := os.ReadFile(objects + ".ready")
	if err != nil {
		return nil, false
	}
	return &Source{Dir: dir, TreeHash: strings.TrimSpace(string(tree)), Repo: repo, Index: dir + ".index", Cached: true,
		GitObjects: objects, Shallow: strings.Fields(string(shallow)), HistoryDepth: depth}, true
}

// tree returns the retained tree of k, extracting and verifying the
// archive from rc when there is none.
func (c *Cache) tree(ctx context.Context, k Key, repo *worktree.Repo, hdr Header, rc io.Reader, dir string) (*Source, error) {
	ready := dir + ".ready"
	if data, err := os.ReadFile(ready); err == nil {
		src := &Source{Dir: dir, TreeHash: strings.TrimSpace(string(data)), Repo: repo, Index: dir + ".index", Cached: true}
		if src.TreeHash != hdr.TreeHash {
			return nil, fmt.Errorf("stage %s@%s: %w: the authority names tree %s, the retained tree is %s", k.Repository, k.Commit, worktree.ErrTreeMismatch, hdr.TreeHash, src.TreeHash)
		}
		return src, nil
	}
	// A tree without its ready marker is a leftover of an interrupted
	// fetch: start over rather than trust any of it, and its git objects
	// with it.
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	os.Remove(dir + ".index")
	if err := c.removeObjects(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, err
	}
	if err := c.extract(rc, dir); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("stage %s/%s@%s: %w", k.Tenant, k.Repository, k.Commit, err)
	}
	tree, err := repo.TreeHashIndex(ctx, dir, dir+".index")
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("stage: %w", err)
	}
	if tree != hdr.TreeHash {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("stage %s@%s: %w: got tree %s, the commit's is %s", k.Repository, k.Commit, worktree.ErrTreeMismatch, tree, hdr.TreeHash)
	}
	if err := writeMarker(ready, tree); err != nil {
		return nil, err
	}
	return &Source{Dir: dir, TreeHash: tree, Repo: repo, Index: dir + ".index"}, nil
}

// removeObjects removes every git objects directory of the tree at dir,
// whatever its depth.
func (c *Cache) removeObjects(dir string) error {
	matches, err := filepath.Glob(dir + ".objects*")
	if err != nil {
		return err
	}
	for _, m := range matches {
		if err := os.RemoveAll(m); err != nil {
			return err
		}
	}
	return nil
}

// gitObjects writes the job's git objects for k at depth into objects and
// returns the shallow boundary. A commit object that is not the commit, or
// a history that is not exactly the commit's, is refused outright: the
// authority (or what stands between) sent something false, and no job
// starts on it.
func (c *Cache) gitObjects(ctx context.Context, repo *worktree.Repo, k Key, hdr Header, depth int, tree, objects string) ([]string, error) {
	if err := repo.PackCommit(ctx, k.Commit, tree, hdr.CommitObject, objects); err != nil {
		return nil, err
	}
	if depth == 1 {
		return []string{k.Commit}, nil
	}
	if hdr.History == nil {
		return nil, fmt.Errorf("%w: the authority promised depth %d and sent no history", worktree.ErrBadHistory, depth)
	}
	h, err := hdr.History()
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	if h.Depth < 1 || h.Depth > depth {
		return nil, fmt.Errorf("%w: the authority sent depth %d for a policy depth of %d", worktree.ErrBadHistory, h.Depth, depth)
	}
	if h.Depth == 1 {
		// The authority's size bound cut the history to the base alone.
		return []string{k.Commit}, nil
	}
	return repo.AddHistory(ctx, k.Commit, h.Depth, h.Commits, h.Pack, objects)
}

func writeMarker(path, content string) error {
	return atomicfile.Write(path, []byte(content+"\n"), 0o644, atomicfile.Fast)
}

// extract writes the archive into dir. It refuses absolute names, names
// with "..", any entry whose parent is not a real directory it created
// (so nothing is written through a symlink in the archive), and entry types
// other than directories, regular files and symlinks.
func (c *Cache) extract(r io.Reader, dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	if err := os.Lchown(dir, c.uid, c.gid); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name == "" || name == "." {
			continue
		}
		if filepath.IsAbs(name) || name != filepath.Clean(name) || name == ".." || strings.HasPrefix(name, "../") || strings.Contains(name, "/../") {
			return fmt.Errorf("archive entry %q escapes the tree", h.Name)
		}
		for _, part := range strings.Split(name, "/") {
			if part == ".git" {
				// No commit can contain .git; one in the stream is not the
				// commit's tree, and git would treat it as a repository.
				return fmt.Errorf("archive entry %q: a .git path cannot be part of a commit", h.Name)
			}
		}
		target := filepath.Join(dir, name)
		if err := c.checkParents(dir, name); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		case tar.TypeReg:
			mode := os.FileMode(0o644)
			if h.Mode&0o111 != 0 {
				mode = 0o755
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		default:
			return fmt.Errorf("archive entry %q has type %q; only directories, files and symlinks are staged", h.Name, string(h.Typeflag))
		}
		if err := os.Lchown(target, c.uid, c.gid); err != nil {
			return err
		}
	}
}

// checkParents makes sure every parent of name inside dir is a real
// directory, not a symlink.
func (c *Cache) checkParents(dir, name string) error {
	parts := strings.Split(name, "/")
	p := dir
	for _, part := range parts[:len(parts)-1] {
		p = filepath.Join(p, part)
		st, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("archive entry %q: parent %s: %w", name, part, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("archive entry %q goes through a non-directory", name)
		}
	}
	return nil
}
