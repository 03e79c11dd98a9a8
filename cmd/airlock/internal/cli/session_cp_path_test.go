package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSessionCpRefusesNonUTF8Path: a session path that is not UTF-8 is
// refused before anything is sent (a proto string cannot carry it), as a
// usage error naming the path, not a marshaling error.
func TestSessionCpRefusesNonUTF8Path(t *testing.T) {
	local := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(local, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := serveFake(t, &fakeAuthority{})
	for _, args := range [][]string{{local, "s-1:/work/\xff\xfe"}, {"s-1:/out/\xff", local}} {
		code, _, errOut := runCLI(t, cfg, nil, append([]string{"session", "cp"}, args...)...)
		if code != 2 || !strings.Contains(errOut, `not valid UTF-8`) || !strings.Contains(errOut, "path ") || strings.Contains(errOut, "marshal") {
			t.Errorf("session cp %q: exit %d: %s", args, code, errOut)
		}
	}
}
