package ocilayer

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// entry is one tar entry of a crafted layer.
type entry struct {
	hdr  tar.Header
	body string
}

var epoch = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

func reg(name, body string) entry {
	return entry{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: epoch}, body}
}

func dir(name string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch}}
}

func symlink(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch}}
}

func hardlink(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644, ModTime: epoch}}
}

func node(typ byte, name string) entry {
	return entry{hdr: tar.Header{Typeflag: typ, Name: name, Mode: 0o640, ModTime: epoch}}
}

// with is e changed by f.
func with(e entry, f func(*tar.Header)) entry {
	f(&e.hdr)
	return e
}

// layerTar is the uncompressed tar of ents, in PAX format so that any name
// and xattr fits.
func layerTar(t testing.TB, ents ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := e.hdr
		if h.Format == tar.FormatUnknown {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("tar body %q: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// compressor wraps w in one of the layer compressions.
type compressor func(t testing.TB, w io.Writer) io.WriteCloser

func gzipCompressor(t testing.TB, w io.Writer) io.WriteCloser {
	zw, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		t.Error(err)
	}
	return zw
}

func zstdCompressor(t testing.TB, w io.Writer) io.WriteCloser {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Error(err)
	}
	return zw
}

func compressed(t testing.TB, c compressor, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := c(t, &b)
	zw.Write(raw)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gzipBytes(t testing.TB, raw []byte) []byte { return compressed(t, gzipCompressor, raw) }
func zstdBytes(t testing.TB, raw []byte) []byte { return compressed(t, zstdCompressor, raw) }

func diffID(raw []byte) string {
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// sandbox is a scratch directory holding dst (empty) and canary, a sibling
// with one file no unpack may touch.
type sandbox struct {
	dst, canary string
}

func newSandbox(t testing.TB) sandbox {
	t.Helper()
	base := t.TempDir()
	s := sandbox{filepath.Join(base, "dst"), filepath.Join(base, "canary")}
	for _, d := range []string{s.dst, s.canary} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.canary, "secret"), []byte("canary"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkCanary fails t when anything beside dst changed in the scratch
// directory.
func (s sandbox) checkCanary(t testing.TB) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Dir(s.dst))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 {
		t.Fatalf("scratch directory holds %d entries, want dst and canary", len(ents))
	}
	ents, err = os.ReadDir(s.canary)
	if err != nil || len(ents) != 1 {
		t.Fatalf("canary directory changed: %v entries, %v", len(ents), err)
	}
	fi, err := os.Lstat(filepath.Join(s.canary, "secret"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("canary file changed: %v %v", fi, err)
	}
	if got, _ := os.ReadFile(filepath.Join(s.canary, "secret")); string(got) != "canary" {
		t.Fatalf("canary file content changed: %q", got)
	}
}

func unpackBytes(t testing.TB, raw []byte, mediaType, dst string, opt Options) (Stats, error) {
	t.Helper()
	return Unpack(context.Background(), bytes.NewReader(raw), mediaType, dst, opt)
}

// unpackOK unpacks ents (plain tar) into a new sandbox's dst.
func unpackOK(t testing.TB, opt Options, ents ...entry) (sandbox, Stats) {
	t.Helper()
	s := newSandbox(t)
	st, err := unpackBytes(t, layerTar(t, ents...), MediaTypeOCILayer, s.dst, opt)
	if err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	s.checkCanary(t)
	return s, st
}
