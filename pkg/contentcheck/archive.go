package contentcheck

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	gitleaksreport "github.com/zricethezav/gitleaks/v8/report"
)

// An /out file that is a gzip stream, a zip or a tar archive is unpacked
// and what it holds is scanned too (names included), as deep as
// MaxArchiveDepth archives within archives: a token zipped is as much a
// token. Unpacking is bounded the way decoding is (DecodeDepth): in
// depth, in the bytes unpacked (all layers of one /out file together at
// most the policy's MaxFileBytes, the cap on any file), in the ratio of
// unpacked to packed bytes (maxUnpackRatio, past unpackRatioFloor, so a
// bomb stops within its first MiBs), and in entries. An archive over a
// bound, or one that does not unpack (corrupt, truncated, encrypted, an
// unknown method), is a RuleArchiveUnscannable finding: refused, never
// passed unread. A member's findings name it "/out/NAME!MEMBER" ("!" alone
// for a gzip stream's content).

// MaxArchiveDepth is how many archives within archives an /out file may
// hold; one deeper is unscannable.
const MaxArchiveDepth = 3

const (
	maxUnpackRatio    = 100
	unpackRatioFloor  = 1 << 20
	maxArchiveEntries = 10000
	// sniffBytes is what is read ahead to recognise an archive: a tar
	// header's "ustar" magic sits at offset 257.
	sniffBytes = 512
)

// RuleArchiveUnscannable is an /out archive that could not be unpacked
// whole within the bounds: what it holds was not scanned.
const RuleArchiveUnscannable = "archive.unscannable"

// unpacker scans one /out file and what it unpacks to.
type unpacker struct {
	c      *Checker
	r      *report
	budget int64 // unpacked bytes allowed in all
	left   int64 // of them, not yet unpacked
}

// unscannable is a bound broken or an archive that does not unpack; it
// becomes a finding, not an error.
type unscannable struct{ reason string }

func (e *unscannable) Error() string { return e.reason }

// sourceError is a failure to read the /out file itself (the bundle): an
// error of the check, not a finding.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = &sourceError{err}
	}
	return n, err
}

// scan scans what r yields, at most limit bytes (more reports whether it
// held more), unpacking an archive found at depth.
func (u *unpacker) scan(ctx context.Context, path string, r io.Reader, limit int64, depth int) (more bool, err error) {
	// The head is read, not peeked through a buffer: a stream is read
	// no further than the scan asks.
	head := make([]byte, min(sniffBytes, limit+1))
	n, err := io.ReadFull(r, head)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return false, err
	}
	head = head[:n]
	br := io.MultiReader(bytes.NewReader(head), r)
	kind := archiveKind(head)
	if kind == "" {
		return u.c.scanStream(ctx, path, br, limit, u.secret(path, ""))
	}
	if depth >= MaxArchiveDepth {
		return false, &unscannable{fmt.Sprintf("a %s archive nested more than %d archives deep", kind, MaxArchiveDepth)}
	}
	in := &limitedReader{r: br, left: limit}
	switch kind {
	case "gzip":
		err = u.gzip(ctx, path, in, depth)
	case "zip":
		err = u.zip(ctx, path, in, depth)
	case "tar":
		err = u.tar(ctx, path, in, depth)
	}
	if errors.Is(err, errOverLimit) {
		return true, nil
	}
	return false, err
}

func archiveKind(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return "gzip"
	case bytes.HasPrefix(head, []byte("PK\x03\x04")), bytes.HasPrefix(head, []byte("PK\x05\x06")):
		return "zip"
	case len(head) >= 262 && string(head[257:262]) == "ustar":
		return "tar"
	}
	return ""
}

// secret reports a detector finding on path.
func (u *unpacker) secret(path, where string) func(gitleaksreport.Finding, int) {
	return func(f gitleaksreport.Finding, line int) { u.r.add(secretFinding(f, path, line, where)) }
}

// name scans a name (a file's, a member's, a header's) as text.
func (u *unpacker) name(ctx context.Context, path, name, where string) error {
	if name == "" {
		return nil
	}
	return u.c.scanLines(ctx, "", []Line{{Text: []byte(name)}}, func(f gitleaksreport.Finding, _ Line) {
		u.r.add(secretFinding(f, path, 0, where))
	})
}

// member scans what one archive member unpacks to, charged to the budget
// and held to the ratio against packed (the packed bytes read so far).
func (u *unpacker) member(ctx context.Context, path string, r io.Reader, packed func() int64, depth int) error {
	more, err := u.scan(ctx, path, &unpackReader{r: r, u: u, packed: packed}, u.left, depth+1)
	if (err == nil && more) || errors.Is(err, errOverLimit) {
		err = u.overBudget()
	}
	return err
}

func (u *unpacker) gzip(ctx context.Context, path string, in *limitedReader, depth int) error {
	br := bufio.NewReader(in)
	zr, err := gzip.NewReader(br)
	if err != nil {
		return unpackError("gzip", err)
	}
	zr.Multistream(false) // each member's header is scanned
	for {
		if err := u.name(ctx, path, zr.Name, " (in the gzip header's name)"); err != nil {
			return err
		}
		if err := u.name(ctx, path, zr.Comment, " (in the gzip header's comment)"); err != nil {
			return err
		}
		if err := u.member(ctx, path+"!", zr, in.read, depth); err != nil {
			return unpackError("gzip", err)
		}
		if err := zr.Reset(br); err == io.EOF {
			return nil
		} else if err != nil {
			return unpackError("gzip", err)
		}
	}
}

func (u *unpacker) zip(ctx context.Context, path string, in *limitedReader, depth int) error {
	// A zip is read from its end: it is kept in a file of its own (at
	// most the limit) while it is read.
	f, err := os.CreateTemp("", "airlock-contentcheck-*.zip")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	size, err := io.Copy(f, in)
	if err != nil {
		return unpackError("zip", err)
	}
	// Bytes no member holds (before, between, after the members) are
	// scanned as they are.
	if _, err := u.c.scanStream(ctx, path, io.NewSectionReader(f, 0, size), size, u.secret(path, "")); err != nil {
		return err
	}
	zr, err := zip.NewReader(f, size)
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return unpackError("zip", err)
	}
	if len(zr.File) > maxArchiveEntries {
		return &unscannable{fmt.Sprintf("a zip archive of more than %d entries", maxArchiveEntries)}
	}
	if err := u.name(ctx, path, zr.Comment, " (in the zip's comment)"); err != nil {
		return err
	}
	for _, e := range zr.File {
		p := path + "!" + e.Name
		if err := u.name(ctx, p, e.Name, " (in the member's name)"); err != nil {
			return err
		}
		if err := u.name(ctx, p, e.Comment, " (in the member's comment)"); err != nil {
			return err
		}
		if e.Flags&0x1 != 0 {
			return &unscannable{"a zip member that is encrypted: " + e.Name}
		}
		if err := u.zipMember(ctx, p, e, depth); err != nil {
			return unpackError("zip", err)
		}
	}
	return nil
}

// zipMember unpacks one member itself, from its raw bytes, so that the
// ratio counts the packed bytes read so far, not the size the header
// claims.
func (u *unpacker) zipMember(ctx context.Context, path string, e *zip.File, depth int) error {
	raw, err := e.OpenRaw()
	if err != nil {
		return err
	}
	packed := &limitedReader{r: raw, left: int64(min(e.CompressedSize64, 1<<62))}
	var body io.Reader
	switch e.Method {
	case zip.Store:
		body = packed
	case zip.Deflate:
		fr := flate.NewReader(packed)
		defer fr.Close()
		body = fr
	default:
		return &unscannable{fmt.Sprintf("a zip member packed by method %d, which is not unpacked here: %s", e.Method, e.Name)}
	}
	sum := crc32.NewIEEE()
	if err := u.member(ctx, path, io.TeeReader(body, sum), packed.read, depth); err != nil {
		return err
	}
	if sum.Sum32() != e.CRC32 && e.CRC32 != 0 {
		return &unscannable{"a zip member whose checksum does not match: " + e.Name}
	}
	return nil
}

func (u *unpacker) tar(ctx context.Context, path string, in *limitedReader, depth int) error {
	tr := tar.NewReader(in)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			// What follows the archive's end is scanned as it is.
			_, err := u.c.scanStream(ctx, path, in, in.left, u.secret(path, ""))
			return err
		}
		if err != nil {
			return unpackError("tar", err)
		}
		if n >= maxArchiveEntries {
			return &unscannable{fmt.Sprintf("a tar archive of more than %d entries", maxArchiveEntries)}
		}
		p := path + "!" + h.Name
		for _, s := range []string{h.Name, h.Linkname} {
			if err := u.name(ctx, p, s, " (in the member's name)"); err != nil {
				return err
			}
		}
		// A sparse member unpacks to more than it holds: the ratio
		// counts it.
		if err := u.member(ctx, p, tr, in.read, depth); err != nil {
			return unpackError("tar", err)
		}
	}
}

// unpackError keeps what is the check's own failure (the source, the
// context, a bound already named) and calls the rest a kind that does
// not unpack.
func unpackError(kind string, err error) error {
	var se *sourceError
	var un *unscannable
	switch {
	case errors.As(err, &se), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, errOverLimit), errors.As(err, &un):
		return err
	}
	return &unscannable{fmt.Sprintf("a %s archive that does not unpack: %v", kind, err)}
}

func (u *unpacker) overBudget() error {
	return &unscannable{fmt.Sprintf("unpacks to more than the %d bytes a file may hold", u.budget)}
}

// limitedReader yields at most left bytes of r, and errOverLimit when r
// holds more.
type limitedReader struct {
	r    io.Reader
	left int64
	n    int64
}

var errOverLimit = errors.New("more than the limit")

func (l *limitedReader) read() int64 { return l.n }

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		var one [1]byte
		if n, err := l.r.Read(one[:]); n > 0 {
			return 0, errOverLimit
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	l.n += int64(n)
	return n, err
}

// unpackReader charges what r unpacks to u's budget and refuses past it
// or past the ratio.
type unpackReader struct {
	r      io.Reader
	u      *unpacker
	packed func() int64
	n      int64
}

func (w *unpackReader) Read(p []byte) (int, error) {
	if int64(len(p)) > w.u.left+1 {
		p = p[:w.u.left+1]
	}
	n, err := w.r.Read(p)
	w.n += int64(n)
	w.u.left -= int64(n)
	switch {
	case w.u.left < 0:
		return 0, w.u.overBudget()
	case w.n > unpackRatioFloor && w.n > maxUnpackRatio*max(w.packed(), 1):
		return 0, &unscannable{fmt.Sprintf("unpacks at more than %d bytes for each packed byte", maxUnpackRatio)}
	}
	return n, err
}
