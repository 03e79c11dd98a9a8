package ocilayer

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

const bombBytes = 1 << 30

// streamed is a layer written on demand by gen through compress: it is
// never held whole, in memory or on disk. The writer stops when the reader
// does.
func streamed(t *testing.T, compress compressor, gen func(tw *tar.Writer, w io.Writer) error) io.Reader {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		cw := compress(t, pw)
		tw := tar.NewWriter(cw)
		err := gen(tw, cw)
		if err == nil {
			err = cw.Close()
		}
		pw.CloseWithError(err)
	}()
	t.Cleanup(func() {
		pr.CloseWithError(errors.New("test over"))
		<-done
	})
	return pr
}

// zeros writes n zero bytes to w.
func zeros(w io.Writer, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func bombFile(tw *tar.Writer, _ io.Writer) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Mode: 0o644, Size: bombBytes}); err != nil {
		return err
	}
	return zeros(tw, bombBytes)
}

// bombAfterEnd is a small valid tar followed by a gigabyte of zeros,
// which archive/tar never reads but the diff ID must.
func bombAfterEnd(tw *tar.Writer, w io.Writer) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "small", Mode: 0o644, Size: 1}); err != nil {
		return err
	}
	tw.Write([]byte("x"))
	if err := tw.Close(); err != nil {
		return err
	}
	return zeros(w, bombBytes)
}

// duBytes is the disk space the files below dir take.
func duBytes(t *testing.T, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// TestDecompressionBombs: a gigabyte of zeros, gzip'd or zstd'd, in a file
// or after the tar's end, fails fast on the ratio with little memory and
// disk spent, naming the entry it was in.
func TestDecompressionBombs(t *testing.T) {
	for _, c := range []struct {
		name, mediaType string
		compress        compressor
		gen             func(*tar.Writer, io.Writer) error
		want            string
	}{
		{"gzip file", MediaTypeOCILayerGzip, gzipCompressor, bombFile, `layer entry "zeros": decompression ratio over 200`},
		{"zstd file", MediaTypeOCILayerZstd, zstdCompressor, bombFile, `layer entry "zeros": decompression ratio over 200`},
		{"gzip after the end", MediaTypeDockerLayerGzip, gzipCompressor, bombAfterEnd, `layer: after the tar end: decompression ratio over 200`},
		{"zstd after the end", MediaTypeOCILayerZstd, zstdCompressor, bombAfterEnd, `layer: after the tar end: decompression ratio over 200`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			r := streamed(t, c.compress, c.gen)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err := Unpack(context.Background(), r, c.mediaType, s.dst, Options{})
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want %s", err, c.want)
			}
			if elapsed > 10*time.Second {
				t.Errorf("took %v to refuse", elapsed)
			}
			if du := duBytes(t, s.dst); du > 4<<20 {
				t.Errorf("wrote %d bytes before refusing", du)
			}
			// Both the compressor (test side) and the decompressor count here.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
				t.Errorf("allocated %d MiB", alloc>>20)
			}
		})
	}
}

// TestRatioBoundIsAnOption: a layer of incompressible data passes the
// default ratio; a text layer past 1 MiB fails a low MaxRatio.
func TestRatioBoundIsAnOption(t *testing.T) {
	random := make([]byte, 3<<20)
	rand.Read(random)
	s := newSandbox(t)
	if _, err := unpackBytes(t, gzipBytes(t, layerTar(t, reg("random", string(random)))), MediaTypeOCILayerGzip, s.dst, Options{}); err != nil {
		t.Fatalf("incompressible layer: %v", err)
	}
	text := strings.Repeat("all work and no play ", 1<<17)
	s = newSandbox(t)
	_, err := unpackBytes(t, gzipBytes(t, layerTar(t, reg("text", text))), MediaTypeOCILayerGzip, s.dst, Options{MaxRatio: 3})
	if err == nil || !strings.Contains(err.Error(), `layer entry "text": decompression ratio over 3`) {
		t.Errorf("error = %v", err)
	}
	// Under the grace of 1 MiB, any ratio passes.
	s = newSandbox(t)
	if _, err := unpackBytes(t, gzipBytes(t, layerTar(t, reg("small", text[:512<<10]))), MediaTypeOCILayerGzip, s.dst, Options{MaxRatio: 3}); err != nil {
		t.Errorf("small layer: %v", err)
	}
}

// rawZstdFrame is one zstd frame holding data (under 128 KiB) as a raw
// block, whose header asks for a window of 1<<windowLog bytes.
func rawZstdFrame(windowLog int, data []byte) []byte {
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, byte(windowLog-10) << 3}
	bh := len(data)<<3 | 1 // last block, raw
	frame = append(frame, byte(bh), byte(bh>>8), byte(bh>>16))
	return append(frame, data...)
}

// TestZstdWindowBound: a zstd frame that asks for a window past 64 MiB is
// refused before the decoder allocates it; the same frame asking for 1 MiB
// unpacks.
func TestZstdWindowBound(t *testing.T) {
	raw := layerTar(t, reg("f", "x"))
	s := newSandbox(t)
	if _, err := unpackBytes(t, rawZstdFrame(20, raw), MediaTypeOCILayerZstd, s.dst, Options{}); err != nil {
		t.Fatalf("1 MiB window: %v", err)
	}
	s = newSandbox(t)
	_, err := unpackBytes(t, rawZstdFrame(30, raw), MediaTypeOCILayerZstd, s.dst, Options{})
	if err == nil || !strings.Contains(err.Error(), "layer: reading the next tar header: zstd: window size exceeded") {
		t.Errorf("error = %v, want a window size refusal", err)

	}
}

// TestFileSizeFromContent: the bound is checked on what is copied, too;
// archive/tar already refuses content shorter or longer than the header,
// so a layer lying about a size fails naming the entry.
func TestFileSizeFromContent(t *testing.T) {
	raw := layerTar(t, reg("f", "12345678"))
	s := newSandbox(t)
	_, err := unpackBytes(t, raw[:512+4], MediaTypeOCILayer, s.dst, Options{})
	if err == nil || !strings.Contains(err.Error(), `layer entry "f": writing content: unexpected EOF`) {
		t.Errorf("error = %v", err)
	}
}
