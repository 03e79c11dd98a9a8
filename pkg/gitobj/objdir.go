package gitobj

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// objdir is one object directory: its loose objects are read by name, its
// packs are kept open between reads and rescanned when a read misses,
// because git fetch and git gc add and delete packs beside us.
type objdir struct {
	path string

	mu      sync.Mutex
	packs   []*pack          // open packs, by index name
	broken  map[string]error // indexes that could not be opened at the last scan
	scanned bool
	closed  bool
}

// acquire returns the open packs, each held until release so that a
// rescan or Close dropping one does not close its files under a reader.
func (d *objdir) acquire() []*pack {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.scanned && !d.closed {
		// First use: scan now rather than in Open, so that a Store
		// costs nothing until it reads.
		d.scanLocked()
	}
	out := make([]*pack, len(d.packs))
	copy(out, d.packs)
	for _, p := range out {
		p.refs++
	}
	return out
}

// release lets go of packs acquire returned, closing those that were
// dropped meanwhile and are no longer read.
func (d *objdir) release(ps []*pack) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range ps {
		p.refs--
		if p.refs == 0 && p.dropped {
			p.close()
		}
	}
}

// rescan brings the list of packs up to date with objects/pack: new ones
// opened, vanished ones dropped.
func (d *objdir) rescan() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.scanLocked()
	return nil
}

func (d *objdir) scanLocked() {
	d.scanned = true
	dir := filepath.Join(d.path, "pack")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		d.broken = map[string]error{dir: fmt.Errorf("%w: %v", ErrCorrupt, err)}
		return
	}
	present := map[string]bool{}
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, "pack-") && strings.HasSuffix(n, ".idx") {
			present[n] = true
		}
	}
	kept := d.packs[:0:0]
	for _, p := range d.packs {
		if present[p.name] {
			kept = append(kept, p)
			delete(present, p.name)
			continue
		}
		p.dropped = true
		if p.refs == 0 {
			p.close()
		}
	}
	d.broken = map[string]error{}
	names := make([]string, 0, len(present))
	for n := range present {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p, err := openPack(dir, n)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// An index whose pack is gone (gc deleting it) or not yet
			// renamed in: nothing to read, nothing wrong.
		case err != nil:
			d.broken[n] = err
		default:
			kept = append(kept, p)
		}
	}
	d.packs = kept
}

// brokenErr reports the packs the last scan could not open, so that a miss
// is not called ErrNotFound when the object may be in one of them.
func (d *objdir) brokenErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, err := range d.broken {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (d *objdir) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, p := range d.packs {
		p.dropped = true
		if p.refs == 0 {
			p.close()
		}
	}
	d.packs = nil
	return nil
}

// loosePath is where git keeps the loose object id.
func (d *objdir) loosePath(id []byte) string {
	h := hex.EncodeToString(id)
	return filepath.Join(d.path, h[:2], h[2:])
}

// hasLoose reports whether a loose object file exists for id.
func (d *objdir) hasLoose(id []byte) (bool, error) {
	fi, err := os.Stat(d.loosePath(id))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return fi.Mode().IsRegular(), nil
}

// maxLooseHeader bounds a loose object's "type size\0" header: the longest
// type and a 20-digit size fit well inside.
const maxLooseHeader = 32

// readLoose reads the loose object id: a zlib stream of "type size\0"
// and exactly size bytes of content. It returns os.ErrNotExist (wrapped)
// when the file is gone, as after gc packed it.
func (d *objdir) readLoose(id []byte, max int64) (string, []byte, error) {
	f, err := openRegular(d.loosePath(id))
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	zr, err := zlib.NewReader(bufio.NewReader(f))
	if err != nil {
		return "", nil, fmt.Errorf("%w: loose object %x: %v", ErrCorrupt, id, err)
	}
	defer zr.Close()
	var head [maxLooseHeader]byte
	n, err := io.ReadFull(zr, head[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", nil, fmt.Errorf("%w: loose object %x: %v", ErrCorrupt, id, err)
	}
	typ, size, hlen, err := parseLooseHeader(head[:n])
	if err != nil {
		return "", nil, fmt.Errorf("%w: loose object %x: %v", ErrCorrupt, id, err)
	}
	if size > max {
		return "", nil, fmt.Errorf("%w: %s %x is %d bytes, the limit is %d", ErrTooLarge, typ, id, size, max)
	}
	// The header's read may have taken the start of the content too.
	start := head[hlen:n]
	if int64(len(start)) > size {
		return "", nil, fmt.Errorf("%w: loose object %x: content longer than its header's %d bytes", ErrCorrupt, id, size)
	}
	data, err := readN(io.MultiReader(bytes.NewReader(start), zr), size)
	if err != nil {
		return "", nil, fmt.Errorf("%w: loose object %x: content shorter than its header's %d bytes: %v", ErrCorrupt, id, size, err)
	}
	if err := expectEnd(zr); err != nil {
		return "", nil, fmt.Errorf("%w: loose object %x: %v", ErrCorrupt, id, err)
	}
	if err := checkHash(id, typ, data); err != nil {
		return "", nil, err
	}
	return typ, data, nil
}

// expectEnd checks that a zlib stream has no content left and that its
// checksum holds (which the reader checks on reaching the end).
func expectEnd(r io.Reader) error {
	var one [1]byte
	n, err := io.ReadFull(r, one[:])
	switch {
	case n > 0:
		return errors.New("content longer than its header says")
	case errors.Is(err, io.EOF):
		return nil
	}
	return err
}

// parseLooseHeader parses "type size\0" at the start of b and returns the
// header's length with the NUL.
func parseLooseHeader(b []byte) (typ string, size int64, n int, err error) {
	nul := bytes.IndexByte(b, 0)
	if nul < 0 {
		return "", 0, 0, errors.New("no header")
	}
	t, s, ok := strings.Cut(string(b[:nul]), " ")
	if !ok {
		return "", 0, 0, errors.New("header without a size")
	}
	switch t {
	case "commit", "tree", "blob", "tag":
	default:
		return "", 0, 0, fmt.Errorf("unknown type %q", t)
	}
	if s == "" || s[0] < '0' || s[0] > '9' || (len(s) > 1 && s[0] == '0') {
		return "", 0, 0, fmt.Errorf("bad size %q", s)
	}
	size, err = strconv.ParseInt(s, 10, 64)
	if err != nil {
		return "", 0, 0, fmt.Errorf("bad size %q", s)
	}
	return t, size, nul + 1, nil
}

// openRegular opens a file for reading and refuses anything but a regular
// file: a hostile repository could put a FIFO (which would block a reader
// for ever) or a device where an object belongs. The open itself does not
// block on a FIFO.
func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%w: %s is not a regular file", ErrCorrupt, path)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// loosePrefix returns the ids of loose objects starting with prefix (at
// least two hex digits).
func (d *objdir) loosePrefix(prefix string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(d.path, prefix[:2]))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if (len(n) == 38 || len(n) == 62) && isHex(n) && strings.HasPrefix(prefix[:2]+n, prefix) {
			out = append(out, prefix[:2]+n)
		}
	}
	return out, nil
}

// ReadFile reads a small file of a repository (a ref, packed-refs,
// commondir, info/alternates) the way this package reads its objects: a
// regular file only (a FIFO or device is refused without blocking), and at
// most max bytes (ErrTooLarge past it). A missing file's error matches
// os.ErrNotExist.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrTooLarge, path, max)
	}
	return data, nil
}
