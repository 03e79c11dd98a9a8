package sandbox

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// soakSeconds bounds TestRunscSoak's compile loop: long enough, on a
// loaded two-core host, for a few whole builds, short enough that the
// package's tests stay well inside the Makefile's 15 minutes.
// AIRLOCK_SOAK_SECONDS changes it (a longer soak when hunting).
func soakSeconds(t *testing.T) int {
	s := os.Getenv("AIRLOCK_SOAK_SECONDS")
	if s == "" {
		return 60
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 10 {
		t.Fatalf("AIRLOCK_SOAK_SECONDS=%q: want a whole number of seconds, at least 10", s)
	}
	return n
}

// runtimeCrash matches what the Go runtime (and a dying compiler under it)
// prints when it finds its own stack or heap corrupted: issue 20 saw
// "unexpected return pc for cmd/compile/internal/ssa.Compile called from
// 0x87d8bacbfe281392" / "fatal error: unknown caller pc" under runsc.
var runtimeCrash = regexp.MustCompile(`unexpected return pc|unknown caller pc|fatal error:|unexpected signal|SIGSEGV|SIGILL|found bad pointer|invalid pointer found|runtime: `)

// TestRunscSoak builds the uuid module with every package recompiled (go
// build -a: a few dozen compiler and linker processes each time) again and
// again for soakSeconds inside one runsc job, while a runc job keeps a CPU
// busy beside it, and fails on any build that does not succeed and on any
// Go runtime crash in the output. A
// runsc whose platform corrupted a thread's state under CPU contention
// crashed the Go compiler once in a few such builds (issue 20, section 4);
// the compatibility suite, one build per run, passed most of the time.
func TestRunscSoak(t *testing.T) {
	e := newEnv(t)
	// In CI (CI=true) a runsc this host cannot run fails here.
	if !slices.Contains(testClasses(t, e), ClassRunsc) {
		t.Skip("runsc is unavailable here (the reason is logged above); CI=true makes this a failure")
	}
	goroot := hostGo(t, "env", "GOROOT")
	src := e.source(t, uuidSource(t))
	secs := soakSeconds(t)

	// The contender: a busy loop under runc with a whole CPU, for the whole
	// soak, so the runsc job's threads are preempted as on a loaded host.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	busyLimits := defaultLimits
	busyLimits.CPUMillis = 1000
	busyLimits.Deadline = time.Duration(secs+120) * time.Second
	busySB, err := e.m.Create(ctx, Spec{
		ID: fmt.Sprintf("job-%d", testSeq.Add(1)), Class: ClassRunc, Source: e.source(t, nil),
		Command: []string{"/bin/sh", "-c", "while :; do :; done"}, Limits: busyLimits, Stdout: io.Discard, Stderr: io.Discard,
	})
	if err != nil {
		t.Fatalf("Create the busy job: %v", err)
	}
	t.Cleanup(func() {
		if err := busySB.Destroy(); err != nil {
			t.Errorf("Destroy the busy job: %v", err)
		}
	})
	type busyRun struct {
		res Result
		err error
	}
	busyDone := make(chan busyRun, 1)
	go func() {
		res, err := busySB.Run(ctx)
		busyDone <- busyRun{res, err}
	}()

	// The job builds until its deadline ends it: on a slow host the soak
	// still lasts secs, never more; a build that fails ends it early.
	script := `set -u
i=0
while :; do
	go build -a -o /tmp/uuid.a . || { echo "build $((i+1)) failed"; exit 1; }
	i=$((i+1))
	echo "build $i ok"
done
`
	limits := Limits{CPUMillis: 2000, MemoryBytes: 2 << 30, Pids: 1024, DiskBytes: 2 << 30, Deadline: time.Duration(secs) * time.Second}
	r := e.run(t, context.Background(), job{class: ClassRunsc, src: src, cmd: []string{"/bin/sh", "-c", script}, limits: &limits, env: map[string]string{
		"PATH":        goroot + "/bin:" + defaultEnv["PATH"],
		"GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod",
		"GOCACHE": "/tmp/gocache", "GOPATH": "/tmp/gopath", "CGO_ENABLED": "0",
	}})
	stop()
	busy := <-busyDone

	builds := len(regexp.MustCompile(`(?m)^build \d+ ok$`).FindAllString(r.stdout, -1))
	t.Logf("runsc soak: %d whole builds, %v of CPU in %v, beside a busy runc job that had %v of CPU",
		builds, r.res.Usage.CPUTime.Round(time.Second), r.res.Usage.WallTime.Round(time.Second), busy.res.Usage.CPUTime.Round(time.Second))
	var why []string
	switch {
	case r.err != nil:
		why = append(why, fmt.Sprintf("Run: %v", r.err))
	case r.res.Reason != ReasonTimeout:
		why = append(why, fmt.Sprintf("ended %s with exit %d (%s), want the deadline to end it", r.res.Reason, r.res.ExitCode, r.res.Message))
	case r.res.Usage.CPUTime < time.Duration(secs)*time.Second/10:
		// A soak that never compiled proves nothing.
		why = append(why, fmt.Sprintf("the job had only %v of CPU in %ds", r.res.Usage.CPUTime, secs))
	}
	if m := runtimeCrash.FindString(r.stdout + r.stderr); m != "" {
		why = append(why, fmt.Sprintf("the output shows a Go runtime crash (%q)", m))
	}
	if busy.err != nil || busy.res.Usage.CPUTime < time.Second {
		why = append(why, fmt.Sprintf("the contending runc job did not run (err %v, cpu %v)", busy.err, busy.res.Usage.CPUTime))
	}
	if len(why) > 0 {
		t.Fatalf("runsc soak under CPU contention failed:\n%s\nstdout:\n%s\nstderr:\n%s", strings.Join(why, "\n"), ends(r.stdout), ends(r.stderr))
	}
}

// TestRunscPlatforms probes runsc on each platform with the self-check at
// its full length. ptrace, the default, must pass; systrap must either
// pass or be refused for the self-check, never be trusted after a failure.
// On the issue 20 host systrap is refused: a thread came back from a signal
// with another thread's vector registers.
func TestRunscPlatforms(t *testing.T) {
	for _, p := range slices.Sorted(maps.Keys(runscPlatforms)) {
		t.Run(p, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.RunscPlatform = p; c.RunscSelfCheck = DefaultSelfCheck })
			st, ok := e.m.Available(ClassRunsc)
			t.Logf("runsc on %s: available=%v self-check=%q reason=%q", p, ok, st.SelfCheck, st.Reason)
			switch {
			case p == DefaultRunscPlatform && !ok:
				if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci || st.SelfCheck == SelfCheckFailed {
					t.Fatalf("runsc on %s, the default platform, is refused: %s", p, st.Reason)
				}
				t.Skipf("runsc is unavailable here: %s", st.Reason)
			case !ok && st.SelfCheck != SelfCheckFailed:
				if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
					t.Fatalf("runsc on %s is unavailable before its self-check: %s", p, st.Reason)
				}
			case ok && st.SelfCheck != SelfCheckPassed:
				t.Fatalf("runsc on %s is available without a passed self-check (%q)", p, st.SelfCheck)
			}
		})
	}
}
