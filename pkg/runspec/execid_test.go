package runspec_test

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/runspec"
)

// TestValidExecID: 1 to 128 of [A-Za-z0-9._:-], byte for byte: no other
// ASCII, no multi-byte letter, nothing longer.
func TestValidExecID(t *testing.T) {
	for id, want := range map[string]bool{
		"a": true, "x-9a09c1e64e99ed706ce00a22": true, "A.Z_0:9-z": true, strings.Repeat("a", 128): true,
		"": false, strings.Repeat("a", 129): false, "a b": false, "a/b": false, "a\x00": false, "é": false,
		"a\n": false, "..": true, "a+b": false, "\u0661": false,
	} {
		if got := runspec.ValidExecID(id); got != want {
			t.Errorf("ValidExecID(%q) = %v, want %v", id, got, want)
		}
	}
}
