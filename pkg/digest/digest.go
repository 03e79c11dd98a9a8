// Package digest checks and makes the content digests Airlock names
// things by: "sha256:" and 64 lowercase hex digits, as OCI and in-toto
// write them.
package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

var re = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Valid reports whether d is a sha256 digest in its canonical form.
func Valid(d string) bool { return re.MatchString(d) }

// Check says why d is not a sha256 digest in its canonical form.
func Check(d string) error {
	if !Valid(d) {
		return fmt.Errorf("%q is not a sha256 digest (sha256:<64 lowercase hex>)", clip(d))
	}
	return nil
}

// Hex is d's hex part; d must be Valid.
func Hex(d string) string { return strings.TrimPrefix(d, "sha256:") }

// Of is the digest of data.
func Of(data []byte) string {
	sum := sha256.Sum256(data)
	return FromSum(sum[:])
}

// FromSum is the digest of a finished sha256 sum.
func FromSum(sum []byte) string { return "sha256:" + hex.EncodeToString(sum) }

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
