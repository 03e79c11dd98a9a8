package api

import (
	"testing"

	"google.golang.org/protobuf/proto"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestWireName: a file name a job made that is not UTF-8 still lists (a
// proto string must be UTF-8), escaped, with its bytes beside.
func TestWireName(t *testing.T) {
	for name, want := range map[string]string{"/work/ok.go": "/work/ok.go", "/work/\xff\x1bé": `/work/\xff` + "\x1bé"} {
		got, raw := wireName(name)
		if got != want {
			t.Errorf("wireName(%q) = %q, want %q", name, got, want)
		}
		if (raw != nil) != (got != name) || (raw != nil && string(raw) != name) {
			t.Errorf("wireName(%q) raw = %q", name, raw)
		}
		if _, err := proto.Marshal(&typesv1.FileEntry{Path: got, RawPath: raw}); err != nil {
			t.Errorf("wireName(%q): the entry does not marshal: %v", name, err)
		}
	}
}
