package bundle_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/bundle"
)

// TestCopy: the bytes are copied whole and the digest checked over all of
// them; other bytes, one more or one fewer, are ErrDigestMismatch, and a
// copy with no digest to check reads nothing.
func TestCopy(t *testing.T) {
	data := []byte(strings.Repeat("bundle ", 10000))
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	var out bytes.Buffer
	if n, err := bundle.Copy(&out, bytes.NewReader(data), digest); err != nil || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("Copy: %d bytes, %v", n, err)
	}
	for name, bad := range map[string][]byte{"changed": append([]byte("B"), data[1:]...), "longer": append(bytes.Clone(data), 0), "shorter": data[:len(data)-1]} {
		if _, err := bundle.Copy(&bytes.Buffer{}, bytes.NewReader(bad), digest); !errors.Is(err, bundle.ErrDigestMismatch) {
			t.Errorf("%s: %v, want ErrDigestMismatch", name, err)
		}
	}
	r := bytes.NewReader(data)
	if _, err := bundle.Copy(&bytes.Buffer{}, r, ""); err == nil || r.Len() != len(data) {
		t.Errorf("no digest: %v, %d bytes read", err, len(data)-r.Len())
	}
}
