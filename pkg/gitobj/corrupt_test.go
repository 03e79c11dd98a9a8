package gitobj

import (
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCraftedPacks reads packs written by hand: deltas of both kinds with
// bases in the same pack, another pack and a loose object, offsets in the
// 64-bit table, and what a hostile pack could hold.
func TestCraftedPacks(t *testing.T) {
	base := []byte(strings.Repeat("the base blob's content\n", 40))
	baseID := objectID("blob", base)
	d1 := makeDelta(base, 10, []byte("inserted by an offset delta"))
	t1 := append(append(append([]byte(nil), base[:10]...), "inserted by an offset delta"...), base[10:]...)
	d2 := makeDelta(base, 20, []byte("by a reference delta"))
	t2 := append(append(append([]byte(nil), base[:20]...), "by a reference delta"...), base[20:]...)
	t1ID, t2ID := objectID("blob", t1), objectID("blob", t2)
	// A delta of a delta: the chain walks two offsets back.
	d3 := makeDelta(t1, 5, []byte("second level"))
	t3 := append(append(append([]byte(nil), t1[:5]...), "second level"...), t1[5:]...)
	t3ID := objectID("blob", t3)

	read := func(t *testing.T, s *Store, id []byte, want []byte) {
		t.Helper()
		typ, data, err := s.Read(hex.EncodeToString(id), 1<<20)
		if err != nil || typ != "blob" || string(data) != string(want) {
			t.Fatalf("Read(%x) = %s, %d bytes, %v", id, typ, len(data), err)
		}
	}

	for _, large := range []bool{false, true} {
		objects := newObjects(t)
		writePack(t, objects, "a", []rawEntry{
			{id: baseID, typ: objBlob, size: int64(len(base)), body: base},
			{id: t1ID, typ: objOfsDelta, size: int64(len(d1)), base: 0, body: d1},
			{id: t2ID, typ: objRefDelta, size: int64(len(d2)), ref: baseID, body: d2},
			{id: t3ID, typ: objOfsDelta, size: int64(len(d3)), base: 1, body: d3},
		}, large)
		s, err := Open(objects)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []struct{ id, data []byte }{{baseID, base}, {t1ID, t1}, {t2ID, t2}, {t3ID, t3}} {
			read(t, s, o.id, o.data)
		}
		if _, _, err := s.Read(hex.EncodeToString(t3ID), int64(len(t3)-1)); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("a delta result over the limit: %v", err)
		}
		s.Close()
	}

	t.Run("base in another pack or loose", func(t *testing.T) {
		objects := newObjects(t)
		writePack(t, objects, "bases", []rawEntry{{id: baseID, typ: objBlob, size: int64(len(base)), body: base}}, false)
		writePack(t, objects, "thin", []rawEntry{{id: t2ID, typ: objRefDelta, size: int64(len(d2)), ref: baseID, body: d2}}, false)
		open := func() *Store {
			s, err := Open(objects)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		read(t, open(), t2ID, t2)
		os.Remove(filepath.Join(objects, "pack", "pack-bases.idx"))
		os.Remove(filepath.Join(objects, "pack", "pack-bases.pack"))
		writeLoose(t, objects, baseID, append([]byte("blob 960\x00"), base...))
		read(t, open(), t2ID, t2)
		os.Remove(filepath.Join(objects, hex.EncodeToString(baseID)[:2], hex.EncodeToString(baseID)[2:]))
		if _, _, err := open().Read(hex.EncodeToString(t2ID), 1<<20); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("a delta whose base is nowhere: %v", err)
		}
	})

	hostile := []struct {
		name    string
		entries []rawEntry
		want    error
	}{
		{"reference cycle", []rawEntry{
			{id: t1ID, typ: objRefDelta, size: int64(len(d1)), ref: t2ID, body: d1},
			{id: t2ID, typ: objRefDelta, size: int64(len(d2)), ref: t1ID, body: d2},
		}, ErrCorrupt},
		{"reference to itself", []rawEntry{
			{id: t1ID, typ: objRefDelta, size: int64(len(d1)), ref: t1ID, body: d1},
		}, ErrCorrupt},
		{"content longer than its header", []rawEntry{
			{id: baseID, typ: objBlob, size: int64(len(base)) - 1, body: base},
		}, ErrCorrupt},
		{"content shorter than its header", []rawEntry{
			{id: baseID, typ: objBlob, size: int64(len(base)) + 1, body: base},
		}, ErrCorrupt},
		{"a huge header size", []rawEntry{
			{id: baseID, typ: objBlob, size: 1 << 50, body: base},
		}, ErrTooLarge},
		{"a delta stating a huge result", []rawEntry{
			{id: baseID, typ: objBlob, size: int64(len(base)), body: base},
			{id: t1ID, typ: objOfsDelta, size: 20, base: 0, body: append(encodeSize(len(base)), encodeSize(1<<40)...)},
		}, ErrTooLarge},
		{"a delta on a huge base", []rawEntry{
			{id: baseID, typ: objBlob, size: 1 << 40, body: base},
			{id: t1ID, typ: objOfsDelta, size: int64(len(d1)), base: 0, body: d1},
		}, ErrTooLarge},
		{"a delta on the wrong base", []rawEntry{
			{id: objectID("blob", []byte("abc")), typ: objBlob, size: 3, body: []byte("abc")},
			{id: t1ID, typ: objOfsDelta, size: int64(len(d1)), base: 0, body: d1},
		}, ErrCorrupt},
		{"a type that does not exist", []rawEntry{{id: baseID, typ: 5, size: int64(len(base)), body: base}}, ErrCorrupt},
		{"content that is not its id's", []rawEntry{{id: t1ID, typ: objBlob, size: int64(len(base)), body: base}}, ErrCorrupt},
	}
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			objects := newObjects(t)
			writePack(t, objects, "x", h.entries, false)
			s, err := Open(objects)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// The last entry is the one each case is about.
			id := h.entries[len(h.entries)-1].id
			if _, _, err := s.Read(hex.EncodeToString(id), 1<<20); !errors.Is(err, h.want) {
				t.Errorf("Read(%x): %v, want %v", id, err, h.want)
			}
			// With no limit, a stated size is not trusted either: the
			// data runs out long before it, and nothing of it was
			// allocated up front (or this would run out of memory).
			if _, _, err := s.Read(hex.EncodeToString(id), math.MaxInt64); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Read(%x) with no limit: %v, want ErrCorrupt", id, err)
			}
		})
	}
}

func TestCorruptLoose(t *testing.T) {
	objects := newObjects(t)
	content := []byte("hello, world\n")
	id := objectID("blob", content)
	idHex := hex.EncodeToString(id)
	path := filepath.Join(objects, idHex[:2], idHex[2:])
	s, err := Open(objects)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	good := deflate(append([]byte("blob 13\x00"), content...))

	writeFile(t, path, good)
	if typ, data, err := s.Read(idHex, 13); err != nil || typ != "blob" || string(data) != string(content) {
		t.Fatalf("the good object: %s %q %v", typ, data, err)
	}
	cases := []struct {
		name string
		file []byte
		max  int64
		want error
	}{
		{"truncated", good[:len(good)/2], 100, ErrCorrupt},
		{"checksum cut off", good[:len(good)-4], 100, ErrCorrupt},
		{"not zlib", []byte("plain text, not deflated"), 100, ErrCorrupt},
		{"empty", nil, 100, ErrCorrupt},
		{"size short", deflate(append([]byte("blob 12\x00"), content...)), 100, ErrCorrupt},
		{"size long", deflate(append([]byte("blob 14\x00"), content...)), 100, ErrCorrupt},
		{"size with a leading zero", deflate(append([]byte("blob 013\x00"), content...)), 100, ErrCorrupt},
		{"negative size", deflate(append([]byte("blob -13\x00"), content...)), 100, ErrCorrupt},
		{"unknown type", deflate(append([]byte("blub 13\x00"), content...)), 100, ErrCorrupt},
		{"no header end", deflate([]byte(strings.Repeat("blob ", 20))), 100, ErrCorrupt},
		{"another object's content", deflate([]byte("blob 5\x00other")), 100, ErrCorrupt},
		{"a huge size", deflate([]byte("blob 99999999999999\x00")), 1 << 20, ErrTooLarge},
		{"over the limit", good, 12, ErrTooLarge},
		{"a huge size with no limit", deflate([]byte("blob 99999999999999\x00")), math.MaxInt64, ErrCorrupt},
	}
	for _, c := range cases {
		writeFile(t, path, c.file)
		if _, _, err := s.Read(idHex, c.max); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		// Has answers from the name alone.
		if has, err := s.Has(idHex); !has || err != nil {
			t.Errorf("%s: Has = %v, %v", c.name, has, err)
		}
	}
}

// TestCorruptPack damages a real pack and its index and reads everything:
// errors, never a panic, never content that differs from git's.
func TestCorruptPack(t *testing.T) {
	dir := newRepo(t, "sha1")
	runGit(t, dir, nil, "gc", "-q", "--prune=now")
	objs := allObjects(t, dir)
	packs, _ := filepath.Glob(filepath.Join(dir, ".git/objects/pack/*.pack"))
	if len(packs) != 1 {
		t.Fatalf("%d packs", len(packs))
	}
	packPath := packs[0]
	idxPath := strings.TrimSuffix(packPath, ".pack") + ".idx"
	pristine, err := os.ReadFile(packPath)
	if err != nil {
		t.Fatal(err)
	}
	pristineIdx, err := os.ReadFile(idxPath)
	if err != nil {
		t.Fatal(err)
	}
	readAll := func(t *testing.T) (failed int) {
		s := openStore(t, dir)
		for _, o := range objs {
			typ, data, err := s.Read(o.id, 1<<24)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrNotFound) {
					t.Fatalf("Read(%s): an error of no kind: %v", o.id, err)
				}
				failed++
				continue
			}
			if typ != o.typ || string(data) != string(o.data) {
				t.Fatalf("Read(%s) returned content git does not have", o.id)
			}
		}
		return failed
	}
	restore := func() {
		writeFile(t, packPath, pristine)
		writeFile(t, idxPath, pristineIdx)
	}

	t.Run("flipped bytes", func(t *testing.T) {
		defer restore()
		for step := 7; step < 200; step += 31 {
			damaged := append([]byte(nil), pristine...)
			for i := packHeader + step; i < len(damaged)-20; i += step * 13 {
				damaged[i] ^= 0x5a
			}
			writeFile(t, packPath, damaged)
			if failed := readAll(t); failed == 0 {
				t.Fatalf("step %d: every object read from a damaged pack", step)
			}
		}
	})
	t.Run("truncated pack", func(t *testing.T) {
		defer restore()
		writeFile(t, packPath, pristine[:len(pristine)/2])
		s := openStore(t, dir)
		_, _, err := s.Read(objs[0].id, 1<<24)
		if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotFound) {
			t.Fatalf("an object in an unreadable pack: %v, want ErrCorrupt (not ErrNotFound)", err)
		}
	})
	t.Run("damaged index", func(t *testing.T) {
		defer restore()
		n := len(objs)
		for _, damage := range []func([]byte){
			func(b []byte) { // offsets all pointing into the 64-bit table, which is empty
				for i := idxHeader + n*24; i < idxHeader+n*28; i++ {
					b[i] = 0xff
				}
			},
			func(b []byte) { // names out of order
				for i := idxHeader; i < idxHeader+n*20; i += 3 {
					b[i] ^= 0xff
				}
			},
			func(b []byte) { b[idxHeader-1] = 0 }, // fanout decreasing at the end
			func(b []byte) { b[7] = 3 },           // version
		} {
			damaged := append([]byte(nil), pristineIdx...)
			damage(damaged)
			writeFile(t, idxPath, damaged)
			if failed := readAll(t); failed == 0 {
				t.Fatal("every object read through a damaged index")
			}
		}
	})
	t.Run("index without its pack", func(t *testing.T) {
		defer restore()
		os.Remove(packPath)
		s := openStore(t, dir)
		if _, _, err := s.Read(objs[0].id, 1<<24); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an object whose pack gc deleted: %v, want ErrNotFound", err)
		}
	})
}

// TestNotRegularFiles puts a FIFO and a device where git keeps files: a
// read must fail at once, not block or read the device.
func TestNotRegularFiles(t *testing.T) {
	objects := newObjects(t)
	id := hex.EncodeToString(objectID("blob", []byte("x")))
	loose := filepath.Join(objects, id[:2], id[2:])
	if err := os.MkdirAll(filepath.Dir(loose), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(loose, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	s, err := Open(objects)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Not an object, and not opened.
	if _, _, err := s.Read(id, 100); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a FIFO as a loose object: %v", err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(objects, "pack", "pack-z.pack")); err != nil {
		t.Fatal(err)
	}
	writeIndex(t, filepath.Join(objects, "pack", "pack-z.idx"), make([]byte, 20), nil, false)
	other := hex.EncodeToString(objectID("blob", []byte("y")))
	if _, _, err := s.Read(other, 100); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a device as a pack: %v", err)
	}
	if err := syscall.Mkfifo(filepath.Join(objects, "info", "alternates"), 0o644); err != nil {
		if err := os.MkdirAll(filepath.Join(objects, "info"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(filepath.Join(objects, "info", "alternates"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(objects); err == nil {
		t.Fatal("a FIFO as the alternates file was accepted")
	}
}
