package gitobj

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestFormats(t *testing.T) {
	for _, format := range []string{"sha1", "sha256"} {
		t.Run(format, func(t *testing.T) {
			t.Run("loose", func(t *testing.T) {
				dir := newRepo(t, format)
				if n := looseCount(t, dir); n < 500 {
					t.Fatalf("only %d loose objects", n)
				}
				if packs, _ := filepath.Glob(filepath.Join(dir, ".git/objects/pack/*.pack")); len(packs) != 0 {
					t.Fatalf("packs in a loose repository: %v", packs)
				}
				compareAll(t, openStore(t, dir), dir)
			})
			t.Run("gc aggressive", func(t *testing.T) {
				dir := newRepo(t, format)
				runGit(t, dir, nil, "gc", "-q", "--aggressive", "--prune=now")
				if n := looseCount(t, dir); n != 0 {
					t.Fatalf("%d loose objects left after gc", n)
				}
				ofs, ref := packKinds(t, dir)
				if ofs < 100 || ref != 0 {
					t.Fatalf("gc wrote %d offset and %d reference deltas, want offset deltas only", ofs, ref)
				}
				n := len(compareAll(t, openStore(t, dir), dir))
				t.Logf("%d objects, %d of them offset deltas", n, ofs)
			})
			t.Run("reference deltas", func(t *testing.T) {
				dir := newRepo(t, format)
				runGit(t, dir, nil, "-c", "repack.useDeltaBaseOffset=false", "repack", "-q", "-a", "-d", "-f", "--depth=100")
				runGit(t, dir, nil, "prune-packed")
				ofs, ref := packKinds(t, dir)
				if ref < 100 || ofs != 0 {
					t.Fatalf("repack wrote %d offset and %d reference deltas, want reference deltas only", ofs, ref)
				}
				n := len(compareAll(t, openStore(t, dir), dir))
				t.Logf("%d objects, %d of them reference deltas", n, ref)
			})
		})
	}
}

func TestAlternates(t *testing.T) {
	lender := newRepo(t, "sha1")
	runGit(t, lender, nil, "gc", "-q")
	borrower := filepath.Join(t.TempDir(), "borrower")
	runGit(t, lender, nil, "clone", "-q", "--shared", lender, borrower)
	writeFile(t, filepath.Join(borrower, "own.txt"), []byte("only in the borrower\n"))
	runGit(t, borrower, nil, "add", "own.txt")
	runGit(t, borrower, nil, "commit", "-q", "-m", "borrower's own commit")
	own := strings.TrimSpace(string(runGit(t, borrower, nil, "rev-parse", "HEAD")))
	if _, err := os.Stat(filepath.Join(borrower, ".git/objects/info/alternates")); err != nil {
		t.Fatal(err)
	}

	t.Run("absolute", func(t *testing.T) {
		s := openStore(t, borrower)
		objs := compareAll(t, s, borrower)
		if len(objs) < 500 {
			t.Fatalf("git lists only %d objects through the alternate", len(objs))
		}
		if typ, _, err := s.Read(own, 1<<20); err != nil || typ != "commit" {
			t.Fatalf("the borrower's own commit: %s, %v", typ, err)
		}
		lent := openStore(t, lender)
		if _, _, err := lent.Read(own, 1<<20); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the lender reads the borrower's commit: %v", err)
		}
	})
	t.Run("relative", func(t *testing.T) {
		rel, err := filepath.Rel(filepath.Join(borrower, ".git/objects"), filepath.Join(lender, ".git/objects"))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(borrower, ".git/objects/info/alternates"), []byte("# a comment\n\n"+rel+"\n"))
		compareAll(t, openStore(t, borrower), borrower)
	})
	t.Run("quoted", func(t *testing.T) {
		writeFile(t, filepath.Join(borrower, ".git/objects/info/alternates"), []byte(`"`+filepath.Join(lender, ".git/objects")+`"`+"\n"))
		s := openStore(t, borrower)
		if len(s.dirs) != 2 {
			t.Fatalf("%d object directories", len(s.dirs))
		}
	})
}

// chainRepos makes n bare object directories, each one's alternates naming
// the next, and returns their paths.
func chainRepos(t *testing.T, n int) []string {
	root := t.TempDir()
	var dirs []string
	for i := 0; i < n; i++ {
		d := filepath.Join(root, string(rune('a'+i)), "objects")
		if err := os.MkdirAll(filepath.Join(d, "info"), 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	for i := 0; i+1 < n; i++ {
		writeFile(t, filepath.Join(dirs[i], "info/alternates"), []byte("../../"+string(rune('a'+i+1))+"/objects\n"))
	}
	return dirs
}

func TestAlternatesRefused(t *testing.T) {
	t.Run("depth", func(t *testing.T) {
		dirs := chainRepos(t, maxAlternateDepth+1)
		s, err := Open(dirs[0])
		if err != nil {
			t.Fatalf("a chain %d deep: %v", maxAlternateDepth, err)
		}
		if len(s.dirs) != maxAlternateDepth+1 {
			t.Fatalf("%d directories", len(s.dirs))
		}
		s.Close()
		dirs = chainRepos(t, maxAlternateDepth+2)
		if _, err := Open(dirs[0]); err == nil || !strings.Contains(err.Error(), "deeper") {
			t.Fatalf("a chain %d deep: %v", maxAlternateDepth+1, err)
		}
	})
	t.Run("cycle", func(t *testing.T) {
		dirs := chainRepos(t, 3)
		writeFile(t, filepath.Join(dirs[2], "info/alternates"), []byte(dirs[0]+"\n"))
		if _, err := Open(dirs[0]); err == nil || !strings.Contains(err.Error(), "cycle") {
			t.Fatalf("a cycle: %v", err)
		}
		writeFile(t, filepath.Join(dirs[2], "info/alternates"), []byte(".\n"))
		if _, err := Open(dirs[0]); err == nil || !strings.Contains(err.Error(), "cycle") {
			t.Fatalf("a directory naming itself: %v", err)
		}
	})
	t.Run("diamond", func(t *testing.T) {
		dirs := chainRepos(t, 3)
		writeFile(t, filepath.Join(dirs[0], "info/alternates"), []byte("../../b/objects\n"+dirs[2]+"\n"))
		s, err := Open(dirs[0])
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if len(s.dirs) != 3 {
			t.Fatalf("%d directories, want each once", len(s.dirs))
		}
	})
	t.Run("missing", func(t *testing.T) {
		dirs := chainRepos(t, 1)
		writeFile(t, filepath.Join(dirs[0], "info/alternates"), []byte("/nonexistent/objects\n"))
		if _, err := Open(dirs[0]); err == nil {
			t.Fatal("a missing alternate was accepted")
		}
		if _, err := Open(filepath.Join(t.TempDir(), "nope")); err == nil {
			t.Fatal("a missing object directory was accepted")
		}
	})
}

func TestBadRequests(t *testing.T) {
	dir := newRepo(t, "sha1")
	s := openStore(t, dir)
	head := strings.TrimSpace(string(runGit(t, dir, nil, "rev-parse", "HEAD")))
	for _, id := range []string{"", "abc", strings.Repeat("g", 40), strings.Repeat("a", 41), head[:39]} {
		if _, _, err := s.Read(id, 100); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("Read(%q): %v, want a bad id error", id, err)
		}
	}
	for _, id := range []string{strings.Repeat("0", 40), strings.Repeat("e", 64)} {
		if _, _, err := s.Read(id, 100); !errors.Is(err, ErrNotFound) {
			t.Errorf("Read(%s): %v, want ErrNotFound", id, err)
		}
		if has, err := s.Has(id); has || err != nil {
			t.Errorf("Has(%s) = %v, %v", id, has, err)
		}
	}
	if _, _, err := s.Read(head, -1); err == nil {
		t.Error("a negative limit was accepted")
	}
	if _, _, err := s.Read(strings.ToUpper(head), 1<<20); err != nil {
		t.Errorf("upper-case id: %v", err)
	}
	s.Close()
	if _, _, err := s.Read(head, 1<<20); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
}

func TestPrefix(t *testing.T) {
	dir := newRepo(t, "sha1")
	runGit(t, dir, nil, "repack", "-q", "-d") // some packed, ...
	writeFile(t, filepath.Join(dir, "late.txt"), []byte("loose\n"))
	runGit(t, dir, nil, "add", "late.txt") // ... some loose
	runGit(t, dir, nil, "commit", "-q", "-m", "late")
	s := openStore(t, dir)
	var ids []string
	for _, o := range allObjects(t, dir) {
		ids = append(ids, o.id)
	}
	sort.Strings(ids)
	matching := func(prefix string) []string {
		var out []string
		for _, id := range ids {
			if strings.HasPrefix(id, prefix) {
				out = append(out, id)
			}
		}
		return out
	}
	// An ambiguous prefix: the longest shared by two neighbours.
	var ambiguous string
	for i := 1; i < len(ids); i++ {
		n := 0
		for n < 40 && ids[i-1][n] == ids[i][n] {
			n++
		}
		if n >= MinPrefix && n > len(ambiguous) {
			ambiguous = ids[i][:n]
		}
	}
	if ambiguous == "" {
		t.Fatal("no two ids share 4 hex digits; the repository is too small")
	}
	loose := strings.TrimSpace(string(runGit(t, dir, nil, "rev-parse", "HEAD")))
	for _, prefix := range []string{ambiguous, ambiguous[:MinPrefix], ids[0][:5], ids[0][:12], loose[:7], ids[len(ids)-1]} {
		want := matching(prefix)
		got, err := s.Prefix(prefix, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("Prefix(%s) = %v, want %v", prefix, got, want)
		}
		if one, err := s.Prefix(strings.ToUpper(prefix), 1); err != nil || len(one) != 1 || one[0] != want[0] {
			t.Errorf("Prefix(%s, 1) = %v, %v, want %s", prefix, one, err, want[0])
		}
	}
	if got := matching(ambiguous); len(got) < 2 {
		t.Fatalf("%s matches %d ids", ambiguous, len(got))
	}
	if got, _ := s.Prefix(ambiguous, 2); len(got) != 2 {
		t.Errorf("Prefix(%s, 2) = %v, want two", ambiguous, got)
	}
	if got, err := s.Prefix("ffffffffffff", 10); err != nil || len(got) != 0 {
		t.Errorf("Prefix of nothing: %v, %v", got, err)
	}
	for _, bad := range []string{"abc", "xyz0", "", strings.Repeat("a", 65)} {
		if _, err := s.Prefix(bad, 10); err == nil {
			t.Errorf("Prefix(%q) accepted", bad)
		}
	}
	if _, err := s.Prefix("abcd", 0); err == nil {
		t.Error("a zero limit was accepted")
	}
}

// TestPacksChangeWhileOpen has git pack, repack and delete packs while a
// Store is open and reading.
func TestPacksChangeWhileOpen(t *testing.T) {
	// With the collector off, a dropped pack's files are closed by the
	// store or not at all (os.File's cleanup would hide a leak).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	dir := newRepo(t, "sha1")
	s := openStore(t, dir)
	compareAll(t, s, dir)

	runGit(t, dir, nil, "repack", "-q", "-a", "-d")
	runGit(t, dir, nil, "prune-packed")
	if n := looseCount(t, dir); n != 0 {
		t.Fatalf("%d loose objects after repack", n)
	}
	compareAll(t, s, dir) // every object moved from loose to a pack

	for round := 0; round < 2; round++ {
		writeFile(t, filepath.Join(dir, "more.txt"), []byte(strings.Repeat("round\n", round+1)))
		runGit(t, dir, nil, "add", "more.txt")
		runGit(t, dir, nil, "commit", "-q", "-m", "more")
		runGit(t, dir, nil, "repack", "-q", "-a", "-d", "-f") // deletes the old pack
		runGit(t, dir, nil, "prune-packed")
		compareAll(t, s, dir)
	}
	idxs, _ := filepath.Glob(filepath.Join(dir, ".git/objects/pack/*.idx"))
	d := s.dirs[0]
	d.mu.Lock()
	open := len(d.packs)
	d.mu.Unlock()
	if open != len(idxs) || open != 1 {
		t.Fatalf("the store holds %d packs, the directory has %d", open, len(idxs))
	}
	// The packs gc deleted are closed, not held open taking disk space.
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	held := 0
	for _, fd := range fds {
		target, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if strings.HasPrefix(target, dir) && strings.HasSuffix(target, "(deleted)") {
			t.Errorf("a deleted file is still open: %s", target)
		}
		if strings.HasPrefix(target, dir) {
			held++
		}
	}
	if held != 2 {
		t.Errorf("%d files of the repository open, want the one pack and its index", held)
	}
}

// TestConcurrentReads reads every object from many goroutines while git
// repacks beside them; run with -race.
func TestConcurrentReads(t *testing.T) {
	dir := newRepo(t, "sha1")
	runGit(t, dir, nil, "gc", "-q")
	s := openStore(t, dir)
	objs := allObjects(t, dir)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(objs); i += 3 {
				o := objs[i]
				typ, data, err := s.Read(o.id, 1<<24)
				if err != nil {
					errs <- err
					return
				}
				if typ != o.typ || string(data) != string(o.data) {
					errs <- errors.New("different content for " + o.id)
					return
				}
			}
		}(g)
	}
	for i := 0; i < 2; i++ {
		runGit(t, dir, nil, "repack", "-q", "-a", "-d", "-f")
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestThinPack stores a thin pack as git sends it over the wire: its
// reference deltas name bases that are in another pack. Git itself never
// keeps such a pack (index-pack completes it), but it is what a reader
// must handle for a base "possibly in another pack", and git makes it.
func TestThinPack(t *testing.T) {
	src := newRepo(t, "sha1")
	runGit(t, src, nil, "branch", "old", "HEAD~5")
	dst := filepath.Join(t.TempDir(), "dst")
	runGit(t, src, nil, "clone", "-q", "--no-local", "--bare", "--single-branch", "--branch", "old", src, dst)
	thin := runGit(t, src, []byte("HEAD\n^HEAD~5\n"), "pack-objects", "-q", "--thin", "--stdout", "--revs")

	// Git completes the thin pack in a copy, appending the bases; the
	// thin pack's own entries keep their offsets, which gives the ids
	// and offsets for an index of the thin pack as it is.
	fixed := filepath.Join(t.TempDir(), "fixed.pack")
	runGit(t, dst, thin, "index-pack", "--stdin", "--fix-thin", fixed)
	out := runGit(t, dst, nil, "verify-pack", "-v", strings.TrimSuffix(fixed, ".pack")+".idx")
	end := int64(len(thin) - sha1.Size)
	var rows []idxRow
	inThin := map[string]bool{}
	var bases []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 || len(f[0]) != 40 {
			continue
		}
		off, err := strconv.ParseInt(f[4], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if off >= end {
			continue // a base index-pack appended
		}
		id, _ := hex.DecodeString(f[0])
		rows = append(rows, idxRow{id, off})
		inThin[f[0]] = true
		if len(f) == 7 {
			bases = append(bases, f[6])
		}
	}
	if want := int(binary.BigEndian.Uint32(thin[8:12])); len(rows) != want {
		t.Fatalf("found %d of the thin pack's %d entries", len(rows), want)
	}
	outside := 0
	for _, b := range bases {
		if !inThin[b] {
			outside++
		}
	}
	if outside == 0 {
		t.Fatal("no delta of the thin pack has its base outside it")
	}
	writeFile(t, filepath.Join(dst, "objects/pack/pack-thin.pack"), thin)
	writeIndex(t, filepath.Join(dst, "objects/pack/pack-thin.idx"), thin[end:], rows, false)

	s, err := Open(filepath.Join(dst, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checked := 0
	for _, o := range allObjects(t, src) {
		if !inThin[o.id] {
			continue
		}
		typ, data, err := s.Read(o.id, 1<<24)
		if err != nil || typ != o.typ || !bytes.Equal(data, o.data) {
			t.Fatalf("Read(%s): %s, %d bytes, %v; git has %s, %d bytes", o.id, typ, len(data), err, o.typ, len(o.data))
		}
		checked++
	}
	if checked != len(rows) {
		t.Fatalf("checked %d of %d objects", checked, len(rows))
	}
	t.Logf("%d objects, %d deltas on bases in another pack", checked, outside)
}
