package contentcheck

import (
	"archive/zip"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/flate"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// A zip is read as unzip reads it, from the directory at its end, which
// may follow other bytes (a self-extracting program, a tar). A reader that
// streams a zip reads it another way, walking its local headers from the
// first: a member it finds there that the directory does not list would
// pass unscanned. So the local entries must be the directory's one for
// one, in sequence, each agreeing with its listing, with nothing between
// them but data descriptors, and no local header's signature may appear
// anywhere outside the members' data. Anything else is refused, not
// scanned as raw bytes: what such bytes hold is most likely compressed,
// and raw it would pass.

const (
	localSignature = "PK\x03\x04"
	endSignature   = "PK\x05\x06"
	// endSearch is how far from its end a zip's directory end may be: a
	// 22-byte record and a comment of up to 65,535 bytes, and as far as
	// Go's reader looks (65 KiB).
	endSearch = 65 << 10
	zipBzip2  = 12 // the method number of bzip2
)

// hasDirectoryEnd reports whether the signature of a zip's directory end
// is near the end of s, where unzip would look for it, and at or after
// from.
func hasDirectoryEnd(s *spool, from int64) bool {
	return s.index([]byte(endSignature), max(from, s.size-endSearch)) >= 0
}

// zip reads the zip that ends s and starts at or after start: what is
// before start is another reader's (a tar's) and already scanned.
func (u *unpacker) zip(ctx context.Context, path string, s *spool, start int64, depth int) error {
	// Every byte is scanned as it is too: names, comments and extra
	// fields in headers, stored members, the bytes before the zip.
	if _, err := u.c.scanStream(ctx, path, s.section(start), s.size-start, u.secret(path, "")); err != nil {
		return err
	}
	zr, err := zip.NewReader(s, s.size)
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return err
	}
	if u.entries+len(zr.File) > maxArchiveEntries {
		return &unscannable{fmt.Sprintf("a zip archive: more than %d members in all", maxArchiveEntries)}
	}
	if err := u.names(ctx, path, field{zr.Comment, " (in the zip's comment)"}); err != nil {
		return err
	}
	if err := localEntries(s, start, zr.File); err != nil {
		return err
	}
	for _, e := range zr.File {
		if err := u.entry("zip"); err != nil {
			return err
		}
		p := path + "!" + e.Name
		if err := u.names(ctx, p, field{e.Name, " (in the member's name)"}, field{e.Comment, " (in the member's comment)"}); err != nil {
			return err
		}
		if e.Flags&0x1 != 0 {
			return &unscannable{"a zip member that is encrypted: " + e.Name}
		}
		if err := u.zipMember(ctx, p, s, e, depth); err != nil {
			return err
		}
	}
	return nil
}

// zipMember unpacks one member itself, from its raw bytes, so that the
// ratio counts the packed bytes read so far, not the size the header
// claims; it holds the member to its checksum and size, and its
// compressed stream to end where its data does.
func (u *unpacker) zipMember(ctx context.Context, path string, s *spool, e *zip.File, depth int) error {
	off, err := e.DataOffset()
	if err != nil {
		return err
	}
	if e.CompressedSize64 > uint64(s.size-off) {
		return &unscannable{"a zip member whose data runs past the end of the zip: " + e.Name}
	}
	packed := &countingReader{r: io.NewSectionReader(s, off, int64(e.CompressedSize64))}
	br := bufio.NewReader(packed)
	var body io.Reader
	switch e.Method {
	case zip.Store:
		body = br
	case zip.Deflate:
		fr := flate.NewReader(br)
		defer fr.Close()
		body = fr
	case zipBzip2:
		body = bzip2.NewReader(br)
	default:
		return &unscannable{fmt.Sprintf("a zip member packed by method %d, which is not unpacked here: %s", e.Method, e.Name)}
	}
	sum := crc32.NewIEEE()
	var look descriptorLookalike
	var seen io.Writer = sum
	if e.Method == zip.Store && e.Flags&0x8 != 0 {
		seen = io.MultiWriter(sum, &look)
	}
	out := &countingReader{r: io.TeeReader(body, seen)}
	if err := u.member(ctx, path, out, packed.count, depth); err != nil {
		return err
	}
	switch {
	case look.found:
		return &unscannable{"a stored zip member holding a data descriptor of its own first bytes, where a streaming reader ends it and reads on as another entry: " + e.Name}
	case sum.Sum32() != e.CRC32 && e.CRC32 != 0:
		return &unscannable{"a zip member whose checksum does not match: " + e.Name}
	case uint64(out.n) != e.UncompressedSize64:
		return &unscannable{fmt.Sprintf("a zip member that unpacks to %d bytes, not the %d its header says: %s", out.n, e.UncompressedSize64, e.Name)}
	case packed.n-int64(br.Buffered()) != int64(e.CompressedSize64):
		return &unscannable{"a zip member with bytes after its compressed stream: " + e.Name}
	}
	return nil
}

// localEntries walks the local entries of a zip from the first at or
// after start, matching each to the member of the directory whose data
// follows it.
func localEntries(s *spool, start int64, files []*zip.File) error {
	byData := make(map[int64]*zip.File, len(files))
	for _, f := range files {
		off, err := f.DataOffset()
		if err != nil {
			return err
		}
		if byData[off] != nil {
			return &unscannable{"two members of the zip's directory with the same data: " + f.Name}
		}
		byData[off] = f
	}
	p := s.index([]byte(localSignature), start)
	for p >= 0 && string(s.bytesAt(p, 4)) == localSignature {
		h := s.bytesAt(p, 30)
		if len(h) < 30 {
			return &unscannable{fmt.Sprintf("a zip local header cut short at offset %d", p)}
		}
		le := binary.LittleEndian
		flags, method := le.Uint16(h[6:]), le.Uint16(h[8:])
		crc, csize, usize := le.Uint32(h[14:]), uint64(le.Uint32(h[18:])), uint64(le.Uint32(h[22:]))
		n, m := int64(le.Uint16(h[26:])), int64(le.Uint16(h[28:]))
		data := p + 30 + n + m
		f := byData[data]
		if f == nil {
			return &unscannable{fmt.Sprintf("a zip local entry at offset %d that the zip's directory does not list", p)}
		}
		delete(byData, data)
		if string(s.bytesAt(p+30, int(n))) != f.Name || method != f.Method || flags&0x9 != f.Flags&0x9 {
			return &unscannable{"a zip member whose local header differs from the directory's (name, method or flags): " + f.Name}
		}
		csize, usize = zip64Sizes(s.bytesAt(p+30+n, int(m)), csize, usize)
		end := data + int64(f.CompressedSize64)
		if flags&0x8 == 0 {
			if crc != f.CRC32 || csize != f.CompressedSize64 || usize != f.UncompressedSize64 {
				return &unscannable{"a zip member whose local header's sizes or checksum differ from the directory's: " + f.Name}
			}
		} else {
			d := descriptorLen(s, end, f)
			if d == 0 {
				return &unscannable{"a zip member without the data descriptor its header announces: " + f.Name}
			}
			end += d
		}
		p = end
	}
	for _, f := range files {
		if off, _ := f.DataOffset(); byData[off] == f {
			return &unscannable{"a zip member the local entries, walked in order, do not reach (members that overlap, or bytes between them): " + f.Name}
		}
	}
	if q := s.index([]byte(localSignature), max(p, 0)); p >= 0 && q >= 0 {
		return &unscannable{fmt.Sprintf("a zip local entry's signature at offset %d, outside every member", q)}
	}
	return nil
}

// zip64Sizes takes a local header's sizes from its zip64 extra field
// where the header says they are there.
func zip64Sizes(extra []byte, csize, usize uint64) (uint64, uint64) {
	const max32 = 0xffffffff
	if csize != max32 && usize != max32 {
		return csize, usize
	}
	for len(extra) >= 4 {
		id, size := binary.LittleEndian.Uint16(extra), int(binary.LittleEndian.Uint16(extra[2:]))
		if size > len(extra)-4 {
			break
		}
		if id == 0x0001 {
			b := extra[4 : 4+size]
			if usize == max32 && len(b) >= 8 {
				usize, b = binary.LittleEndian.Uint64(b), b[8:]
			}
			if csize == max32 && len(b) >= 8 {
				csize = binary.LittleEndian.Uint64(b)
			}
			break
		}
		extra = extra[4+size:]
	}
	return csize, usize
}

// descriptorLen is the length of the data descriptor at off that agrees
// with f (with or without its signature, with 4- or 8-byte sizes), or 0.
// Where two forms agree, the one followed by a signature (or the end) is
// taken: that is where a streaming reader goes on.
func descriptorLen(s *spool, off int64, f *zip.File) int64 {
	b := s.bytesAt(off, 24)
	var agree []int64
	for _, form := range []struct {
		sig  bool
		wide bool
	}{{true, false}, {true, true}, {false, false}, {false, true}} {
		d := b
		if form.sig {
			if !bytes.HasPrefix(d, []byte("PK\x07\x08")) {
				continue
			}
			d = d[4:]
		}
		le := binary.LittleEndian
		var ok bool
		if form.wide {
			ok = len(d) >= 20 && le.Uint32(d) == f.CRC32 && le.Uint64(d[4:]) == f.CompressedSize64 && le.Uint64(d[12:]) == f.UncompressedSize64
		} else {
			ok = len(d) >= 12 && le.Uint32(d) == f.CRC32 && uint64(le.Uint32(d[4:])) == f.CompressedSize64 && uint64(le.Uint32(d[8:])) == f.UncompressedSize64
		}
		if ok {
			agree = append(agree, int64(len(b)-len(d))+map[bool]int64{false: 12, true: 20}[form.wide])
		}
	}
	for _, n := range agree {
		if next := s.bytesAt(off+n, 2); len(next) == 0 || string(next) == "PK" {
			return n
		}
	}
	if len(agree) > 0 {
		return agree[0]
	}
	return 0
}

// descriptorLookalike looks, in a stored member's data, for a data
// descriptor's signature followed by the checksum of the data before it:
// libarchive, streaming a stored member that has its sizes in a
// descriptor, ends the member there.
type descriptorLookalike struct {
	crc   uint32
	held  []byte // the last bytes, not yet in crc, where a signature may start
	found bool
}

func (d *descriptorLookalike) Write(p []byte) (int, error) {
	if d.found {
		return len(p), nil
	}
	buf := append(d.held, p...)
	sig := []byte("PK\x07\x08")
	i := 0
	for {
		k := bytes.Index(buf[i:], sig)
		if k < 0 {
			k = max(len(buf)-7, i) // a signature and its checksum may start past here
		} else {
			k += i
		}
		d.crc = crc32.Update(d.crc, crc32.IEEETable, buf[i:k])
		i = k
		if len(buf)-k < 8 {
			break
		}
		if bytes.HasPrefix(buf[k:], sig) && binary.LittleEndian.Uint32(buf[k+4:]) == d.crc {
			d.found = true
			return len(p), nil
		}
		d.crc = crc32.Update(d.crc, crc32.IEEETable, buf[k:k+1])
		i = k + 1
	}
	d.held = append(d.held[:0:0], buf[i:]...)
	return len(p), nil
}
