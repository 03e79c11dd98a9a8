package bundle

import (
	"crypto/sha256"
	"fmt"
	"io"
)

// Copy copies a whole bundle from r to w and checks that the bytes copied
// have digest: ErrDigestMismatch when they do not. What w received before
// a mismatch is not that bundle; a caller that keeps it must discard it (a
// file: write to a temporary one and rename it only after Copy succeeds).
// A copy with no digest to check is refused before reading.
func Copy(w io.Writer, r io.Reader, digest string) (int64, error) {
	if digest == "" {
		return 0, fmt.Errorf("bundle: Copy needs the expected digest")
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), r)
	if err != nil {
		return n, err
	}
	if got := digestOf(h); got != digest {
		return n, fmt.Errorf("%w: the bytes read are %s, not %s", ErrDigestMismatch, got, digest)
	}
	return n, nil
}
