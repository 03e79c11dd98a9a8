package contentcheck

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"

	gitleaksreport "github.com/zricethezav/gitleaks/v8/report"
)

// An /out file that is an archive or a compressed stream is unpacked and
// what it holds is scanned too (names and header fields included), as deep
// as MaxArchiveDepth archives within archives: a token zipped is as much a
// token. A format is known by its first bytes (gzip, bzip2, zlib, zip, tar
// with or without the ustar magic) and a zip by its directory's end too,
// as unzip finds it after other bytes (zip.go). Formats known but not
// unpacked here (xz, lzma, zstd, lz4, 7z, rar, zip methods other than
// store, deflate and bzip2) are refused, not scanned as the opaque bytes
// they are. Each layer is spooled (spool.go) so it can be read from its
// end and more than once. Unpacking is bounded the way decoding is
// (DecodeDepth): in depth, in the bytes unpacked (all layers of one /out
// file together at most the policy's MaxFileBytes, the cap on any file),
// in the ratio of unpacked to packed bytes (maxUnpackRatio, past
// unpackRatioFloor, so a bomb stops within its first MiBs), and in the
// members of all its archives together. An archive over a bound, or one
// that does not unpack (corrupt, truncated, encrypted, with bytes no
// member accounts for), is a RuleArchiveUnscannable finding: refused,
// never passed unread. A member's findings name it "/out/NAME!MEMBER"
// ("!" alone for a compressed stream's content).
//
// What this cannot see: a format without a signature (raw deflate,
// brotli), one with an unusual header (an lzma stream with an odd
// dictionary size), an archive at an offset that only a tool told where
// it starts would read, and anything encoded or encrypted on purpose.

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
	c       *Checker
	r       *report
	budget  int64 // unpacked bytes allowed in all
	left    int64 // of them, not yet unpacked
	entries int   // archive members met, at every depth
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
// held more), unpacking an archive found at depth. What it yields is
// spooled first: a zip is found from its end (a self-extracting zip
// starts with a program), and a layer may be both (a tar with a zip
// appended, which tar and unzip each read).
func (u *unpacker) scan(ctx context.Context, path string, r io.Reader, limit int64, depth int) (more bool, err error) {
	s, more, err := spoolOf(r, limit)
	if err != nil {
		return false, err
	}
	defer s.Close()
	if more {
		// Cut at the limit, an archive would not unpack: what there is
		// is scanned as it is, and the caller refuses the rest.
		_, err := u.c.scanStream(ctx, path, s.section(0), s.size, u.secret(path, ""))
		return true, err
	}
	return false, u.layer(ctx, path, s, depth)
}

// layer scans one spooled layer as what its bytes say it is.
func (u *unpacker) layer(ctx context.Context, path string, s *spool, depth int) error {
	kind := archiveKind(s.bytesAt(0, sniffBytes))
	switch {
	case kind == "":
		return u.unannounced(ctx, path, s, depth)
	case unpackers[kind] == nil:
		return &unscannable{fmt.Sprintf("a %s stream, a format not unpacked here", kind)}
	case depth >= MaxArchiveDepth:
		return &unscannable{fmt.Sprintf("a %s archive nested more than %d archives deep", kind, MaxArchiveDepth)}
	}
	return unpackError(kind, unpackers[kind](u, ctx, path, s, depth))
}

// unannounced scans bytes whose start names no format: as they are, or,
// if they end like a zip, as the zip unzip finds there (after a
// self-extracting program, say), the bytes before it with it.
func (u *unpacker) unannounced(ctx context.Context, path string, s *spool, depth int) error {
	if !hasDirectoryEnd(s, 0) {
		return u.plain(ctx, path, s)
	}
	if depth >= MaxArchiveDepth {
		return &unscannable{fmt.Sprintf("a zip archive nested more than %d archives deep", MaxArchiveDepth)}
	}
	return unpackError("zip", u.zip(ctx, path, s, 0, depth))
}

// unpackers unpack each kind archiveKind knows and this package reads;
// a kind it knows without an unpacker is refused.
var unpackers map[string]func(*unpacker, context.Context, string, *spool, int) error

func init() {
	unpackers = map[string]func(*unpacker, context.Context, string, *spool, int) error{
		"gzip": (*unpacker).gzip, "bzip2": (*unpacker).bzip2, "zlib": (*unpacker).zlib,
		"zip": func(u *unpacker, ctx context.Context, path string, s *spool, depth int) error {
			return u.zip(ctx, path, s, 0, depth)
		},
		"tar": (*unpacker).tar,
	}
}

// archiveKind names the format a layer's first bytes announce, or "".
// Beside those unpacked here it knows the common formats that are not
// (xz, zstd, 7z, rar, lz4, lzma), so that they are refused rather than
// scanned as the opaque bytes they are.
func archiveKind(head []byte) string {
	has := func(magic string) bool { return bytes.HasPrefix(head, []byte(magic)) }
	switch {
	case has("\x1f\x8b"):
		return "gzip"
	case has("PK\x03\x04"), has("PK\x05\x06"), has("PK\x07\x08PK\x03\x04"):
		return "zip"
	case isTarHeader(head):
		return "tar"
	case has("BZh") && len(head) >= 10 && head[3] >= '1' && head[3] <= '9' &&
		(string(head[4:10]) == "\x31\x41\x59\x26\x53\x59" || string(head[4:10]) == "\x17\x72\x45\x38\x50\x90"):
		return "bzip2"
	case has("\xfd7zXZ\x00"):
		return "xz"
	case has("\x28\xb5\x2f\xfd"), len(head) >= 4 && head[0]&0xf0 == 0x50 && string(head[1:4]) == "\x2a\x4d\x18":
		return "zstd" // a frame, or a skippable frame before one
	case has("7z\xbc\xaf\x27\x1c"):
		return "7z"
	case has("Rar!\x1a\x07"):
		return "rar"
	case has("\x04\x22\x4d\x18"), has("\x02\x21\x4c\x18"):
		return "lz4"
	case isZlibHeader(head):
		return "zlib"
	case isLZMAHeader(head):
		return "lzma"
	}
	return ""
}

// isTarHeader reports a tar header: the ustar magic, or (a pre-POSIX
// tar, which has none) a checksum that matches.
func isTarHeader(h []byte) bool {
	if len(h) < 512 {
		return false
	}
	if string(h[257:262]) == "ustar" {
		return true
	}
	field := bytes.Trim(h[148:156], " \x00")
	if len(field) == 0 {
		return false
	}
	var want int64
	for _, c := range field {
		if c < '0' || c > '7' {
			return false
		}
		want = want*8 + int64(c-'0')
	}
	var unsigned, signed int64
	for i, c := range h[:512] {
		if i >= 148 && i < 156 {
			c = ' '
		}
		unsigned += int64(c)
		signed += int64(int8(c))
	}
	return want == unsigned || want == signed
}

// isZlibHeader reports a zlib stream's header (RFC 1950): deflate, a
// window of at most 32 KiB, no preset dictionary, and its check.
func isZlibHeader(h []byte) bool {
	return len(h) >= 2 && h[0]&0x0f == 8 && h[0]>>4 <= 7 && h[1]&0x20 == 0 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0
}

// isLZMAHeader reports an .lzma ("alone") header as xz's format detection
// takes one: valid properties, a dictionary of 2^n or 2^n+2^(n-1) bytes,
// and a size that is unknown or below 256 GiB; and (since a stream of no
// bytes hides nothing, and zeros would otherwise pass for one) not 0.
func isLZMAHeader(h []byte) bool {
	if len(h) < 13 || h[0] >= 9*5*5 {
		return false
	}
	dict := binary.LittleEndian.Uint32(h[1:5])
	size := binary.LittleEndian.Uint64(h[5:13])
	if dict != ^uint32(0) {
		d := dict - 1
		d |= d >> 2
		d |= d >> 3
		d |= d >> 4
		d |= d >> 8
		d |= d >> 16
		if d+1 != dict {
			return false
		}
	}
	return size == ^uint64(0) || size > 0 && size < 1<<38
}

// secret reports a detector finding on path.
func (u *unpacker) secret(path, where string) func(gitleaksreport.Finding, int) {
	return func(f gitleaksreport.Finding, line int) { u.r.add(secretFinding(f, path, line, where)) }
}

// field is a name (a file's, a member's, a header field's) and where it
// is, for a finding's message.
type field struct{ text, where string }

// names scans names as text, one a line, in one pass of the detector.
func (u *unpacker) names(ctx context.Context, path string, fields ...field) error {
	lines := make([]Line, 0, len(fields))
	for i, f := range fields {
		if f.text != "" {
			lines = append(lines, Line{Num: i, Text: []byte(f.text)})
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return u.c.scanLines(ctx, "", lines, func(f gitleaksreport.Finding, l Line) {
		u.r.add(secretFinding(f, path, 0, fields[l.Num].where))
	})
}

// member scans what one archive member unpacks to, charged to the budget
// and held to the ratio against packed (the packed bytes read so far).
func (u *unpacker) member(ctx context.Context, path string, r io.Reader, packed func() int64, depth int) error {
	more, err := u.scan(ctx, path, &unpackReader{r: r, u: u, packed: packed}, u.left, depth+1)
	if err == nil && more {
		err = u.overBudget()
	}
	return err
}

func (u *unpacker) gzip(ctx context.Context, path string, s *spool, depth int) error {
	in := &countingReader{r: s.section(0)}
	br := bufio.NewReader(in)
	zr, err := gzip.NewReader(br)
	if err != nil {
		return err
	}
	zr.Multistream(false) // each member's header is scanned
	for {
		if err := u.names(ctx, path,
			field{zr.Name, " (in the gzip header's name)"},
			field{zr.Comment, " (in the gzip header's comment)"},
			field{string(zr.Extra), " (in the gzip header's extra field)"}); err != nil {
			return err
		}
		if err := u.member(ctx, path+"!", zr, in.count, depth); err != nil {
			return err
		}
		// gzip reads the next member, or fails on what is not one:
		// bytes after the last member are refused.
		if err := zr.Reset(br); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

func (u *unpacker) bzip2(ctx context.Context, path string, s *spool, depth int) error {
	in := &countingReader{r: s.section(0)}
	return u.member(ctx, path+"!", bzip2.NewReader(bufio.NewReader(in)), in.count, depth)
}

func (u *unpacker) zlib(ctx context.Context, path string, s *spool, depth int) error {
	// Two bytes announce zlib, and text may start with them ("x^2"): a
	// stream that does not decode is scanned as the bytes it is, after
	// what of it did decode (as much as a tool would write out of a
	// stream cut short).
	in := &countingReader{r: s.section(0)}
	br := bufio.NewReader(in)
	zr, err := zlib.NewReader(br)
	if err != nil {
		return u.unannounced(ctx, path, s, depth)
	}
	soft := &softEnd{r: zr}
	if err := u.member(ctx, path+"!", soft, in.count, depth); err != nil {
		return err
	}
	if soft.err != nil {
		return u.unannounced(ctx, path, s, depth)
	}
	if n, _ := br.Read(make([]byte, 1)); n > 0 {
		return errors.New("bytes after the end of the stream")
	}
	return nil
}

// softEnd ends the stream at r's first error, keeping it.
type softEnd struct {
	r   io.Reader
	err error
}

func (s *softEnd) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err, err = err, io.EOF
	}
	return n, err
}

// plain scans a layer as the bytes it is.
func (u *unpacker) plain(ctx context.Context, path string, s *spool) error {
	_, err := u.c.scanStream(ctx, path, s.section(0), s.size, u.secret(path, ""))
	return err
}

func (u *unpacker) tar(ctx context.Context, path string, s *spool, depth int) error {
	for off := int64(0); ; {
		end, err := u.tarArchive(ctx, path, s, off, depth)
		if err != nil {
			return err
		}
		// GNU tar -i reads on past an archive's end (its zero blocks)
		// and takes a header there for another member: so does this.
		for block := s.bytesAt(end, 512); len(block) == 512 && allZero(block); block = s.bytesAt(end, 512) {
			end += 512
		}
		if !isTarHeader(s.bytesAt(end, 512)) {
			// What follows the archive is scanned as it is, or as the zip
			// unzip finds there (a zip appended to a tar). A zip the
			// archive holds is one of its members, unpacked as such.
			if hasDirectoryEnd(s, end) {
				return u.zip(ctx, path, s, end, depth)
			}
			_, err := u.c.scanStream(ctx, path, s.section(end), s.size-end, u.secret(path, ""))
			return err
		}
		off = end
	}
}

// tarArchive reads the tar archive at off to its end blocks and returns
// the offset after them.
func (u *unpacker) tarArchive(ctx context.Context, path string, s *spool, off int64, depth int) (int64, error) {
	// Every byte the reader takes outside the members' data (headers,
	// padding, the end) is scanned as it is: a header has fields the
	// reader passes over, and a secret there is in the file all the same.
	packed := &countingReader{r: s.section(off), n: off}
	in := &captureReader{r: packed}
	// The captured bytes are scanned a batch at a time: most headers are
	// a block each, and one pass of the detector a header would cost more
	// than the rest of reading a tar of small members.
	flush := func(atLeast int) error {
		if len(in.buf) < atLeast || len(in.buf) == 0 {
			return nil
		}
		_, err := u.c.scanStream(ctx, path, bytes.NewReader(in.buf), int64(len(in.buf)), u.secret(path, ""))
		in.buf = in.buf[:0]
		return err
	}
	tr := tar.NewReader(in)
	for {
		in.capture = true
		h, err := tr.Next()
		in.capture = false
		if err == io.EOF {
			return packed.n, flush(0)
		}
		if ferr := flush(fragmentBytes); ferr != nil {
			return 0, ferr
		}
		if err != nil {
			return 0, err
		}
		if err := u.entry("tar"); err != nil {
			return 0, err
		}
		if headerOnly(h.Typeflag) && h.Size > 0 {
			// Readers differ on whether data follows such a header: what
			// one reads as data another reads as the next members.
			return 0, &unscannable{fmt.Sprintf("a tar member of type %q that declares %d bytes of data: %s", h.Typeflag, h.Size, h.Name)}
		}
		p := path + "!" + h.Name
		names := []field{
			{h.Name, " (in the member's name)"},
			{h.Linkname, " (in the member's link target)"},
			{h.Uname, " (in the member's owner name)"},
			{h.Gname, " (in the member's group name)"},
		}
		for _, k := range slices.Sorted(maps.Keys(h.PAXRecords)) {
			names = append(names, field{k + "=" + h.PAXRecords[k], " (in the member's PAX record " + strconv.Quote(k) + ")"})
		}
		if err := u.names(ctx, p, names...); err != nil {
			return 0, err
		}
		// A sparse member unpacks to more than it holds: the ratio
		// counts it.
		if err := u.member(ctx, p, tr, packed.count, depth); err != nil {
			return 0, err
		}
	}
}

// headerOnly are the tar types whose data Go's reader takes to be none,
// whatever the size field says.
func headerOnly(t byte) bool {
	switch t {
	case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
		return true
	}
	return false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// entry counts one more member of any archive of the /out file.
func (u *unpacker) entry(kind string) error {
	if u.entries++; u.entries > maxArchiveEntries {
		return &unscannable{fmt.Sprintf("a %s archive: more than %d members in all", kind, maxArchiveEntries)}
	}
	return nil
}

// unpackError keeps what is the check's own failure (the source, the
// context, a bound already named) and calls the rest a kind that does
// not unpack.
func unpackError(kind string, err error) error {
	if err == nil {
		return nil
	}
	var se *sourceError
	var un *unscannable
	switch {
	case errors.As(err, &se), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &un):
		return err
	}
	return &unscannable{fmt.Sprintf("a %s archive that does not unpack: %v", kind, err)}
}

func (u *unpacker) overBudget() error {
	return &unscannable{fmt.Sprintf("unpacks to more than the %d bytes a file may hold", u.budget)}
}

// countingReader counts the bytes read through it: the packed bytes an
// unpacker has taken so far.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) count() int64 { return c.n }

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// captureReader keeps what is read through it while capture is on.
type captureReader struct {
	r       io.Reader
	capture bool
	buf     []byte
}

func (c *captureReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.capture {
		c.buf = append(c.buf, p[:n]...)
	}
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
