package sandbox

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The self-check's workload passes where nothing corrupts it (here, on the
// host), and every part of it ran.
func TestSelfCheckMain(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := selfCheckMain(300*time.Millisecond, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), selfCheckOutput+" rounds=") {
		t.Fatalf("selfCheckMain = %d, stdout %q, stderr %q; want 0 and %q", code, stdout.String(), stderr.String(), selfCheckOutput)
	}
	for n := range 40 {
		if deepFrames(n, 5) != deepFramesWant(n, 5) {
			t.Fatalf("deepFrames(%d, 5) = %#x, deepFramesWant %#x", n, deepFrames(n, 5), deepFramesWant(n, 5))
		}
	}
}
