package server

import (
	"bytes"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The executor lowers its own OOM score to -900, so the kernel kills jobs
// (1000) first, though not to -1000, which would make it unkillable. A
// host that withholds CAP_SYS_RESOURCE (this one may) leaves its score as
// it was, with a warning, and the executor still starts.
func TestProtectFromOOM(t *testing.T) {
	read := func() string {
		b, err := os.ReadFile("/proc/self/oom_score_adj")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	was := read()
	t.Cleanup(func() {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(was), 0); err != nil {
			t.Errorf("restore oom_score_adj %s: %v", was, err)
		}
	})
	var log bytes.Buffer
	if err := protectFromOOM(slog.New(slog.NewTextHandler(&log, nil))); err != nil {
		t.Fatal(err)
	}
	want, warned := "-900", false
	if !hasCap(t, unix.CAP_SYS_RESOURCE) {
		want, warned = was, true
		t.Logf("no CAP_SYS_RESOURCE here: only the fallback is tested")
	}
	if got := read(); got != want {
		t.Errorf("oom_score_adj %s after protectFromOOM, want %s", got, want)
	}
	if got := strings.Contains(log.String(), "cannot lower its oom_score_adj"); got != warned {
		t.Errorf("warned %v, want %v; log %q", got, warned, log.String())
	}
}

// hasCap reports whether this process has capability c in effect.
func hasCap(t *testing.T, c int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return eff&(1<<c) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}
