package ocilayer

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/bits"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// compression is how a layer's tar stream is encoded.
type compression int

const (
	plain compression = iota
	gzipped
	zstandard
)

// zstdMaxWindow bounds the memory a zstd frame may ask the decoder for.
const zstdMaxWindow = 64 << 20

func compressionOf(mediaType string) (compression, error) {
	switch mediaType {
	case MediaTypeOCILayer, MediaTypeOCINondistributableLayer, MediaTypeDockerLayer:
		return plain, nil
	case MediaTypeOCILayerGzip, MediaTypeOCINondistributableLayerGzip, MediaTypeDockerLayerGzip, MediaTypeDockerForeignLayerGzip:
		return gzipped, nil
	case MediaTypeOCILayerZstd, MediaTypeOCINondistributableLayerZstd:
		return zstandard, nil
	}
	return 0, fmt.Errorf("%w: ocilayer: unknown layer media type %q", errdefs.ErrInvalidArgument, mediaType)
}

// counter counts the bytes read through it.
type counter struct {
	r io.Reader
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// stream is the uncompressed tar stream: it hashes what it yields (the
// diff ID) and fails, for good, once the decompression ratio is passed.
type stream struct {
	compressed *counter
	src        io.Reader
	close      func()
	hash       hash.Hash
	n          int64 // uncompressed bytes yielded
	maxRatio   int64
	err        error // sticky refusal
}

func newStream(r io.Reader, comp compression, maxRatio int64) (*stream, error) {
	s := &stream{compressed: &counter{r: r}, hash: sha256.New(), maxRatio: maxRatio, close: func() {}}
	switch comp {
	case plain:
		s.src = s.compressed
	case gzipped:
		// gzip.NewReader reads the header now; a failure there is the
		// layer's, named like any other stream failure.
		s.src = &lazyGzip{r: s.compressed}
	case zstandard:
		d, err := zstd.NewReader(s.compressed,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxWindow(zstdMaxWindow),
			zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, fmt.Errorf("ocilayer: zstd: %w", err)
		}
		s.src, s.close = zstdReader{d}, d.Close
	}
	return s, nil
}

func (s *stream) Close() { s.close() }

func (s *stream) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.src.Read(p)
	s.hash.Write(p[:n])
	s.n += int64(n)
	if s.n > ratioGrace && s.overRatio() {
		s.err = overBound("decompression ratio over %d", s.maxRatio)
		return n, s.err
	}
	return n, err
}

// overRatio reports whether uncompressed > maxRatio*compressed, without
// overflowing.
func (s *stream) overRatio() bool { return s.past(s.n) }

// past reports whether n bytes are more than maxRatio times the compressed
// bytes read so far.
func (s *stream) past(n int64) bool {
	hi, lo := bits.Mul64(uint64(s.maxRatio), uint64(s.compressed.n))
	return hi == 0 && uint64(n) > lo
}

// cause is err, or the stream's own refusal that err is what a reader
// above the stream made of.
func (s *stream) cause(err error) error {
	if s.err != nil {
		return s.err
	}
	return err
}

// zstdReader says its errors are zstd's, as the gzip reader's say theirs are.
type zstdReader struct{ d *zstd.Decoder }

func (z zstdReader) Read(p []byte) (int, error) {
	n, err := z.d.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("zstd: %w", err)
	}
	return n, err
}

// lazyGzip opens the gzip stream on the first read.
type lazyGzip struct {
	r  io.Reader
	gz *gzip.Reader
}

func (l *lazyGzip) Read(p []byte) (int, error) {
	if l.gz == nil {
		gz, err := gzip.NewReader(l.r)
		if err != nil {
			return 0, fmt.Errorf("gzip: %w", err)
		}
		l.gz = gz
	}
	return l.gz.Read(p)
}

// CheckMediaType says whether Unpack takes layers of mediaType, before any
// of their bytes are fetched.
func CheckMediaType(mediaType string) error {
	_, err := compressionOf(mediaType)
	return err
}
