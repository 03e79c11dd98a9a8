package contentcheck

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"
)

func gz(t testing.TB, name string, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	w.Name = name
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// zipOf makes a zip of members (name, content) in order.
func zipOf(t testing.TB, members ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	for i := 0; i < len(members); i += 2 {
		f, err := w.CreateHeader(&zip.FileHeader{Name: members[i], Method: zip.Deflate})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte(members[i+1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func tarOf(t testing.TB, name string, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	if err := w.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func checkOut(t testing.TB, pol Policy, name string, content []byte) []Finding {
	t.Helper()
	return check(t, pol, Input{Out: []OutFile{{Name: name, Content: bytes.NewReader(content)}}})
}

// A token used as an /out file's name is found, as a repository path's
// is.
func TestOutFileNameIsScanned(t *testing.T) {
	name := "reports/" + githubToken(21) + ".txt"
	fs := checkOut(t, Policy{}, name, []byte("nothing here\n"))
	if !hasFinding(fs, "secret.github-pat", "/out/"+name) || !strings.Contains(show(fs), "in the file's name") {
		t.Errorf("a token as an /out name:%s", show(fs))
	}
}

// A token packed in an archive, at any depth up to MaxArchiveDepth, is
// found and named by the member it is in.
func TestOutArchivesAreUnpackedAndScanned(t *testing.T) {
	tok := []byte("token=" + githubToken(22) + "\n")
	for _, tc := range []struct {
		name, file string
		content    []byte
		path       string
	}{
		{"gzip", "dump.gz", gz(t, "", tok), "/out/dump.gz!"},
		{"zip", "dump.zip", zipOf(t, "a.txt", "hello\n", "deep/b.txt", string(tok)), "/out/dump.zip!deep/b.txt"},
		{"zip inside gzip", "dump.zip.gz", gz(t, "", zipOf(t, "b.txt", string(tok))), "/out/dump.zip.gz!!b.txt"},
		{"tar.gz", "dump.tar.gz", gz(t, "", tarOf(t, "etc/b.txt", tok)), "/out/dump.tar.gz!!etc/b.txt"},
		{"gzip in tar in zip", "d.zip", zipOf(t, "x.tar", string(tarOf(t, "y.gz", gz(t, "", tok)))), "/out/d.zip!x.tar!y.gz!"},
		{"member name", "names.zip", zipOf(t, githubToken(23), "x"), "/out/names.zip!" + githubToken(23)},
		{"gzip header name", "h.gz", gz(t, githubToken(24), []byte("x")), "/out/h.gz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := checkOut(t, Policy{}, tc.file, tc.content)
			if !hasFinding(fs, "secret.github-pat", tc.path) {
				t.Errorf("want secret.github-pat on %q:%s", tc.path, show(fs))
			}
		})
	}
	// Clean archives pass.
	for name, content := range map[string][]byte{
		"c.gz": gz(t, "c", []byte("hello\n")), "c.zip": zipOf(t, "a", "hello\n"), "c.tgz": gz(t, "", tarOf(t, "a", []byte("hi\n"))),
	} {
		if fs := checkOut(t, Policy{}, name, content); len(fs) != 0 {
			t.Errorf("clean %s:%s", name, show(fs))
		}
	}
}

// One archive deeper than MaxArchiveDepth is refused, not passed unread.
func TestOutArchiveDepthIsBounded(t *testing.T) {
	tok := []byte("token=" + githubToken(25) + "\n")
	data := tok
	for range MaxArchiveDepth {
		data = gz(t, "", data)
	}
	if fs := checkOut(t, Policy{}, "deep.gz", data); !hasFinding(fs, "secret.github-pat", "") {
		t.Errorf("%d gzip layers:%s", MaxArchiveDepth, show(fs))
	}
	if fs := checkOut(t, Policy{}, "deeper.gz", gz(t, "", data)); !hasFinding(fs, RuleArchiveUnscannable, "/out/deeper.gz") {
		t.Errorf("%d gzip layers:%s", MaxArchiveDepth+1, show(fs))
	}
}

// deflatedZeros is a raw deflate stream of n zeros (a multiple of 1 MiB),
// made by compressing 2 MiB: after a sync flush the compressor's state is
// the same at every MiB of zeros, so the MiB's blocks can be repeated.
func deflatedZeros(t testing.TB, n int) *bytes.Buffer {
	t.Helper()
	var out, buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestCompression)
	mib := make([]byte, 1<<20)
	w.Write(mib)
	w.Flush()
	out.Write(buf.Bytes())
	buf.Reset()
	w.Write(mib)
	w.Flush()
	steady := bytes.Clone(buf.Bytes())
	for range n>>20 - 1 {
		out.Write(steady)
	}
	buf.Reset()
	w.Close()
	out.Write(buf.Bytes())
	return &out
}

// A bomb (a GiB of zeros in a MiB) is refused within its first MiBs: in
// little time and memory, as a zip, a gzip and a gzip of that gzip.
func TestOutArchiveBombIsRefusedQuickly(t *testing.T) {
	// The construction holds: 8 MiB of it inflate to 8 MiB of zeros.
	small, err := io.ReadAll(flate.NewReader(deflatedZeros(t, 8<<20)))
	if err != nil || len(small) != 8<<20 || bytes.ContainsFunc(small, func(r rune) bool { return r != 0 }) {
		t.Fatalf("deflatedZeros(8 MiB) inflates to %d bytes (%v)", len(small), err)
	}
	packed := deflatedZeros(t, 1<<30)
	// The same deflate stream as a gzip member and as a zip member.
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	f, err := zw.CreateRaw(&zip.FileHeader{Name: "zeros", Method: zip.Deflate, CompressedSize64: uint64(packed.Len()), UncompressedSize64: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	f.Write(packed.Bytes())
	zw.Close()
	// And as a gzip member: header, the deflate stream, CRC-32 and size.
	sum := uint32(0)
	block := make([]byte, 1<<20)
	for range 1 << 10 {
		sum = crc32.Update(sum, crc32.IEEETable, block)
	}
	gb := bytes.NewBuffer([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
	gb.Write(packed.Bytes())
	gb.Write(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, sum), 0))
	t.Logf("a GiB of zeros: %d bytes as zip, %d as gzip", zb.Len(), gb.Len())

	for name, data := range map[string][]byte{"bomb.zip": zb.Bytes(), "bomb.gz": gb.Bytes(), "bomb.gz.gz": gz(t, "", gb.Bytes())} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		u := &unpacker{c: checkerAt(t, DefaultDecodeDepth), r: newReport(), budget: 2 << 30, left: 2 << 30}
		_, err := u.scan(context.Background(), "/out/"+name, bytes.NewReader(data), 2<<30, 0)
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		alloc, unpacked := after.TotalAlloc-before.TotalAlloc, u.budget-u.left
		t.Logf("%s: refused in %v, %d KiB unpacked, %d MiB allocated", name, took, unpacked>>10, alloc>>20)
		var un *unscannable
		if !errors.As(err, &un) || !strings.Contains(un.reason, "for each packed byte") {
			t.Errorf("%s: %v, want refused by the ratio", name, err)
		}
		// Stopped within its first MiBs (all layers counted), having
		// allocated in all (not at once) a small part of the GiB.
		if unpacked > 4<<20 || alloc > 128<<20 {
			t.Errorf("%s: %d bytes unpacked and %d MiB allocated, want a bomb stopped early", name, unpacked, alloc>>20)
		}
	}
	if fs := checkOut(t, Policy{MaxFileBytes: 2 << 30}, "bomb.gz", gb.Bytes()); !hasFinding(fs, RuleArchiveUnscannable, "/out/bomb.gz") {
		t.Errorf("bomb.gz:%s", show(fs))
	}

	// Within the ratio, unpacked past what a file may hold: refused too.
	text := []byte(strings.Repeat("line of some text that compresses only so far 0123456789\n", 40000))
	if fs := checkOut(t, Policy{MaxFileBytes: 1 << 20}, "big.gz", gz(t, "", text)); !hasFinding(fs, RuleArchiveUnscannable, "/out/big.gz") {
		t.Errorf("%d bytes unpacked past a 1 MiB cap:%s", len(text), show(fs))
	}
}

// An archive that does not unpack is refused, never passed as opaque
// bytes.
func TestOutCorruptArchivesAreRefused(t *testing.T) {
	tok := []byte("token=" + githubToken(26) + "\n")
	good := gz(t, "", bytes.Repeat(tok, 50))
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0xff
	z := zipOf(t, "a.txt", string(tok))
	var enc bytes.Buffer
	zw := zip.NewWriter(&enc)
	f, _ := zw.CreateHeader(&zip.FileHeader{Name: "secret.txt", Method: zip.Store, Flags: 0x1})
	f.Write([]byte("opaque ciphertext of the member"))
	zw.Close()
	for name, data := range map[string][]byte{
		"header only.gz": {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0xff, 0x01, 0x02},
		"flipped.gz":     flipped,
		"truncated.gz":   good[:len(good)-10],
		"broken.zip":     append([]byte("PK\x03\x04"), bytes.Repeat([]byte{0x41}, 200)...),
		"truncated.zip":  z[:len(z)-30],
		"encrypted.zip":  enc.Bytes(),
	} {
		if fs := checkOut(t, Policy{}, name, data); !hasFinding(fs, RuleArchiveUnscannable, "/out/"+name) {
			t.Errorf("%s:%s", name, show(fs))
		}
	}
	// The check's own failure to read stays an error, not a finding.
	if _, err := checkerAt(t, 2).CheckOut(context.Background(), Policy{},
		OutFile{Name: "r.gz", Content: io.MultiReader(bytes.NewReader(good[:100]), errReader{io.ErrClosedPipe})}); err == nil {
		t.Error("a read error inside a gzip was taken as a finding")
	}
}
