//go:build linux

package filescan

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A needle in a sparse file's data far past its holes is found, one across
// two of the scan's chunks too, and one the file lacks is not.
func TestContains(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("dump.txt"), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("xxSECRETxx"), 600<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got, err := Contains(p, []string{"dump.txt", "SECRET", "absent"}); err != nil || !slices.Equal(got, []bool{true, true, false}) {
		t.Fatalf("sparse file: %v, %v; want [true true false]", got, err)
	}
	dense := bytes.Repeat([]byte{'a'}, 9<<20)
	copy(dense[4<<20-3:], "SECRET")
	if err := os.WriteFile(p, dense, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Contains(p, []string{"dump.txt", "SECRET"}); err != nil || !slices.Equal(got, []bool{false, true}) {
		t.Fatalf("a needle across two chunks: %v, %v; want [false true]", got, err)
	}
}
