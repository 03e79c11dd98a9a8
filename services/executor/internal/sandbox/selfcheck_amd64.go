package sandbox

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/cpu"
)

// vectorRoundTrip is in selfcheck_amd64.s.
//
//go:noescape
func vectorRoundTrip(seed uint64, out *[2048 + 64]byte)

// checkVectorRegisters loads a pattern of its own into every AVX-512
// register, makes a system call, and says which register came back
// changed, "" if none did (or the CPU has no AVX-512, where it checks
// nothing). Under gVisor's systrap platform a thread came back from a
// signal with another thread's registers (issue 20).
func checkVectorRegisters(seed uint64) string {
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512BW {
		return ""
	}
	var out [2048 + 64]byte
	vectorRoundTrip(seed, &out)
	const step = 0x0123456789abcdef
	v := seed
	for r := range 32 {
		for lane := range 8 {
			if got := binary.LittleEndian.Uint64(out[64*r+8*lane:]); got != v {
				return fmt.Sprintf("zmm%d lane %d is %#x after a system call, want %#x", r, lane, got, v)
			}
		}
		v += step
	}
	for k := 1; k < 8; k++ {
		if got := binary.LittleEndian.Uint64(out[2048+8*k:]); got != v {
			return fmt.Sprintf("k%d is %#x after a system call, want %#x", k, got, v)
		}
		v += step
	}
	return ""
}
