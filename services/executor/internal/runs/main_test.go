package runs

import (
	"fmt"
	"os"
	"testing"
)

// selfCheckCache is where every sandbox manager of the package's tests
// records runsc's self-check: it runs once for the test binary, not for
// each harness (ten seconds each).
var selfCheckCache string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "airlock-runs-selfcheck-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	selfCheckCache = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
