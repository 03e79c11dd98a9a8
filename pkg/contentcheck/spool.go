package contentcheck

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// spoolMemory is how much of one layer a spool keeps in memory before it
// moves to a temporary file.
const spoolMemory = 1 << 20

// spool holds the bytes of one layer (an /out file, or what one member
// unpacks to) for reading at random: a zip is found from its end, and a
// layer may be read more than once (as itself, then as an archive).
type spool struct {
	mem  []byte
	f    *os.File
	size int64
}

// spoolOf copies at most limit bytes of r; more reports whether r held
// more. Close the spool when done.
func spoolOf(r io.Reader, limit int64) (s *spool, more bool, err error) {
	s = &spool{}
	var b bytes.Buffer
	n, err := io.Copy(&b, io.LimitReader(r, min(limit, spoolMemory)))
	s.mem, s.size = b.Bytes(), n
	if err == nil && n == spoolMemory && limit > spoolMemory {
		if s.f, err = os.CreateTemp("", "airlock-contentcheck-*"); err != nil {
			return nil, false, err
		}
		os.Remove(s.f.Name()) // the open file is all that is needed
		if _, err = s.f.Write(s.mem); err == nil {
			s.mem = nil
			n, err = io.Copy(s.f, io.LimitReader(r, limit-s.size))
			s.size += n
		}
	}
	if err == nil && s.size == limit {
		var one [1]byte
		var m int
		m, err = io.ReadFull(r, one[:])
		more = m > 0
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			err = nil
		}
	}
	if err != nil {
		s.Close()
		return nil, false, err
	}
	return s, more, nil
}

var errNegativeOffset = errors.New("a read at a negative offset")

func (s *spool) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errNegativeOffset // a zip's fields can point anywhere
	}
	if s.f != nil {
		return s.f.ReadAt(p, off)
	}
	if off >= int64(len(s.mem)) {
		return 0, io.EOF
	}
	n := copy(p, s.mem[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// section reads the bytes from off to the end.
func (s *spool) section(off int64) *io.SectionReader {
	return io.NewSectionReader(s, off, s.size-off)
}

// bytesAt returns up to n bytes at off (fewer at the end).
func (s *spool) bytesAt(off int64, n int) []byte {
	if off < 0 || off >= s.size {
		return nil
	}
	b := make([]byte, min(int64(n), s.size-off))
	k, _ := s.ReadAt(b, off)
	return b[:k]
}

func (s *spool) Close() error {
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}

// index returns the offset of the first sig at or after from, or -1.
func (s *spool) index(sig []byte, from int64) int64 {
	const chunk = 64 << 10
	for off := max(from, 0); off < s.size; off += chunk {
		// Each read overlaps the next by a signature less one byte.
		if i := bytes.Index(s.bytesAt(off, chunk+len(sig)-1), sig); i >= 0 {
			return off + int64(i)
		}
	}
	return -1
}
