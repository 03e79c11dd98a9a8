package gitobj

import (
	"errors"
	"fmt"
	"math"
	"os"
)

// maxDeltaChain bounds how many deltas an object may be rebuilt through.
// Git sets no bound of its own (--depth is 50 by default, 250 with
// --aggressive; longer chains are legal); the bound turns a cycle of
// reference deltas in a hostile pack into an error.
const maxDeltaChain = 10000

// minBaseLimit and baseFactor set how large a delta base may be: git does
// not delta an object against a base more than 32 times its size, so
// bases up to 64 times the caller's limit (and never less than 16 MiB) let
// every chain git writes be read, while a small object cannot make a read
// inflate an unbounded base.
const (
	minBaseLimit = 16 << 20
	baseFactor   = 64
)

// baseLimit is the largest delta base (or intermediate result) a read
// with limit max inflates.
func baseLimit(max int64) int64 {
	if max > math.MaxInt64/baseFactor {
		return max
	}
	return maxOf(baseFactor*max, minBaseLimit)
}

func maxOf(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// reader is one call's view of the store: the packs it holds open until
// it ends, including those an earlier scan showed it.
type reader struct {
	s    *Store
	held [][]*pack // per object directory, the current packs
	old  [][]*pack // per object directory, packs of earlier scans
}

func (s *Store) begin() (*reader, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	r := &reader{s: s, held: make([][]*pack, len(s.dirs)), old: make([][]*pack, len(s.dirs))}
	for i, d := range s.dirs {
		r.held[i] = d.acquire()
	}
	return r, nil
}

func (r *reader) end() {
	for i, d := range r.s.dirs {
		d.release(r.held[i])
		d.release(r.old[i])
	}
}

// location is where an object is: an entry of a pack, or a loose file of
// an object directory.
type location struct {
	p   *pack
	off int64
	dir *objdir
}

// locate finds id in the packs held, then loose; on a miss it rescans the
// packs once, as a fetch or gc beside us may have moved the object into a
// pack this call has not seen.
func (r *reader) locate(id []byte) (location, error) {
	loc, ok, err := r.lookup(id)
	if ok || err != nil {
		return loc, err
	}
	if err := r.refresh(); err != nil {
		return location{}, err
	}
	loc, ok, err = r.lookup(id)
	if ok || err != nil {
		return loc, err
	}
	var broken []error
	for _, d := range r.s.dirs {
		if err := d.brokenErr(); err != nil {
			broken = append(broken, err)
		}
	}
	if len(broken) > 0 {
		return location{}, fmt.Errorf("%w: object %x not found, and packs that may hold it cannot be read: %v", ErrCorrupt, id, errors.Join(broken...))
	}
	return location{}, fmt.Errorf("%w: %x", ErrNotFound, id)
}

// refresh rescans every object directory's packs and holds the current
// ones, keeping those held before until the call ends: a delta chain may
// still be reading them.
func (r *reader) refresh() error {
	if r.s.closed.Load() {
		return ErrClosed
	}
	for i, d := range r.s.dirs {
		if err := d.rescan(); err != nil {
			return err
		}
		r.old[i] = append(r.old[i], r.held[i]...)
		r.held[i] = d.acquire()
	}
	return nil
}

func (r *reader) lookup(id []byte) (location, bool, error) {
	for i, d := range r.s.dirs {
		for _, p := range r.held[i] {
			off, ok, err := p.find(id)
			if err != nil || ok {
				return location{p: p, off: off}, ok, err
			}
		}
		ok, err := d.hasLoose(id)
		if err != nil || ok {
			return location{dir: d}, ok, err
		}
	}
	return location{}, false, nil
}

// read returns the object id. A loose object that vanishes between being
// found and being opened (gc packing it) is looked for again, once.
func (r *reader) read(id []byte, max int64) (string, []byte, error) {
	for attempt := 0; ; attempt++ {
		loc, err := r.locate(id)
		if err != nil {
			return "", nil, err
		}
		if loc.dir == nil {
			return r.readPacked(loc, id, max)
		}
		typ, data, err := loc.dir.readLoose(id, max)
		if errors.Is(err, os.ErrNotExist) {
			if attempt == 0 {
				continue
			}
			return "", nil, fmt.Errorf("%w: %x", ErrNotFound, id)
		}
		if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) {
			err = fmt.Errorf("%w: loose object %x: %v", ErrCorrupt, id, err)
		}
		return typ, data, err
	}
}

// link is one delta of a chain.
type link struct {
	p *pack
	e entry
}

// readPacked rebuilds the object at loc: it follows deltas to their base
// by offset or by id (in the same pack, another pack or a loose object),
// refuses a result over max before doing the work, then applies the
// deltas from the base outwards.
func (r *reader) readPacked(loc location, id []byte, max int64) (string, []byte, error) {
	var chain []link
	var baseEntry link
	var looseBase *objdir
	var looseID []byte
walk:
	for {
		if len(chain) > maxDeltaChain {
			return "", nil, fmt.Errorf("%w: object %x: more than %d deltas deep", ErrCorrupt, id, maxDeltaChain)
		}
		e, err := loc.p.entryAt(loc.off)
		if err != nil {
			return "", nil, err
		}
		switch e.typ {
		case objOfsDelta:
			chain = append(chain, link{loc.p, e})
			loc.off = e.baseOff
		case objRefDelta:
			chain = append(chain, link{loc.p, e})
			off, ok, err := loc.p.find(e.baseID)
			if err != nil {
				return "", nil, err
			}
			if ok {
				loc.off = off
				continue
			}
			base, err := r.locate(e.baseID)
			if errors.Is(err, ErrNotFound) {
				return "", nil, fmt.Errorf("%w: object %x: delta base %x is missing", ErrCorrupt, id, e.baseID)
			}
			if err != nil {
				return "", nil, err
			}
			if base.dir != nil {
				looseBase, looseID = base.dir, e.baseID
				break walk
			}
			loc = base
		default:
			baseEntry = link{loc.p, e}
			break walk
		}
	}
	if len(chain) == 0 {
		if baseEntry.e.size > max {
			return "", nil, fmt.Errorf("%w: object %x is %d bytes, the limit is %d", ErrTooLarge, id, baseEntry.e.size, max)
		}
		return inflateChecked(baseEntry, id)
	}
	// The outermost delta states the object's size: refuse before
	// inflating any base.
	head, err := chain[0].p.inflateHead(chain[0].e.dataOff, 20)
	if err != nil {
		return "", nil, err
	}
	if _, dst, _, err := deltaSizes(head); err != nil {
		return "", nil, fmt.Errorf("%w: object %x: %v", ErrCorrupt, id, err)
	} else if dst > max {
		return "", nil, fmt.Errorf("%w: object %x is %d bytes, the limit is %d", ErrTooLarge, id, dst, max)
	}
	limit := baseLimit(max)
	var typ string
	var data []byte
	if looseBase != nil {
		typ, data, err = looseBase.readLoose(looseID, limit)
		if errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("%w: object %x: loose delta base %x vanished", ErrNotFound, id, looseID)
		}
	} else {
		if baseEntry.e.size > limit {
			return "", nil, fmt.Errorf("%w: object %x: delta base is %d bytes, the limit is %d", ErrTooLarge, id, baseEntry.e.size, limit)
		}
		typ = typeNames[baseEntry.e.typ]
		data, err = baseEntry.p.inflate(baseEntry.e.dataOff, baseEntry.e.size)
	}
	if err != nil {
		return "", nil, err
	}
	for i := len(chain) - 1; i >= 0; i-- {
		l := chain[i]
		if l.e.size > limit {
			return "", nil, fmt.Errorf("%w: object %x: delta is %d bytes, the limit is %d", ErrTooLarge, id, l.e.size, limit)
		}
		delta, err := l.p.inflate(l.e.dataOff, l.e.size)
		if err != nil {
			return "", nil, err
		}
		target := limit
		if i == 0 {
			target = max
		}
		if data, err = applyDelta(data, delta, target); err != nil {
			return "", nil, fmt.Errorf("object %x: %w", id, err)
		}
	}
	if err := checkHash(id, typ, data); err != nil {
		return "", nil, err
	}
	return typ, data, nil
}

// inflateChecked reads a whole (non-delta) entry and checks it against id.
func inflateChecked(l link, id []byte) (string, []byte, error) {
	data, err := l.p.inflate(l.e.dataOff, l.e.size)
	if err != nil {
		return "", nil, err
	}
	typ := typeNames[l.e.typ]
	if err := checkHash(id, typ, data); err != nil {
		return "", nil, err
	}
	return typ, data, nil
}
