package gitobj

import (
	"errors"
	"fmt"
)

// deltaSize reads one of a delta's two leading sizes: 7 bits a byte, least
// significant first, while the top bit is set.
func deltaSize(b []byte) (int64, int, error) {
	var u uint64
	for i, shift := 0, uint(0); i < len(b); i, shift = i+1, shift+7 {
		c := b[i]
		if shift > 62 || uint64(c&0x7f)>>(63-shift) != 0 {
			return 0, 0, errors.New("delta size overflows")
		}
		u |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return int64(u), i + 1, nil
		}
	}
	return 0, 0, errors.New("truncated delta size")
}

// deltaSizes returns the source and target sizes a delta starts with, and
// where its instructions begin.
func deltaSizes(delta []byte) (src, dst int64, n int, err error) {
	src, n, err = deltaSize(delta)
	if err != nil {
		return 0, 0, 0, err
	}
	dst, m, err := deltaSize(delta[n:])
	if err != nil {
		return 0, 0, 0, err
	}
	return src, dst, n + m, nil
}

// applyDelta rebuilds an object from its base and a git delta: the base's
// size, the result's size, then instructions that copy a range of the
// base (the top bit set, the low four bits saying which offset bytes
// follow, the next three which size bytes, a size of 0 meaning 0x10000) or
// insert the next 1 to 127 bytes of the delta. The result must have the
// size the delta states, which may not exceed limit.
func applyDelta(base, delta []byte, limit int64) ([]byte, error) {
	src, dst, i, err := deltaSizes(delta)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if src != int64(len(base)) {
		return nil, fmt.Errorf("%w: delta expects a %d-byte base, got %d", ErrCorrupt, src, len(base))
	}
	if dst > limit {
		return nil, fmt.Errorf("%w: delta result is %d bytes, the limit is %d", ErrTooLarge, dst, limit)
	}
	// Sized for the usual result, a little more or less than its base;
	// a larger one grows as the instructions really produce it, so a
	// stated size is never allocated on trust.
	out := make([]byte, 0, min(dst, int64(len(base)+len(delta))))
	for i < len(delta) {
		op := delta[i]
		i++
		switch {
		case op&0x80 != 0:
			var off, size uint64
			for bit := uint(0); bit < 7; bit++ {
				if op&(1<<bit) == 0 {
					continue
				}
				if i >= len(delta) {
					return nil, fmt.Errorf("%w: truncated delta copy", ErrCorrupt)
				}
				if bit < 4 {
					off |= uint64(delta[i]) << (8 * bit)
				} else {
					size |= uint64(delta[i]) << (8 * (bit - 4))
				}
				i++
			}
			if size == 0 {
				size = 0x10000
			}
			if off+size > uint64(len(base)) {
				return nil, fmt.Errorf("%w: delta copies %d bytes at %d of a %d-byte base", ErrCorrupt, size, off, len(base))
			}
			if uint64(len(out))+size > uint64(dst) {
				return nil, fmt.Errorf("%w: delta writes past its %d-byte result", ErrCorrupt, dst)
			}
			out = append(out, base[off:off+size]...)
		case op != 0:
			n := int(op)
			if i+n > len(delta) {
				return nil, fmt.Errorf("%w: truncated delta insert", ErrCorrupt)
			}
			if int64(len(out)+n) > dst {
				return nil, fmt.Errorf("%w: delta writes past its %d-byte result", ErrCorrupt, dst)
			}
			out = append(out, delta[i:i+n]...)
			i += n
		default:
			return nil, fmt.Errorf("%w: delta opcode 0", ErrCorrupt)
		}
	}
	if int64(len(out)) != dst {
		return nil, fmt.Errorf("%w: delta result is %d bytes, it said %d", ErrCorrupt, len(out), dst)
	}
	return out, nil
}
