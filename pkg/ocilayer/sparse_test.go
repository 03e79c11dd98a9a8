package ocilayer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// A sparse entry's holes are written as zeros its compressed bytes never
// carried: a 200-byte layer must not become a 256 MiB file. Written bytes
// count against the decompression ratio.
func TestSparseBombRefused(t *testing.T) {
	// Hand-made: a PAX 1.0 sparse file whose map (one data block of 1 byte
	// at the end) precedes its data, as GNU tar writes it.
	layer := sparseLayer(t, 256<<20)
	if h, err := tar.NewReader(bytes.NewReader(layer)).Next(); err != nil || h.Name != "bomb" || h.Size != 256<<20 {
		t.Fatalf("the crafted layer does not read as a 256 MiB sparse file: %+v %v", h, err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(layer)
	zw.Close()
	dst := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Unpack(t.Context(), bytes.NewReader(gz.Bytes()), MediaTypeOCILayerGzip, dst, Options{UIDBase: 100000})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a %d-byte sparse bomb: %v, want the ratio refused", gz.Len(), err)
	}
	var written int64
	filepath.Walk(dst, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			written += fi.Size()
		}
		return nil
	})
	if written > 64<<20 {
		t.Errorf("%d bytes written before the refusal", written)
	}
}

// sparseLayer is a tar holding one PAX 1.0 sparse file of size bytes with
// one byte of data, at its end, written by hand (archive/tar's writer
// will not write a sparse file's records).
func sparseLayer(t *testing.T, size int64) []byte {
	t.Helper()
	var b bytes.Buffer
	record := func(k, v string) string {
		r := " " + k + "=" + v + "\n"
		n := len(r)
		for len(strconv.Itoa(n))+len(r) != n {
			n = len(strconv.Itoa(n)) + len(r)
		}
		return strconv.Itoa(n) + r
	}
	pax := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") + record("GNU.sparse.name", "bomb") +
		record("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	// The sparse map comes first in the data, padded to a block: one data
	// block of one byte at the end.
	m := "1\n" + strconv.FormatInt(size-1, 10) + "\n1\n"
	data := append([]byte(m), make([]byte, 512-len(m))...)
	data = append(data, 'x')
	b.Write(rawHeader("PaxHeaders/bomb", 'x', int64(len(pax))))
	b.Write(padded([]byte(pax)))
	b.Write(rawHeader("GNUSparseFile.0/bomb", '0', int64(len(data))))
	b.Write(padded(data))
	b.Write(make([]byte, 1024))
	return b.Bytes()
}

// rawHeader is a ustar header block.
func rawHeader(name string, typeflag byte, size int64) []byte {
	h := make([]byte, 512)
	copy(h[0:], name)
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], []byte(padOctal(size, 11)+"\x00"))
	copy(h[136:], "00000000000\x00")
	h[156] = typeflag
	copy(h[257:], "ustar\x00")
	copy(h[263:], "00")
	for i := 148; i < 156; i++ {
		h[i] = ' '
	}
	sum := 0
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:], []byte(padOctal(int64(sum), 6)+"\x00 "))
	return h
}

func padOctal(n int64, width int) string {
	s := strconv.FormatInt(n, 8)
	for len(s) < width {
		s = "0" + s
	}
	return s
}

func padded(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}
