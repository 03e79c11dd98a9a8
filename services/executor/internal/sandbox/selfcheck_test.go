package sandbox

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/runspec"
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

// A pass is recorded under the executor's state dir: an executor that
// starts again there with the same binaries, platform, check length, kernel
// and CPU skips the check (and says it did); a change of any of them runs
// it again.
func TestSelfCheckCached(t *testing.T) {
	first := newEnv(t, ownSelfCheck)
	probe := func(e *env) (RuntimeStatus, time.Duration) {
		t.Helper()
		start := time.Now()
		st, ok := e.m.Available(ClassRunsc)
		if !ok {
			t.Fatalf("runsc unavailable: %s", st.Reason)
		}
		if st.SelfCheck != SelfCheckPassed {
			t.Fatalf("self-check %q, want passed", st.SelfCheck)
		}
		return st, time.Since(start)
	}
	st, cold := probe(first)
	if st.SelfCheckCached {
		t.Fatal("the first probe in a new state dir says its self-check was cached")
	}
	again := newEnv(t, ownSelfCheck, func(c *Config) { c.StateDir = first.cfg.StateDir })
	st, warm := probe(again)
	if !st.SelfCheckCached {
		t.Fatal("a second start in the same state dir ran the self-check again")
	}
	longer := newEnv(t, ownSelfCheck, func(c *Config) {
		c.StateDir = first.cfg.StateDir
		c.RunscSelfCheck = first.cfg.RunscSelfCheck + time.Second
	})
	if st, _ := probe(longer); st.SelfCheckCached {
		t.Fatal("a longer self-check was taken from a shorter one's pass")
	}
	t.Logf("probe with the self-check (%s): %s; with its pass cached: %s", first.cfg.RunscSelfCheck, cold.Round(time.Millisecond), warm.Round(time.Millisecond))
	if warm >= cold-first.cfg.RunscSelfCheck/2 {
		t.Errorf("the cached probe took %s, the full one %s", warm, cold)
	}
}

// newStamp is a pass stamp in a fresh root-only directory.
func newStamp(t *testing.T) passStamp {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cache")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return passStamp{dir: dir, key: strings.Repeat("ab", 32)}
}

// checkRuns calls p.check, its self-check passing, and says whether the
// self-check ran. A stamp that stalls the check fails the test.
func checkRuns(t *testing.T, p passStamp, cache bool) bool {
	t.Helper()
	ran := make(chan bool, 1)
	go func() {
		r := false
		_, cached := p.check(cache, func() string { r = true; return "" }, slog.New(slog.DiscardHandler))
		if cached == r {
			t.Errorf("cached %v, ran %v", cached, r)
		}
		ran <- r
	}()
	select {
	case r := <-ran:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("the stamp check has not returned after 5s")
		return false
	}
}

// A pass is recorded and trusted by the next check; a stamp that anyone
// but the executor's user could have written, or that is not a plain
// small file, is ignored and the check runs: where the cache directory is
// not root-only, a stamp is trivially forged (its content is computable)
// and a FIFO or a link to /dev/zero would stall or exhaust the start.
func TestPassStampRefusesForgeries(t *testing.T) {
	p := newStamp(t)
	if !checkRuns(t, p, true) {
		t.Fatal("the first check did not run")
	}
	if checkRuns(t, p, true) {
		t.Fatal("a recorded pass was not trusted")
	}
	for name, plant := range map[string]func(t *testing.T, p passStamp){
		"symlinked stamp": func(t *testing.T, p passStamp) {
			real := filepath.Join(t.TempDir(), "elsewhere")
			if err := os.WriteFile(real, []byte(p.key), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, p.path()); err != nil {
				t.Fatal(err)
			}
		},
		"FIFO stamp": func(t *testing.T, p passStamp) {
			if err := unix.Mkfifo(p.path(), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"group-writable directory": func(t *testing.T, p passStamp) {
			if err := os.WriteFile(p.path(), []byte(p.key), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p.dir, 0o770); err != nil {
				t.Fatal(err)
			}
		},
		"directory of another user": func(t *testing.T, p passStamp) {
			if err := os.WriteFile(p.path(), []byte(p.key), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p.dir, 54321, 54321); err != nil {
				t.Fatal(err)
			}
		},
		"stamp of another user": func(t *testing.T, p passStamp) {
			if err := os.WriteFile(p.path(), []byte(p.key), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p.path(), 54321, 54321); err != nil {
				t.Fatal(err)
			}
		},
		"group-writable stamp": func(t *testing.T, p passStamp) {
			if err := os.WriteFile(p.path(), []byte(p.key), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p.path(), 0o620); err != nil {
				t.Fatal(err)
			}
		},
		"stamp with more than the key": func(t *testing.T, p passStamp) {
			if err := os.WriteFile(p.path(), []byte(p.key+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := newStamp(t)
			plant(t, p)
			if !checkRuns(t, p, true) {
				t.Fatalf("a %s stood in for the self-check", name)
			}
		})
	}
}

// A platform other than ptrace is checked at every start: its failures
// are probabilistic (systrap failed after 2 and 8 s of 10), so one lucky
// pass is not trusted for later starts.
func TestPassStampNotCachedWhenUncacheable(t *testing.T) {
	p := newStamp(t)
	for range 2 {
		if !checkRuns(t, p, false) {
			t.Fatal("an uncacheable self-check was skipped")
		}
	}
	if _, err := os.Lstat(p.path()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an uncacheable pass was recorded: %v", err)
	}
	// Nor is a stamp left by an earlier (cacheable) run trusted.
	if err := os.WriteFile(p.path(), []byte(p.key), 0o600); err != nil {
		t.Fatal(err)
	}
	if !checkRuns(t, p, false) {
		t.Fatal("an uncacheable self-check was taken from a stamp")
	}
}

// Only the one line of a pass passes: a job that exits 0 having printed
// nothing, something else, or a pass of no rounds has not run the check.
func TestSelfCheckVerdict(t *testing.T) {
	for _, out := range []string{"airlock-selfcheck ok rounds=1", "airlock-selfcheck ok rounds=48213\n"} {
		if why := selfCheckVerdict(out); why != "" {
			t.Errorf("%q: %s", out, why)
		}
	}
	for _, out := range []string{"", "hello\n", "airlock-selfcheck ok", "airlock-selfcheck ok rounds=0\n",
		"airlock-selfcheck ok rounds=-3", "airlock-selfcheck ok rounds=x", "airlock-selfcheck ok rounds=5\nmore\n"} {
		if why := selfCheckVerdict(out); why == "" {
			t.Errorf("%q passed", out)
		}
	}
}

// On any host the self-check's threads fit its pids limit (RLIMIT_NPROC
// inside gVisor), which runsc accepts: on a 128-CPU host a GOMAXPROCS of
// 256 under a limit of 256 killed the check and refused runsc.
func TestSelfCheckPidsFitProcs(t *testing.T) {
	for _, ncpu := range []int{1, 2, 8, 32, 64, 128, 512} {
		procs, pids := selfCheckProcs(ncpu), selfCheckPids(ncpu)
		if procs < min(4, 2*ncpu) || procs > 64 {
			t.Errorf("%d CPUs: GOMAXPROCS %d, want 4 to 64", ncpu, procs)
		}
		if pids < 4*int64(procs)+64 {
			t.Errorf("%d CPUs: pids %d for GOMAXPROCS %d", ncpu, pids, procs)
		}
		l := defaultLimits
		l.Pids = pids
		if err := runspec.CheckLimits(runspec.ClassRunsc, runspec.Limits{CPUMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes,
			Pids: l.Pids, DiskBytes: l.DiskBytes, Deadline: l.Deadline}); err != nil {
			t.Errorf("%d CPUs: %v", ncpu, err)
		}
	}
}

// Under systrap no start takes the self-check from a stamp, even one the
// executor itself could have written for exactly this runsc, executor,
// kernel and CPU: one lucky pass of a probabilistic failure is not trusted.
func TestSelfCheckNotCachedOffPtrace(t *testing.T) {
	systrap := func(c *Config) { c.RunscPlatform = "systrap" }
	first := newEnv(t, ownSelfCheck, systrap)
	st, _ := first.m.Available(ClassRunsc)
	if st.Version == "" {
		t.Fatalf("runsc unavailable before the self-check: %s", st.Reason)
	}
	t.Logf("systrap's self-check: %s %s", st.SelfCheck, st.Reason)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	key, err := first.m.selfCheckKey(self, st.Version)
	if err != nil {
		t.Fatal(err)
	}
	p := passStamp{dir: first.m.cfg.RunscSelfCheckCache, key: key}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.path(), []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	again := newEnv(t, ownSelfCheck, systrap, func(c *Config) { c.StateDir = first.cfg.StateDir })
	st, _ = again.m.Available(ClassRunsc)
	if st.SelfCheckCached || st.SelfCheck == "" {
		t.Fatalf("systrap's self-check %q, cached %v: want it run", st.SelfCheck, st.SelfCheckCached)
	}
}

// A self-check job that exits 0 without a pass of some rounds (here its
// length, a nanosecond, is over before any round starts, so it prints
// rounds=0) is refused: an exit status alone proves nothing.
func TestSelfCheckWithoutRoundsRefused(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RunscSelfCheck = time.Nanosecond })
	if st, ok := e.m.Available(ClassRunsc); ok || st.SelfCheck != SelfCheckFailed || !strings.Contains(st.Reason, selfCheckOutput+" rounds=0") {
		t.Fatalf("Available(a self-check of no rounds) = %+v, %v; want refused, naming what it printed", st, ok)
	}
}
