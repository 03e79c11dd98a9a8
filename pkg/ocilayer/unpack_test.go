package ocilayer

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

const testBase = 100000

var later = epoch.Add(48 * time.Hour)

// realistic is a layer with every kind of entry an image carries.
func realistic() []entry {
	xattrs := func(h *tar.Header) {
		h.PAXRecords = map[string]string{
			"SCHILY.xattr.user.mime":                "text/x-tool",
			"SCHILY.xattr.user.overlay.redirect":    "/etc",
			"SCHILY.xattr.trusted.overlay.redirect": "/etc",
			"SCHILY.xattr.trusted.overlay.metacopy": "",
			"SCHILY.xattr.security.capability":      "\x01\x00\x00\x02",
			"SCHILY.xattr.system.posix_acl_access":  "x",
			"LIBARCHIVE.xattr.user.encoded":         "eA==",
		}
	}
	return []entry{
		with(dir("./"), func(h *tar.Header) { h.Mode = 0o755; h.ModTime = later }),
		dir("usr/"),
		with(dir("usr/bin/"), func(h *tar.Header) { h.ModTime = later }),
		with(reg("usr/bin/tool", "#!/bin/sh\necho tool\n"), func(h *tar.Header) { h.Mode = 0o755; xattrs(h) }),
		with(reg("usr/bin/passwd", "passwd"), func(h *tar.Header) { h.Mode = 0o4755 }),
		with(reg("usr/bin/wall", "wall"), func(h *tar.Header) { h.Mode = 0o2755; h.Gid = 5 }),
		with(reg("usr/bin/sticky", "s"), func(h *tar.Header) { h.Mode = 0o1644 }),
		hardlink("usr/bin/tool2", "usr/bin/tool"),
		dir("usr/lib/"),
		with(symlink("usr/lib/tool.so", "../bin/tool"), func(h *tar.Header) { h.Uid, h.Gid = 2, 3 }),
		dir("etc/"),
		symlink("etc/abs", "/usr/bin/tool"),
		with(dir("tmp/"), func(h *tar.Header) { h.Mode = 0o1777 }),
		with(dir("var/"), func(h *tar.Header) {
			h.PAXRecords = map[string]string{"SCHILY.xattr.user.dir": "d", "SCHILY.xattr.trusted.overlay.opaque": "y"}
		}),
		dir("run/"),
		with(node(tar.TypeFifo, "run/fifo"), func(h *tar.Header) { h.Mode = 0o640; h.Uid = 7 }),
		dir("home/"),
		with(dir("home/u/"), func(h *tar.Header) { h.Mode = 0o700; h.Uid, h.Gid = 1000, 1000 }),
		with(reg("home/u/big-id", "x"), func(h *tar.Header) { h.Uid, h.Gid = 70000, 1<<31-1 }),
		reg("etc/.wh.old", ""),
		reg("var/.wh..wh..opq", ""),
		reg(".wh..wh.plnk.1234", ""),
		with(reg("usr/bin/times", "t"), func(h *tar.Header) { h.AccessTime = later; h.ModTime = epoch }),
		{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "hi"}}},
	}
}

// TestRealisticLayer: a layer of directories, files, symlinks, hardlinks, a
// FIFO and whiteouts comes out with the modes, owners, times and xattrs
// the rules give it, and Stats says what was dropped.
func TestRealisticLayer(t *testing.T) {
	raw := layerTar(t, realistic()...)
	s := newSandbox(t)
	st, err := unpackBytes(t, raw, MediaTypeOCILayer, s.dst, Options{UIDBase: testBase, IDRange: 65536})
	if err != nil {
		t.Fatal(err)
	}
	s.checkCanary(t)
	if st.DiffID != diffID(raw) {
		t.Errorf("DiffID = %s, want %s", st.DiffID, diffID(raw))
	}
	if st.Entries != len(realistic()) {
		t.Errorf("Entries = %d, want %d", st.Entries, len(realistic()))
	}
	if want := int64(len("#!/bin/sh\necho tool\n") + len("passwd") + len("wall") + 1 + 1 + 1); st.Bytes != want {
		t.Errorf("Bytes = %d, want %d", st.Bytes, want)
	}

	type want struct {
		typ      fs.FileMode
		perm     fs.FileMode // with setuid, setgid, sticky as fs spells them
		uid, gid uint32
		mtime    time.Time
	}
	nobody := uint32(testBase + 65534)
	for rel, w := range map[string]want{
		".":               {fs.ModeDir, 0o755, testBase, testBase, later},
		"usr":             {fs.ModeDir, 0o755, testBase, testBase, epoch},
		"usr/bin":         {fs.ModeDir, 0o755, testBase, testBase, later},
		"usr/bin/tool":    {0, 0o755, testBase, testBase, epoch},
		"usr/bin/passwd":  {0, 0o755, testBase, testBase, epoch},
		"usr/bin/wall":    {0, 0o755, testBase, testBase + 5, epoch},
		"usr/bin/sticky":  {0, 0o644, testBase, testBase, epoch},
		"usr/bin/times":   {0, 0o644, testBase, testBase, epoch},
		"usr/lib/tool.so": {fs.ModeSymlink, 0o777, testBase + 2, testBase + 3, epoch},
		"etc/abs":         {fs.ModeSymlink, 0o777, testBase, testBase, epoch},
		"tmp":             {fs.ModeDir, 0o777 | fs.ModeSticky, testBase, testBase, epoch},
		"run":             {fs.ModeDir, 0o755, testBase, testBase, epoch},
		"run/fifo":        {fs.ModeNamedPipe, 0o640, testBase + 7, testBase, epoch},
		"home/u":          {fs.ModeDir, 0o700, testBase + 1000, testBase + 1000, epoch},
		"home/u/big-id":   {0, 0o644, nobody, nobody, epoch},
		"etc/old":         {fs.ModeDevice | fs.ModeCharDevice, 0, testBase, testBase, epoch},
	} {
		fi, err := os.Lstat(filepath.Join(s.dst, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		sys := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Type() != w.typ || fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != w.perm {
			t.Errorf("%s: mode %v, want type %v perm %v", rel, fi.Mode(), w.typ, w.perm)
		}
		if sys.Uid != w.uid || sys.Gid != w.gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", rel, sys.Uid, sys.Gid, w.uid, w.gid)
		}
		if !w.mtime.IsZero() && !fi.ModTime().Equal(w.mtime) {
			t.Errorf("%s: mtime %v, want %v", rel, fi.ModTime(), w.mtime)
		}
		if rel == "etc/old" && sys.Rdev != 0 {
			t.Errorf("whiteout device %d, want 0:0", sys.Rdev)
		}
	}
	var times syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(s.dst, "usr/bin/times"), &times); err != nil || time.Unix(times.Atim.Unix()).Unix() != later.Unix() {
		t.Errorf("usr/bin/times: atime %v, want %v (%v)", time.Unix(times.Atim.Unix()), later, err)
	}
	if got, _ := os.Readlink(filepath.Join(s.dst, "usr/lib/tool.so")); got != "../bin/tool" {
		t.Errorf("usr/lib/tool.so -> %q", got)
	}
	if got, _ := os.Readlink(filepath.Join(s.dst, "etc/abs")); got != "/usr/bin/tool" {
		t.Errorf("etc/abs -> %q", got)
	}
	a, _ := os.Stat(filepath.Join(s.dst, "usr/bin/tool"))
	b, _ := os.Stat(filepath.Join(s.dst, "usr/bin/tool2"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Errorf("usr/bin/tool2 is not a hardlink of usr/bin/tool")
	}
	if _, err := os.Lstat(filepath.Join(s.dst, ".wh..wh.plnk.1234")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a .wh..wh. marker was written: %v", err)
	}

	wantXattrs := map[string]map[string]string{
		"usr/bin/tool": {"user.mime": "text/x-tool"},
		"var":          {"user.dir": "d", "trusted.overlay.opaque": "y"},
		"usr/bin":      {},
	}
	for rel, want := range wantXattrs {
		if got := xattrsOf(t, filepath.Join(s.dst, rel)); !equalMaps(got, want) {
			t.Errorf("%s: xattrs %v, want %v", rel, got, want)
		}
	}
	for _, d := range []string{
		"usr/bin/passwd: setuid bit dropped",
		"usr/bin/wall: setgid bit dropped",
		"usr/bin/sticky: sticky bit dropped",
		"usr/bin/tool: xattr trusted.overlay.redirect dropped",
		"usr/bin/tool: xattr trusted.overlay.metacopy dropped",
		"usr/bin/tool: xattr security.capability dropped",
		"usr/bin/tool: xattr system.posix_acl_access dropped",
		"usr/bin/tool: xattr user.overlay.redirect dropped",
		"usr/bin/tool: xattr user.encoded dropped",
		"var: xattr trusted.overlay.opaque dropped",
		".wh..wh.plnk.1234: unknown whiteout marker ignored",
	} {
		if !slices.Contains(st.Dropped, d) {
			t.Errorf("Dropped lacks %q: %q", d, st.Dropped)
		}
	}
	if st.DroppedTotal != len(st.Dropped) {
		t.Errorf("DroppedTotal %d, Dropped %d", st.DroppedTotal, len(st.Dropped))
	}
}

func xattrsOf(t *testing.T, p string) map[string]string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	got := map[string]string{}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if name == "" || strings.HasPrefix(name, "security.selinux") {
			continue
		}
		v := make([]byte, 4096)
		m, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, name, err)
		}
		got[name] = string(v[:m])
	}
	return got
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestDroppedIsBounded: Dropped lists the first 100, DroppedTotal counts all.
func TestDroppedIsBounded(t *testing.T) {
	var ents []entry
	for i := range 150 {
		ents = append(ents, with(reg(fmt.Sprintf("f%d", i), ""), func(h *tar.Header) { h.Mode = 0o4755 }))
	}
	_, st := unpackOK(t, Options{}, ents...)
	if len(st.Dropped) != 100 || st.DroppedTotal != 150 {
		t.Errorf("Dropped %d, DroppedTotal %d; want 100, 150", len(st.Dropped), st.DroppedTotal)
	}
}

// tree is a comparable listing of dir: each path with its type, mode,
// owner, size, mtime, link target or content.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		sys := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %v %d:%d %d", rel, fi.Mode(), sys.Uid, sys.Gid, fi.ModTime().UnixNano())
		switch {
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCompressionsAgree: the same layer as tar, tar+gzip and tar+zstd (under
// each media type) gives the same tree and the same DiffID, the digest of
// the uncompressed tar.
func TestCompressionsAgree(t *testing.T) {
	raw := layerTar(t, realistic()...)
	var first []string
	for _, c := range []struct {
		mediaType string
		data      []byte
	}{
		{MediaTypeOCILayer, raw},
		{MediaTypeDockerLayer, raw},
		{MediaTypeOCINondistributableLayer, raw},
		{MediaTypeOCILayerGzip, gzipBytes(t, raw)},
		{MediaTypeDockerLayerGzip, gzipBytes(t, raw)},
		{MediaTypeDockerForeignLayerGzip, gzipBytes(t, raw)},
		{MediaTypeOCINondistributableLayerGzip, gzipBytes(t, raw)},
		{MediaTypeOCILayerZstd, zstdBytes(t, raw)},
		{MediaTypeOCINondistributableLayerZstd, zstdBytes(t, raw)},
	} {
		s := newSandbox(t)
		st, err := unpackBytes(t, c.data, c.mediaType, s.dst, Options{UIDBase: testBase})
		if err != nil {
			t.Fatalf("%s: %v", c.mediaType, err)
		}
		if st.DiffID != diffID(raw) {
			t.Errorf("%s: DiffID %s, want %s", c.mediaType, st.DiffID, diffID(raw))
		}
		got := listing(t, s.dst)
		if first == nil {
			first = got
		} else if !slices.Equal(got, first) {
			t.Errorf("%s: tree differs:\n%s\nwant\n%s", c.mediaType, strings.Join(got, "\n"), strings.Join(first, "\n"))
		}
	}
}

// TestDiffIDCoversPadding: bytes after the tar's end-of-archive blocks are
// part of the diff ID, as the registry's tools count them.
func TestDiffIDCoversPadding(t *testing.T) {
	raw := append(layerTar(t, reg("f", "x")), make([]byte, 20000)...)
	for _, c := range []struct {
		mediaType string
		data      []byte
	}{{MediaTypeOCILayer, raw}, {MediaTypeOCILayerGzip, gzipBytes(t, raw)}, {MediaTypeOCILayerZstd, zstdBytes(t, raw)}} {
		s := newSandbox(t)
		st, err := unpackBytes(t, c.data, c.mediaType, s.dst, Options{})
		if err != nil || st.DiffID != diffID(raw) {
			t.Errorf("%s: DiffID %s, %v; want %s", c.mediaType, st.DiffID, err, diffID(raw))
		}
	}
}

// TestBytesAfterTheEndCount: what follows the tar end counts against
// MaxTotalBytes, so a layer cannot make Unpack hash without end.
func TestBytesAfterTheEndCount(t *testing.T) {
	trailer := make([]byte, 4096)
	rand.Read(trailer)
	raw := append(layerTar(t, reg("f", "123")), trailer...)
	s := newSandbox(t)
	_, err := unpackBytes(t, raw, MediaTypeOCILayer, s.dst, Options{MaxTotalBytes: 4000})
	if err == nil || !strings.Contains(err.Error(), "layer: after the tar end: layer over the bound of 4000 bytes") || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("error = %v", err)
	}
	s = newSandbox(t)
	if st, err := unpackBytes(t, raw, MediaTypeOCILayer, s.dst, Options{MaxTotalBytes: 4099}); err != nil || st.DiffID != diffID(raw) {
		t.Errorf("within the bound: %v, %v", st, err)
	}
}

// TestCorruptCompressedStream: a gzip layer whose checksum is wrong fails,
// even when the corruption is past the tar's end.
func TestCorruptCompressedStream(t *testing.T) {
	gz := gzipBytes(t, layerTar(t, reg("f", "x")))
	gz[len(gz)-8] ^= 0xff // the CRC-32
	s := newSandbox(t)
	if _, err := unpackBytes(t, gz, MediaTypeOCILayerGzip, s.dst, Options{}); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("error = %v, want a checksum error", err)
	}
}

// TestDuplicates: a later entry replaces an earlier one of the same name;
// a directory over a directory only updates its metadata; anything else
// over a directory removes the tree first, without following its links.
func TestDuplicates(t *testing.T) {
	s := newSandbox(t)
	ents := []entry{
		reg("f", "first"),
		reg("f", "second"),
		dir("d/"),
		reg("d/kept", "kept"),
		with(dir("d/"), func(h *tar.Header) { h.Mode = 0o750; h.Uid = 9 }),
		dir("tree/"),
		dir("tree/sub/"),
		reg("tree/sub/x", "x"),
		symlink("tree/sub/out", s.canary),
		symlink("tree/abs", filepath.Join(s.canary, "secret")),
		reg("tree", "now a file"),
		reg("was-file", "x"),
		dir("was-file/"),
		reg("a", "shared"),
		hardlink("b", "a"),
		reg("a", "replaced"),
		reg("wh", "there"),
		reg(".wh.wh", ""),
	}
	if _, err := unpackBytes(t, layerTar(t, ents...), MediaTypeOCILayer, s.dst, Options{}); err != nil {
		t.Fatal(err)
	}
	s.checkCanary(t)
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(s.dst, rel))
		if err != nil {
			return err.Error()
		}
		return string(b)
	}
	for rel, want := range map[string]string{"f": "second", "d/kept": "kept", "tree": "now a file", "a": "replaced", "b": "shared"} {
		if got := read(rel); got != want {
			t.Errorf("%s = %q, want %q", rel, got, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(s.dst, "d")); err != nil || fi.Mode().Perm() != 0o750 || fi.Sys().(*syscall.Stat_t).Uid != 9 {
		t.Errorf("d: %v %v, want 0750 uid 9", fi.Mode(), err)
	}
	if fi, err := os.Lstat(filepath.Join(s.dst, "was-file")); err != nil || !fi.IsDir() {
		t.Errorf("was-file: %v, want a directory", err)
	}
	if fi, err := os.Lstat(filepath.Join(s.dst, "wh")); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		t.Errorf("wh: %v, want a whiteout", err)
	}
}

// TestImplicitParents: an entry whose directories the layer does not list
// gets them, 0755 and owned by the namespace's root.
func TestImplicitParents(t *testing.T) {
	s, _ := unpackOK(t, Options{UIDBase: testBase}, reg("a/b/c", "x"))
	fi, err := os.Lstat(filepath.Join(s.dst, "a/b"))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != testBase {
		t.Errorf("a/b: %v %v", fi, err)
	}
}

func TestUnknownMediaType(t *testing.T) {
	s := newSandbox(t)
	const mt = "application/vnd.oci.image.layer.v1.tar+lz4"
	_, err := unpackBytes(t, layerTar(t, reg("f", "x")), mt, s.dst, Options{})
	if err == nil || !strings.Contains(err.Error(), `unknown layer media type "`+mt+`"`) || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("error = %v", err)
	}
}

func TestDestinationMustBeEmptyDirectory(t *testing.T) {
	s := newSandbox(t)
	raw := layerTar(t, reg("f", "x"))
	link := filepath.Join(filepath.Dir(s.dst), "link")
	if err := os.Symlink(s.dst, link); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{s.canary, filepath.Join(s.canary, "secret"), link, filepath.Join(s.dst, "missing")} {
		if _, err := unpackBytes(t, raw, MediaTypeOCILayer, dst, Options{}); err == nil {
			t.Errorf("Unpack into %s succeeded", dst)
		}
	}
	os.Remove(link)
	s.checkCanary(t)
}

func TestBadOptions(t *testing.T) {
	s := newSandbox(t)
	for _, opt := range []Options{{IDRange: 1}, {UIDBase: 1<<32 - 10, IDRange: 65536}} {
		if _, err := unpackBytes(t, layerTar(t, reg("f", "x")), MediaTypeOCILayer, s.dst, opt); err == nil {
			t.Errorf("Unpack with %+v succeeded", opt)
		}
	}
}

// TestCancelBetweenEntries: a cancelled context stops the unpack.
func TestCancelBetweenEntries(t *testing.T) {
	s := newSandbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Unpack(ctx, bytes.NewReader(layerTar(t, reg("f", "x"))), MediaTypeOCILayer, s.dst, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error = %v, want context.Canceled", err)
	}
}
