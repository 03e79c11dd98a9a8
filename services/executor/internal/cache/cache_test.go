package cache

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	testBase  = 1000000
	testRange = 65536
)

func newStore(t *testing.T) *Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("cache tests need root: they make whiteouts and chown files as the executor does")
	}
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "caches"), IDBase: testBase, IDRange: testRange})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// upper makes an upper layer from files (path → content; a path ending in
// "/" is a directory).
func upper(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func commit(t *testing.T, s *Store, k Key, job string, up string, max int64) (Lease, Outcome) {
	t.Helper()
	l, err := s.Open(k, job)
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Commit(l, up, max)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(l); err != nil {
		t.Fatal(err)
	}
	return l, out
}

func read(t *testing.T, s *Store, k Key, rel string) (string, bool) {
	t.Helper()
	l, err := s.Open(k, "reader")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(l)
	b, err := os.ReadFile(filepath.Join(l.Lower, rel))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// The second run of a repository finds what the first committed; another
// tenant's run and another repository's run do not.
func TestCommitIsKeptPerTenantAndRepository(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "go-build"}
	_, out := commit(t, s, k, "job1", upper(t, map[string]string{"ab/cd-a": "compiled"}), 1<<20)
	if out.SizeAfter != 2*EntryBytes+int64(len("compiled")) || out.Evicted {
		t.Fatalf("outcome %+v", out)
	}
	if got, ok := read(t, s, k, "ab/cd-a"); !ok || got != "compiled" {
		t.Fatalf("second run of the repository reads %q, %v; want the first run's file", got, ok)
	}
	for _, other := range []Key{
		{Tenant: "evil", Repository: "app", Name: "go-build"},
		{Tenant: "acme", Repository: "other", Name: "go-build"},
		{Tenant: "acme", Repository: "app", Name: "npm"},
		// No separator confusion between the key's parts.
		{Tenant: "acme", Repository: "app/go-build", Name: ""},
	} {
		if _, ok := read(t, s, other, "ab/cd-a"); ok {
			t.Errorf("%v sees %v's cache", other, k)
		}
	}
	list, err := s.List("acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 4 || list[0].Repository != "app" || list[0].Name != "go-build" || list[0].Size != out.SizeAfter {
		t.Errorf("list %+v", list)
	}
	evil, _ := s.List("evil")
	if len(evil) != 1 || evil[0].Size != 0 {
		t.Errorf("evil's list %+v", evil)
	}
}

// A run started before another's commit keeps the generation it started
// with until it ends; its own commit lands on top of the newer one.
func TestConcurrentRunSeesItsStartAndCommitsOnTop(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	commit(t, s, k, "job0", upper(t, map[string]string{"base": "0"}), 1<<20)
	slow, err := s.Open(k, "slow")
	if err != nil {
		t.Fatal(err)
	}
	commit(t, s, k, "fast", upper(t, map[string]string{"fast": "1", "base": "fast"}), 1<<20)
	if b, err := os.ReadFile(filepath.Join(slow.Lower, "base")); err != nil || string(b) != "0" {
		t.Fatalf("the slow run's lower changed under it: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(slow.Lower, "fast")); err == nil {
		t.Fatal("the slow run sees the fast run's commit")
	}
	if _, err := s.Commit(slow, upper(t, map[string]string{"slow": "2"}), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(slow); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{"fast": "1", "slow": "2", "base": "fast"} {
		if got, ok := read(t, s, k, rel); !ok || got != want {
			t.Errorf("%s = %q, %v; want %q", rel, got, ok, want)
		}
	}
	// Only the current generation is left.
	gens, _ := filepath.Glob(filepath.Join(s.dirOf(k), "g*"))
	if len(gens) != 1 {
		t.Errorf("generations left: %v", gens)
	}
}

// Commits of one cache run one at a time, none lost.
func TestParallelCommitsAllLand(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	var wg sync.WaitGroup
	for i := range 8 {
		up := upper(t, map[string]string{"f" + string(rune('a'+i)): "x"})
		wg.Add(1)
		go func() {
			defer wg.Done()
			job := "job" + string(rune('a'+i))
			l, err := s.Open(k, job)
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Commit(l, up, 1<<20); err != nil {
				t.Error(err)
			}
			if err := s.Release(l); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := range 8 {
		if _, ok := read(t, s, k, "f"+string(rune('a'+i))); !ok {
			t.Errorf("commit %d lost", i)
		}
	}
}

// A cache past its bound after a commit is wiped whole, and says so.
func TestOverMaxSizeIsEvicted(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	commit(t, s, k, "job1", upper(t, map[string]string{"small": "s"}), 64<<10)
	_, out := commit(t, s, k, "job2", upper(t, map[string]string{"big": strings.Repeat("x", 100<<10)}), 64<<10)
	if !out.Evicted || out.SizeAfter != 0 {
		t.Fatalf("outcome %+v, want evicted to 0", out)
	}
	for _, rel := range []string{"small", "big"} {
		if _, ok := read(t, s, k, rel); ok {
			t.Errorf("%s survived the eviction", rel)
		}
	}
	list, _ := s.List("acme")
	if len(list) != 1 || list[0].Size != 0 {
		t.Errorf("list %+v", list)
	}
}

// A sparse file costs a job's scratch nothing, but a cache counts it at
// its apparent size: a layer over the bound is evicted before anything is
// copied, so the executor's disk never holds the file written out (before
// the fix, the commit wrote all of it, then found it too big).
func TestSparseLayerOverMaxSizeIsNeverWritten(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	commit(t, s, k, "job1", upper(t, map[string]string{"small": "s"}), 64<<10)
	up := upper(t, map[string]string{"keep": "k"})
	const huge = 2 << 30
	if err := os.Truncate(filepath.Join(up, "keep"), huge); err != nil {
		t.Fatal(err)
	}
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(s.cfg.Dir, &st); err != nil {
			t.Error(err)
		}
		return int64(st.Bfree) * st.Bsize
	}
	// The least free space seen while the commit runs: a written copy
	// shows at once (ext4 reserves delayed allocations).
	before, least := free(), free()
	done := make(chan Outcome, 1)
	go func() { _, out := commit(t, s, k, "job2", up, 64<<10); done <- out }()
	var out Outcome
	for watching := true; watching; {
		select {
		case out = <-done:
			watching = false
		case <-time.After(5 * time.Millisecond):
			least = min(least, free())
		}
	}
	if !out.Evicted || out.SizeAfter != 0 {
		t.Fatalf("outcome %+v, want evicted to 0", out)
	}
	if used := before - least; used > huge/2 {
		t.Fatalf("the commit used %d bytes of the executor's disk for a sparse file of %d", used, int64(huge))
	}
	if _, ok := read(t, s, k, "small"); ok {
		t.Error("the generation before survived the eviction")
	}
}

// Whiteouts remove, opaque directories replace, a directory may replace a
// link and a file a directory.
func TestWhiteoutsAndOpaqueDirectories(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	commit(t, s, k, "job1", upper(t, map[string]string{
		"gone": "1", "keep": "1", "d/old": "1", "d/old2": "1", "e/x": "1", "f/": "",
	}), 1<<20)
	up := upper(t, map[string]string{"d/new": "2", "e": "now a file", "f/y": "2"})
	if err := unix.Mknod(filepath.Join(up, "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(up, "d"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	commit(t, s, k, "job2", up, 1<<20)
	want := map[string]string{"keep": "1", "d/new": "2", "e": "now a file", "f/y": "2"}
	for rel, w := range want {
		if got, ok := read(t, s, k, rel); !ok || got != w {
			t.Errorf("%s = %q, %v; want %q", rel, got, ok, w)
		}
	}
	for _, rel := range []string{"gone", "d/old", "d/old2", "e/x"} {
		if _, ok := read(t, s, k, rel); ok {
			t.Errorf("%s survived", rel)
		}
	}
}

// What a malicious run can plant in its cache does not survive as such:
// no FIFO, socket or device node; no setuid, setgid or sticky bit; no
// owner outside the sandbox's ids; no extended attribute (file
// capabilities); links stay links, never followed on the host; a file
// hard-linked to one outside the cache arrives as a copy.
func TestHostileEntriesAreDefused(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	up := upper(t, map[string]string{"suid": "#!/bin/sh\n", "rootowned": "r", "caps": "c", "dir/": ""})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chown(filepath.Join(up, "suid"), testBase, testBase))
	must(os.Chmod(filepath.Join(up, "suid"), 0o755|os.ModeSetuid|os.ModeSetgid)) // after chown, which clears them
	if fi, _ := os.Stat(filepath.Join(up, "suid")); fi.Mode()&os.ModeSetuid == 0 {
		t.Fatal("the planted file is not setuid")
	}
	must(os.Chown(filepath.Join(up, "rootowned"), 0, 0)) // host root
	must(os.Chown(filepath.Join(up, "caps"), testBase+1000, testBase+1000))
	must(unix.Setxattr(filepath.Join(up, "caps"), "security.capability", []byte{1, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0))
	must(unix.Setxattr(filepath.Join(up, "caps"), "user.note", []byte("x"), 0))
	must(os.Chmod(filepath.Join(up, "dir"), 0o1777|os.ModeSticky))
	must(unix.Mkfifo(filepath.Join(up, "fifo"), 0o666))
	must(unix.Mknod(filepath.Join(up, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(filepath.Join(up, "disk"), unix.S_IFBLK|0o666, int(unix.Mkdev(8, 0))))
	must(os.Symlink("/etc/shadow", filepath.Join(up, "escape")))
	must(os.Symlink("../../../../..", filepath.Join(up, "dir", "up")))
	// A hard link to a host file (as if the layer shared an inode with
	// one): the cache gets a copy, never the inode.
	host := filepath.Join(t.TempDir(), "host-secret")
	must(os.WriteFile(host, []byte("host"), 0o600))
	must(os.Link(host, filepath.Join(up, "hardlink")))

	_, out := commit(t, s, k, "evil", up, 1<<20)
	if out.Dropped != 3 {
		t.Errorf("dropped %d entries, want 3 (fifo, char and block device)", out.Dropped)
	}
	l, err := s.Open(k, "next")
	must(err)
	defer s.Release(l)
	root := l.Lower
	for _, rel := range []string{"fifo", "null", "disk"} {
		if _, err := os.Lstat(filepath.Join(root, rel)); err == nil {
			t.Errorf("%s survived the commit", rel)
		}
	}
	check := func(rel string, mode os.FileMode, uid int) {
		t.Helper()
		var st unix.Stat_t
		must(unix.Lstat(filepath.Join(root, rel), &st))
		if got := os.FileMode(st.Mode & 0o7777); got != mode {
			t.Errorf("%s: mode %#o, want %#o", rel, got, mode)
		}
		if int(st.Uid) != uid || int(st.Gid) != uid {
			t.Errorf("%s: owner %d:%d, want %d", rel, st.Uid, st.Gid, uid)
		}
	}
	check("suid", 0o755, testBase)
	check("rootowned", 0o644, testBase)
	check("caps", 0o644, testBase+1000)
	check("dir", 0o777, testBase)
	for _, x := range []string{"security.capability", "user.note"} {
		if hasXattr(filepath.Join(root, "caps"), x) {
			t.Errorf("caps kept its %s", x)
		}
	}
	for rel, target := range map[string]string{"escape": "/etc/shadow", "dir/up": "../../../../.."} {
		fi, err := os.Lstat(filepath.Join(root, rel))
		must(err)
		if fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer a symlink: %v", rel, fi.Mode())
		}
		if got, _ := os.Readlink(filepath.Join(root, rel)); got != target {
			t.Errorf("%s -> %q, want %q", rel, got, target)
		}
	}
	// The host file is untouched and not shared.
	must(os.WriteFile(host, []byte("changed"), 0o600))
	if b, _ := os.ReadFile(filepath.Join(root, "hardlink")); string(b) != "host" {
		t.Errorf("hardlink reads %q: the cache shares the host's inode", b)
	}
	var st unix.Stat_t
	must(unix.Lstat(filepath.Join(root, "hardlink"), &st))
	if st.Mode&0o777 != 0o600 {
		t.Errorf("hardlink mode %#o", st.Mode&0o777)
	}

	// A later run that makes a directory where the first planted a link
	// to a host directory writes into the cache, never through the link.
	outside := t.TempDir()
	up2 := upper(t, map[string]string{"toward/planted": "1"})
	must(os.Remove(filepath.Join(up2, "toward", "planted")))
	must(os.Remove(filepath.Join(up2, "toward")))
	must(os.Symlink(outside, filepath.Join(up2, "toward")))
	commit(t, s, k, "plant", up2, 1<<20)
	commit(t, s, k, "follow", upper(t, map[string]string{"toward/pwned": "x"}), 1<<20)
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("the commit wrote through a planted link: %v", ents)
	}
	if got, ok := read(t, s, k, "toward/pwned"); !ok || got != "x" {
		t.Errorf("toward/pwned = %q, %v", got, ok)
	}
}

// A redirect in the layer (a renamed lower directory) cannot be merged
// faithfully: the commit is refused and the cache stays as it was.
func TestRedirectIsRefused(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	commit(t, s, k, "job1", upper(t, map[string]string{"a/x": "1"}), 1<<20)
	up := upper(t, map[string]string{"b/": ""})
	if err := unix.Setxattr(filepath.Join(up, "b"), "trusted.overlay.redirect", []byte("/a"), 0); err != nil {
		t.Fatal(err)
	}
	l, err := s.Open(k, "job2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(l, up, 1<<20); err == nil || !strings.Contains(err.Error(), "renamed directory") {
		t.Fatalf("commit: %v, want a refusal", err)
	}
	s.Release(l)
	if got, ok := read(t, s, k, "a/x"); !ok || got != "1" {
		t.Errorf("a/x = %q, %v", got, ok)
	}
}

func TestClear(t *testing.T) {
	s := newStore(t)
	a := Key{Tenant: "acme", Repository: "app", Name: "c"}
	b := Key{Tenant: "acme", Repository: "lib", Name: "c"}
	commit(t, s, a, "j1", upper(t, map[string]string{"f": "1"}), 1<<20)
	commit(t, s, b, "j2", upper(t, map[string]string{"f": "1"}), 1<<20)
	if got, err := s.Clear("evil", "", ""); err != nil || len(got) != 0 {
		t.Fatalf("another tenant cleared %v, %v", got, err)
	}
	got, err := s.Clear("acme", "app", "")
	if err != nil || len(got) != 1 || got[0].Key != a || got[0].Size == 0 {
		t.Fatalf("cleared %+v, %v", got, err)
	}
	if list, _ := s.List("acme"); len(list) != 1 || list[0].Key != b {
		t.Errorf("after the clear the list is %+v, want lib's alone", list)
	}
	if _, ok := read(t, s, a, "f"); ok {
		t.Error("app's cache survived its clear")
	}
	if _, ok := read(t, s, b, "f"); !ok {
		t.Error("lib's cache went with app's")
	}
	// Used again, it is listed again, empty.
	if list, _ := s.List("acme"); len(list) != 2 || list[0].Key != a || list[0].Size != 0 {
		t.Errorf("after a run used it again the list is %+v", list)
	}
}

// After a restart, holds of runs that are gone are dropped; a kept
// session's hold (and its generation) stays.
func TestRecoverKeepsKeptSessions(t *testing.T) {
	s := newStore(t)
	k := Key{Tenant: "acme", Repository: "app", Name: "c"}
	commit(t, s, k, "j1", upper(t, map[string]string{"f": "1"}), 1<<20)
	kept, err := s.Open(k, "session")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(k, "lost"); err != nil {
		t.Fatal(err)
	}
	commit(t, s, k, "j2", upper(t, map[string]string{"g": "2"}), 1<<20)
	half := filepath.Join(s.dirOf(k), "tmp-crashed")
	if err := os.MkdirAll(filepath.Join(half, "tree"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(func(id string) bool { return id == "session" }); err != nil {
		t.Fatal(err)
	}
	again, err := s.Open(k, "session")
	if err != nil {
		t.Fatal(err)
	}
	if again.Lower != kept.Lower {
		t.Errorf("kept session's lower %s, want %s", again.Lower, kept.Lower)
	}
	if _, err := os.Stat(filepath.Join(again.Lower, "f")); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(refPath(s.dirOf(k), "lost")); err == nil {
		t.Error("a lost run's hold survived Recover")
	}
	if _, err := os.Stat(half); err == nil {
		t.Error("a half-built commit survived Recover")
	}
}
