package contentcheck

import (
	"bufio"
	"compress/zlib"
	"errors"
	"io"
)

// binaryHunk is the forward half of a "GIT binary patch": the new file
// ("literal"), or a delta against the old one ("delta"), zlib-deflated and
// base85-encoded a line at a time.
type binaryHunk struct {
	delta bool
	size  int64    // the inflated size the hunk header names
	lines [][]byte // the data lines, as in the patch
}

// binary parses both hunks of a binary patch and keeps the forward one.
func (p *parser) binary(f *FilePatch) error {
	for i := 0; i < 2; i++ {
		if i == 1 && p.eof() {
			break
		}
		line, err := p.next()
		if err != nil {
			return err
		}
		h := &binaryHunk{}
		var v []byte
		switch {
		case cut(line, "literal ", &v):
		case cut(line, "delta ", &v):
			h.delta = true
		default:
			if i == 1 {
				return p.errorf(`expected "literal" or "delta" for the reverse hunk`)
			}
			return p.errorf(`expected "literal" or "delta" after "GIT binary patch"`)
		}
		n, err := count64(v)
		if err != nil {
			return p.errorf("binary hunk size: %v", err)
		}
		h.size = int64(n)
		var got int64
		for {
			line, err := p.next()
			if err != nil {
				return err
			}
			if len(line) == 0 {
				break
			}
			n, err := base85LineLen(line)
			if err != nil {
				return p.errorf("binary data: %v", err)
			}
			got += int64(n)
			h.lines = append(h.lines, line)
		}
		if got == 0 {
			return p.errorf("a binary hunk without data")
		}
		if i == 0 {
			f.bin = h
		}
	}
	h := f.bin
	if !h.delta {
		f.Size = h.size
		return nil
	}
	// A delta starts with the old and the new size.
	header := make([]byte, 2*binary64Max)
	n, err := io.ReadFull(h.zlib(), header)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return p.errorf("binary delta: %v", err)
	}
	_, rest, ok := uvarint(header[:n])
	size, _, ok2 := uvarint(rest)
	if !ok || !ok2 || size > maxCount {
		return p.errorf("binary delta: a bad header")
	}
	f.Size = int64(size)
	return nil
}

// binary64Max is the longest varint a delta header uses for a size.
const binary64Max = 10

// uvarint reads git's delta-header varint (7 bits a byte, low bits first).
func uvarint(b []byte) (uint64, []byte, bool) {
	var v uint64
	for i := 0; i < len(b) && i < binary64Max; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return v, b[i+1:], true
		}
	}
	return 0, nil, false
}

// zlib streams the hunk's inflated bytes.
func (h *binaryHunk) zlib() io.Reader {
	zr, err := zlib.NewReader(&base85Reader{lines: h.lines})
	if err != nil {
		return errReader{err}
	}
	return zr
}

// inflate is zlib held to the size the hunk header names.
func (h *binaryHunk) inflate() io.Reader { return &strictLimit{r: h.zlib(), n: h.size} }

// content streams what the hunk adds: a literal's whole file, or the
// bytes a delta inserts (what it copies comes from the old file, which
// the job did not write).
func (h *binaryHunk) content() io.Reader {
	if !h.delta {
		return h.inflate()
	}
	return &deltaInserts{r: bufio.NewReader(h.inflate())}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// strictLimit reads at most n bytes and fails if the stream holds more.
type strictLimit struct {
	r io.Reader
	n int64
}

var (
	errLongerThanSaid  = errors.New("binary data longer than its hunk header says")
	errShorterThanSaid = errors.New("binary data shorter than its hunk header says")
)

func (l *strictLimit) Read(p []byte) (int, error) {
	if l.n <= 0 {
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			return 0, errLongerThanSaid
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if errors.Is(err, io.EOF) && l.n > 0 {
		err = errShorterThanSaid
	}
	return n, err
}

// deltaInserts reads a git delta (patch-delta.c) and yields the bytes its
// insert instructions carry.
type deltaInserts struct {
	r       *bufio.Reader
	started bool
	insert  int // bytes left of the current insert
}

var errBadDelta = errors.New("a bad binary delta")

func (d *deltaInserts) Read(p []byte) (int, error) {
	if !d.started {
		d.started = true
		for i := 0; i < 2; i++ { // the old and the new size
			for {
				c, err := d.r.ReadByte()
				if err != nil {
					return 0, errBadDelta
				}
				if c&0x80 == 0 {
					break
				}
			}
		}
	}
	for d.insert == 0 {
		op, err := d.r.ReadByte()
		if errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
		switch {
		case op&0x80 != 0: // copy: skip its offset and size bytes
			for bit := byte(1); bit < 0x80; bit <<= 1 {
				if op&bit != 0 {
					if _, err := d.r.ReadByte(); err != nil {
						return 0, errBadDelta
					}
				}
			}
		case op == 0:
			return 0, errBadDelta
		default:
			d.insert = int(op)
		}
	}
	if len(p) > d.insert {
		p = p[:d.insert]
	}
	n, err := io.ReadFull(d.r, p)
	d.insert -= n
	if err != nil {
		return n, errBadDelta
	}
	return n, nil
}

// base85 is git's alphabet (base85.c).
const base85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

var base85Value = func() (t [256]int16) {
	for i := range t {
		t[i] = -1
	}
	for i := 0; i < len(base85); i++ {
		t[base85[i]] = int16(i)
	}
	return t
}()

// base85LineLen checks one data line of a binary hunk and returns how
// many bytes it decodes to: its first byte says ('A'-'Z' 1-26, 'a'-'z'
// 27-52), five characters follow for every four bytes.
func base85LineLen(line []byte) (int, error) {
	if len(line) < 1 {
		return 0, errors.New("an empty data line")
	}
	var n int
	switch c := line[0]; {
	case c >= 'A' && c <= 'Z':
		n = int(c-'A') + 1
	case c >= 'a' && c <= 'z':
		n = int(c-'a') + 27
	default:
		return 0, errors.New("a data line with a bad length byte")
	}
	if len(line)-1 != (n+3)/4*5 {
		return 0, errors.New("a data line whose length does not match its length byte")
	}
	for _, c := range line[1:] {
		if base85Value[c] < 0 {
			return 0, errors.New("a byte outside base85 in a data line")
		}
	}
	return n, nil
}

// base85Reader decodes data lines already checked by base85LineLen.
type base85Reader struct {
	lines [][]byte
	buf   []byte
}

func (r *base85Reader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if len(r.lines) == 0 {
			return 0, io.EOF
		}
		line := r.lines[0]
		r.lines = r.lines[1:]
		n, err := base85LineLen(line)
		if err != nil {
			return 0, err
		}
		out := make([]byte, 0, (n+3)/4*4)
		for g := line[1:]; len(g) >= 5; g = g[5:] {
			var acc uint64
			for _, c := range g[:5] {
				acc = acc*85 + uint64(base85Value[c])
			}
			if acc > 0xffffffff {
				return 0, errors.New("a base85 group out of range")
			}
			out = append(out, byte(acc>>24), byte(acc>>16), byte(acc>>8), byte(acc))
		}
		r.buf = out[:n]
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
