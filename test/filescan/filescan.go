//go:build linux

// Package filescan searches files for strings the way a test looking for a
// leaked secret needs to: a file's every written byte, its holes skipped.
package filescan

import (
	"bytes"
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Contains says which of needles (none empty, none holding a NUL) the
// file at path holds. It reads the file's data in chunks, keeping enough of
// each chunk's end for a match across two, and skips its holes, which read
// as NULs and so hold no needle: a job's sparse 1 GiB disk image costs its
// written blocks, not a gigabyte in memory (twice, as a string).
func Contains(path string, needles []string) ([]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	keep := 0
	for _, n := range needles {
		keep = max(keep, len(n)-1)
	}
	found := make([]bool, len(needles))
	buf := make([]byte, keep+4<<20)
	fd := int(f.Fd())
	for off, size := int64(0), st.Size(); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		hole = min(hole, size)
		// A hole before this data ends any match that began before it.
		k := 0
		for pos := data; pos < hole; {
			n, err := f.ReadAt(buf[k:k+int(min(int64(len(buf)-k), hole-pos))], pos)
			if n == 0 && err != nil {
				if err == io.EOF {
					break // the file shrank while read
				}
				return nil, err
			}
			window := buf[:k+n]
			for i, needle := range needles {
				found[i] = found[i] || bytes.Contains(window, []byte(needle))
			}
			k = min(keep, len(window))
			copy(buf, window[len(window)-k:])
			pos += int64(n)
		}
		off = hole
	}
	return found, nil
}
