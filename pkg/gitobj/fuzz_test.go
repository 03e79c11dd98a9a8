package gitobj

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzApplyDelta feeds arbitrary deltas to the applier: it may refuse
// them, but must not panic, and what it returns must have the size the
// delta states and stay within the limit.
func FuzzApplyDelta(f *testing.F) {
	base := bytes.Repeat([]byte("0123456789abcdef"), 8)
	f.Add(base, makeDelta(base, 10, []byte("inserted")), int64(1000))
	f.Add(base, []byte{0x80, 0x01, 0x05, 0x91, 0x00, 0x05}, int64(10))
	f.Add(base, []byte{0x80, 0x01, 0x80, 0x80, 0x04, 0x80}, int64(1<<20)) // copy of size 0 = 0x10000
	f.Add([]byte{}, []byte{0x00, 0x03, 0x03, 'a', 'b', 'c'}, int64(3))
	f.Add([]byte{}, []byte{0x00, 0x01, 0x00}, int64(1)) // opcode 0
	f.Add(base, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, int64(1))
	f.Fuzz(func(t *testing.T, base, delta []byte, limit int64) {
		out, err := applyDelta(base, delta, limit)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("an error of no kind: %v", err)
			}
			return
		}
		_, dst, _, err := deltaSizes(delta)
		if err != nil || int64(len(out)) != dst || int64(len(out)) > limit {
			t.Fatalf("%d bytes out, the delta says %d (%v), limit %d", len(out), dst, err, limit)
		}
	})
}

// FuzzParseEntryHeader feeds arbitrary bytes to the entry header parser,
// and checks that what it parses encodes back to the same header.
func FuzzParseEntryHeader(f *testing.F) {
	for _, typ := range []int{objCommit, objBlob, objOfsDelta, objRefDelta} {
		for _, size := range []int64{0, 15, 16, 1 << 20, 1<<62 + 5} {
			h := encodeEntryHeader(typ, size)
			switch typ {
			case objOfsDelta:
				h = append(h, encodeOfs(1<<40+3)...)
			case objRefDelta:
				h = append(h, bytes.Repeat([]byte{0xab}, 20)...)
			}
			f.Add(h)
		}
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x60, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, size, dist, ref, n, err := parseEntryHeader(b, 20)
		if err != nil {
			return
		}
		if n > len(b) || size < 0 {
			t.Fatalf("header of %d bytes from %d, size %d", n, len(b), size)
		}
		again := encodeEntryHeader(typ, size)
		switch typ {
		case objOfsDelta:
			if dist <= 0 {
				t.Fatalf("distance %d", dist)
			}
			again = append(again, encodeOfs(uint64(dist))...)
		case objRefDelta:
			again = append(again, ref...)
		}
		// Encoding what was parsed and parsing it again gives the same
		// header, no longer than the input's.
		typ2, size2, dist2, ref2, n2, err := parseEntryHeader(again, 20)
		if err != nil || typ2 != typ || size2 != size || dist2 != dist || !bytes.Equal(ref2, ref) || n2 > n {
			t.Fatalf("%x parsed as type %d size %d dist %d; encoded again as %x: %d %d %d, %v", b[:n], typ, size, dist, again, typ2, size2, dist2, err)
		}
	})
}
