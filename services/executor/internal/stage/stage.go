// Package stage owns the executor's retained sources: each (tenant,
// repository, commit) tree is fetched once through the authority, extracted
// without ever writing outside its directory, checked against the commit's
// git tree hash, and then kept read-only as the lower layer every job on
// that commit starts from. Trees are never shared across tenants. Only the
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

// Key names one retained source.
type Key struct {
	Tenant, Repository, Commit string
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
	}
	return nil
}

// Header is what the authority says about the tree it streams.
type Header struct {
	Commit, TreeHash string
	// CommitObject is the commit object itself, for the job's .git; nil
	// when the authority sent none.
	CommitObject []byte
}

// FetchFunc opens the authority's stream of the tree as a tar archive.
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
	// commit, its tree and their blobs (for the job's own .git).
	GitObjects string
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

// Get returns the staged tree for k, fetching and verifying it if it is
// not yet retained. Concurrent calls for one key fetch once.
func (c *Cache) Get(ctx context.Context, k Key, fetch FetchFunc) (*Source, error) {
	if err := k.validate(); err != nil {
		return nil, err
	}
	defer c.lock(k)()
	repoDir := filepath.Join(c.root, k.Tenant, k.Repository)
	repo, err := worktree.Open(ctx, filepath.Join(repoDir, "git"))
	if err != nil {
		return nil, fmt.Errorf("stage: %w", err)
	}
	dir := filepath.Join(repoDir, "trees", k.Commit)
	ready := dir + ".ready"
	objects := dir + ".objects"
	if data, err := os.ReadFile(ready); err == nil {
		src := &Source{Dir: dir, TreeHash: strings.TrimSpace(string(data)), Repo: repo, Index: dir + ".index", Cached: true}
		if _, err := os.Stat(objects + ".ready"); err == nil {
			src.GitObjects = objects
		}
		return src, nil
	}
	// A tree without its ready marker is a leftover of an interrupted
	// fetch: start over rather than trust any of it.
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	os.Remove(dir + ".index")
	os.Remove(objects + ".ready")
	if err := os.RemoveAll(objects); err != nil {
		return nil, err
	}
	hdr, rc, err := fetch(ctx)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if hdr.Commit != k.Commit {
		return nil, fmt.Errorf("stage: authority sent commit %s, want %s", hdr.Commit, k.Commit)
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
	src := &Source{Dir: dir, TreeHash: tree, Repo: repo, Index: dir + ".index"}
	if hdr.CommitObject != nil {
		// A commit object that is not the commit is refused outright: the
		// authority (or what stands between) sent something false.
		if err := repo.PackCommit(ctx, k.Commit, tree, hdr.CommitObject, objects); err != nil {
			os.RemoveAll(dir)
			os.RemoveAll(objects)
			return nil, fmt.Errorf("stage %s@%s: %w", k.Repository, k.Commit, err)
		}
		if err := writeMarker(objects+".ready", k.Commit); err != nil {
			return nil, err
		}
		src.GitObjects = objects
	}
	if err := writeMarker(ready, tree); err != nil {
		return nil, err
	}
	return src, nil
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
