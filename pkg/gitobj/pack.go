package gitobj

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// idxHeader is a version 2 index's magic, version and fanout table.
const idxHeader = 8 + 256*4

// packHeader is a pack's "PACK", version and object count.
const packHeader = 12

// pack is one pack file and its version 2 index, both kept open and read
// with ReadAt, so that a lookup costs a few small reads and no index is
// ever read whole.
type pack struct {
	name      string // the index's file name
	idx, data *os.File
	hashLen   int
	count     int64
	fanout    [256]uint32
	large     int64 // entries in the index's 64-bit offset table
	dataSize  int64

	// Guarded by the objdir's mu.
	refs    int
	dropped bool
}

// openPack opens the index name in dir and its pack, checking everything
// later reads rely on: the index's layout adds up, the pack's header
// counts the same objects and its trailer is the checksum the index
// recorded. A missing pack is returned as os.ErrNotExist.
func openPack(dir, name string) (*pack, error) {
	idx, err := openRegular(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	p := &pack{name: name, idx: idx}
	if err := p.load(filepath.Join(dir, strings.TrimSuffix(name, ".idx")+".pack")); err != nil {
		p.close()
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: pack %s: %v", ErrCorrupt, name, err)
	}
	return p, nil
}

func (p *pack) load(packPath string) error {
	fi, err := p.idx.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if size < idxHeader {
		return errors.New("index too short")
	}
	var head [idxHeader]byte
	if _, err := p.idx.ReadAt(head[:], 0); err != nil {
		return err
	}
	if string(head[:4]) != "\377tOc" || binary.BigEndian.Uint32(head[4:8]) != 2 {
		return errors.New("not a version 2 index")
	}
	var prev uint32
	for i := range p.fanout {
		v := binary.BigEndian.Uint32(head[8+4*i:])
		if v < prev {
			return errors.New("index fanout decreases")
		}
		p.fanout[i], prev = v, v
	}
	p.count = int64(p.fanout[255])
	p.hashLen = 0
	for _, h := range []int64{sha1.Size, sha256.Size} {
		rest := size - idxHeader - p.count*(h+8) - 2*h
		if rest >= 0 && rest%8 == 0 && rest/8 <= p.count {
			p.hashLen, p.large = int(h), rest/8
		}
	}
	if p.hashLen == 0 {
		return fmt.Errorf("index size %d fits no hash length for %d objects", size, p.count)
	}
	p.data, err = openRegular(packPath)
	if err != nil {
		return err
	}
	if fi, err = p.data.Stat(); err != nil {
		return err
	}
	p.dataSize = fi.Size()
	h := int64(p.hashLen)
	if p.dataSize < packHeader+h {
		return errors.New("pack too short")
	}
	var ph [packHeader]byte
	if _, err := p.data.ReadAt(ph[:], 0); err != nil {
		return err
	}
	if v := binary.BigEndian.Uint32(ph[4:8]); string(ph[:4]) != "PACK" || (v != 2 && v != 3) {
		return errors.New("not a version 2 or 3 pack")
	}
	if n := binary.BigEndian.Uint32(ph[8:12]); int64(n) != p.count {
		return fmt.Errorf("pack holds %d objects, its index %d", n, p.count)
	}
	want := make([]byte, 2*h)
	if _, err := p.idx.ReadAt(want[:h], size-2*h); err != nil {
		return err
	}
	if _, err := p.data.ReadAt(want[h:], p.dataSize-h); err != nil {
		return err
	}
	if !bytes.Equal(want[:h], want[h:]) {
		return errors.New("pack checksum differs from the one its index recorded")
	}
	return nil
}

func (p *pack) close() {
	p.idx.Close()
	if p.data != nil {
		p.data.Close()
	}
}

// bucket returns the index range of names starting with byte b.
func (p *pack) bucket(b byte) (lo, hi int64) {
	if b > 0 {
		lo = int64(p.fanout[b-1])
	}
	return lo, int64(p.fanout[b])
}

// nameAt reads the i-th sorted id.
func (p *pack) nameAt(i int64) ([]byte, error) {
	buf := make([]byte, p.hashLen)
	if _, err := p.idx.ReadAt(buf, idxHeader+i*int64(p.hashLen)); err != nil {
		return nil, fmt.Errorf("%w: index %s: %v", ErrCorrupt, p.name, err)
	}
	return buf, nil
}

// searchRun is how many names are left when a search stops probing one at
// a time and reads them all in one call.
const searchRun = 64

// search returns the first i in [lo, hi) whose name is not below key (hi
// when none is): a binary search by single reads while the range is wide,
// then one read of what is left.
func (p *pack) search(lo, hi int64, key []byte) (int64, error) {
	for hi-lo > searchRun {
		mid := lo + (hi-lo)/2
		name, err := p.nameAt(mid)
		if err != nil {
			return 0, err
		}
		if bytes.Compare(name, key) >= 0 {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	h := int64(p.hashLen)
	run := make([]byte, (hi-lo)*h)
	if _, err := p.idx.ReadAt(run, idxHeader+lo*h); err != nil {
		return 0, fmt.Errorf("%w: index %s: %v", ErrCorrupt, p.name, err)
	}
	for i := int64(0); i < hi-lo; i++ {
		if bytes.Compare(run[i*h:(i+1)*h], key) >= 0 {
			return lo + i, nil
		}
	}
	return hi, nil
}

// find returns the offset in the pack of the object id, and whether the
// index lists it.
func (p *pack) find(id []byte) (int64, bool, error) {
	if len(id) != p.hashLen {
		return 0, false, nil
	}
	lo, hi := p.bucket(id[0])
	i, err := p.search(lo, hi, id)
	if err != nil || i == hi {
		return 0, false, err
	}
	name, err := p.nameAt(i)
	if err != nil || !bytes.Equal(name, id) {
		return 0, false, err
	}
	off, err := p.offset(i)
	return off, err == nil, err
}

// offset returns where the i-th object's entry starts in the pack: a
// 31-bit offset, or with the top bit set an index into the 64-bit table.
func (p *pack) offset(i int64) (int64, error) {
	h := int64(p.hashLen)
	var b [8]byte
	if _, err := p.idx.ReadAt(b[:4], idxHeader+p.count*(h+4)+i*4); err != nil {
		return 0, fmt.Errorf("%w: index %s: %v", ErrCorrupt, p.name, err)
	}
	off := int64(binary.BigEndian.Uint32(b[:4]))
	if off&0x80000000 != 0 {
		j := off & 0x7fffffff
		if j >= p.large {
			return 0, fmt.Errorf("%w: index %s: 64-bit offset %d of %d", ErrCorrupt, p.name, j, p.large)
		}
		if _, err := p.idx.ReadAt(b[:], idxHeader+p.count*(h+8)+j*8); err != nil {
			return 0, fmt.Errorf("%w: index %s: %v", ErrCorrupt, p.name, err)
		}
		u := binary.BigEndian.Uint64(b[:])
		if u >= 1<<63 {
			return 0, fmt.Errorf("%w: index %s: offset %d", ErrCorrupt, p.name, u)
		}
		off = int64(u)
	}
	if off < packHeader || off >= p.dataSize-h {
		return 0, fmt.Errorf("%w: index %s: offset %d outside the pack", ErrCorrupt, p.name, off)
	}
	return off, nil
}

// prefix returns up to limit ids of this pack, in order, starting with the
// hex prefix.
func (p *pack) prefix(prefix string, limit int) ([]string, error) {
	if len(prefix) > 2*p.hashLen {
		return nil, nil
	}
	padded := prefix
	if len(padded)%2 == 1 {
		padded += "0"
	}
	key, err := hex.DecodeString(padded)
	if err != nil {
		return nil, err
	}
	lo, hi := p.bucket(key[0])
	i, err := p.search(lo, hi, key)
	if err != nil {
		return nil, err
	}
	var out []string
	for ; i < hi && len(out) < limit; i++ {
		name, err := p.nameAt(i)
		if err != nil {
			return nil, err
		}
		s := hex.EncodeToString(name)
		if !strings.HasPrefix(s, prefix) {
			break
		}
		out = append(out, s)
	}
	return out, nil
}

// entry is a pack entry's header: its type and size, where its zlib data
// starts and, for a delta, where its base is.
type entry struct {
	typ     int
	size    int64
	dataOff int64
	baseOff int64  // objOfsDelta
	baseID  []byte // objRefDelta
}

// maxEntryHeader bounds an entry's header: a 10-byte size, then a 10-byte
// offset or an id.
const maxEntryHeader = 10 + sha256.Size

// entryAt reads the header of the entry at off.
func (p *pack) entryAt(off int64) (entry, error) {
	var buf [maxEntryHeader]byte
	end := p.dataSize - int64(p.hashLen)
	if off < packHeader || off >= end {
		return entry{}, fmt.Errorf("%w: pack %s: entry offset %d outside the pack", ErrCorrupt, p.name, off)
	}
	b := buf[:min(int64(len(buf)), end-off)]
	n, err := p.data.ReadAt(b, off)
	if n < len(b) {
		return entry{}, fmt.Errorf("%w: pack %s: %v", ErrCorrupt, p.name, err)
	}
	typ, size, dist, ref, hl, err := parseEntryHeader(b, p.hashLen)
	if err != nil {
		return entry{}, fmt.Errorf("%w: pack %s offset %d: %v", ErrCorrupt, p.name, off, err)
	}
	e := entry{typ: typ, size: size, dataOff: off + int64(hl), baseID: ref}
	if typ == objOfsDelta {
		if dist >= off-packHeader+1 {
			return entry{}, fmt.Errorf("%w: pack %s offset %d: delta base %d bytes back is before the first entry", ErrCorrupt, p.name, off, dist)
		}
		e.baseOff = off - dist
	}
	return e, nil
}

// parseEntryHeader parses an entry's header at the start of b: the type
// in bits 4-6 of the first byte and the size in its low 4 bits then 7 bits
// a byte, least significant first, while the top bit is set; then for an
// offset delta the distance back to its base (7 bits a byte, most
// significant first, each continuation adding one so that no two
// encodings mean the same distance), or for a reference delta the base's
// id. It returns the header's length.
func parseEntryHeader(b []byte, hashLen int) (typ int, size, dist int64, ref []byte, n int, err error) {
	if len(b) == 0 {
		return 0, 0, 0, nil, 0, errors.New("empty entry header")
	}
	c := b[0]
	typ = int(c>>4) & 7
	u := uint64(c & 0x0f)
	shift := uint(4)
	n = 1
	for c&0x80 != 0 {
		if n >= len(b) {
			return 0, 0, 0, nil, 0, errors.New("truncated entry size")
		}
		c = b[n]
		n++
		if shift > 62 || uint64(c&0x7f)>>(63-shift) != 0 {
			return 0, 0, 0, nil, 0, errors.New("entry size overflows")
		}
		u |= uint64(c&0x7f) << shift
		shift += 7
	}
	size = int64(u)
	switch typ {
	case objCommit, objTree, objBlob, objTag:
	case objOfsDelta:
		if n >= len(b) {
			return 0, 0, 0, nil, 0, errors.New("truncated delta offset")
		}
		c = b[n]
		n++
		d := uint64(c & 0x7f)
		for c&0x80 != 0 {
			if n >= len(b) {
				return 0, 0, 0, nil, 0, errors.New("truncated delta offset")
			}
			d++
			if d>>(63-7) != 0 {
				return 0, 0, 0, nil, 0, errors.New("delta offset overflows")
			}
			c = b[n]
			n++
			d = d<<7 | uint64(c&0x7f)
		}
		if d == 0 {
			return 0, 0, 0, nil, 0, errors.New("delta based on itself")
		}
		dist = int64(d)
	case objRefDelta:
		if len(b)-n < hashLen {
			return 0, 0, 0, nil, 0, errors.New("truncated delta base id")
		}
		ref = append([]byte(nil), b[n:n+hashLen]...)
		n += hashLen
	default:
		return 0, 0, 0, nil, 0, fmt.Errorf("unknown entry type %d", typ)
	}
	return typ, size, dist, ref, n, nil
}

// inflater is a zlib reader and its buffer, pooled because building one
// costs more than inflating a small commit.
type inflater struct {
	br *bufio.Reader
	zr io.ReadCloser
}

var inflaters = sync.Pool{New: func() any { return &inflater{br: bufio.NewReaderSize(nil, 4096)} }}

// stream starts inflating the zlib data at off.
func (p *pack) stream(off int64) (*inflater, error) {
	in := inflaters.Get().(*inflater)
	in.br.Reset(io.NewSectionReader(p.data, off, p.dataSize-int64(p.hashLen)-off))
	var err error
	if in.zr == nil {
		in.zr, err = zlib.NewReader(in.br)
	} else {
		err = in.zr.(zlib.Resetter).Reset(in.br, nil)
	}
	if err != nil {
		in.zr = nil
		inflaters.Put(in)
		return nil, fmt.Errorf("%w: pack %s offset %d: %v", ErrCorrupt, p.name, off, err)
	}
	return in, nil
}

// inflate returns the size bytes of the entry data at off, checking that
// the stream ends there.
func (p *pack) inflate(off, size int64) ([]byte, error) {
	in, err := p.stream(off)
	if err != nil {
		return nil, err
	}
	defer inflaters.Put(in)
	data, err := readN(in.zr, size)
	if err != nil {
		return nil, fmt.Errorf("%w: pack %s offset %d: content shorter than its header's %d bytes: %v", ErrCorrupt, p.name, off, size, err)
	}
	if err := expectEnd(in.zr); err != nil {
		return nil, fmt.Errorf("%w: pack %s offset %d: %v", ErrCorrupt, p.name, off, err)
	}
	return data, nil
}

// readStep is how much readN allocates before the data has shown up.
const readStep = 1 << 20

// readN reads exactly size bytes. It allocates as the data arrives rather
// than all at once, so that a size a hostile header states, when the
// caller's limit lets it through, costs memory only as far as the stream
// really holds data.
func readN(r io.Reader, size int64) ([]byte, error) {
	buf := make([]byte, 0, min(size, readStep))
	for int64(len(buf)) < size {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(size-int64(len(buf)), int64(len(buf)))))
		}
		n, err := io.ReadFull(r, buf[len(buf):min(int64(cap(buf)), size)])
		buf = buf[:len(buf)+n]
		if err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// inflateHead returns the first n bytes of the entry data at off (fewer
// if the stream is shorter), enough to read a delta's sizes.
func (p *pack) inflateHead(off int64, n int) ([]byte, error) {
	in, err := p.stream(off)
	if err != nil {
		return nil, err
	}
	defer inflaters.Put(in)
	data := make([]byte, n)
	got, err := io.ReadFull(in.zr, data)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: pack %s offset %d: %v", ErrCorrupt, p.name, off, err)
	}
	return data[:got], nil
}
