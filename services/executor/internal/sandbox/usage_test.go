package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A CPU quota holds: two busy loops in a job bounded to half a core get
// about half a core between them, not the two cores they could use.
func TestCPUQuota(t *testing.T) {
	e := newEnv(t)
	lim := defaultLimits
	lim.CPUMillis = 500
	const burn = 3 * time.Second
	script := "timeout 3 sh -c 'while :; do :; done' & timeout 3 sh -c 'while :; do :; done'; wait"
	r := e.run(t, context.Background(), job{src: e.source(t, nil), cmd: []string{"sh", "-c", script}, limits: &lim})
	wantExit(t, r, 0)
	// The quota bounds the job's cgroup from its first process to its
	// last: over its whole wall time (start-up included, long on an
	// emulated CPU), the job had at most about half a core; over the
	// burn, about that.
	u := r.res.Usage
	share, burnt := u.CPUTime.Seconds()/u.WallTime.Seconds(), u.CPUTime.Seconds()/burn.Seconds()
	t.Logf("CPU %s over %s of wall time, %s of busy loops: %.2f cores over the job, %.2f over the loops (quota %.2f)", u.CPUTime, u.WallTime, burn, share, burnt, float64(lim.CPUMillis)/1000)
	// The quota is enforced per 100 ms period; the last one lets a little
	// more through.
	if share > 0.6 {
		t.Errorf("the job used %.2f cores; its quota is 0.5", share)
	}
	if burnt < 0.3 {
		t.Errorf("the loops had %.2f cores; the quota of 0.5 should let them have about that", burnt)
	}
}

// The usage a job reports is what it did: its memory high-water mark
// covers what it allocated, its task peak the processes it ran at once
// (under runsc, gVisor's host tasks for them), its CPU time is positive
// and below its wall time times its quota.
func TestUsagePlausible(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			lim := defaultLimits
			// Twelve sleeps beside the balloon, alive for a second at least
			// (the task peak may be sampled every 100 ms).
			script := "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 2 & done; /work/probe balloon 96; wait"
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", script}, limits: &lim})
			wantExit(t, r, 0)
			if !strings.Contains(r.stdout, "allocated all 96") {
				t.Fatalf("the balloon did not finish: %q", r.stdout)
			}
			u := r.res.Usage
			t.Logf("usage %+v", u)
			if u.PeakMemoryBytes < 96<<20 || u.PeakMemoryBytes > lim.MemoryBytes {
				t.Errorf("peak memory %d, want between 96 MiB and the %d limit", u.PeakMemoryBytes, lim.MemoryBytes)
			}
			// Under runsc the cgroup's tasks are gVisor's host tasks,
			// bounded apart from the job's own (cgroupLimitsOf).
			if host := cgroupLimitsOf(c, lim).Pids; u.PeakPids < 13 || u.PeakPids > host {
				t.Errorf("peak tasks %d, want at least the 13 processes that ran at once and at most %d", u.PeakPids, host)
			}
			if u.CPUTime <= 0 || u.CPUTime > time.Duration(float64(u.WallTime)*float64(lim.CPUMillis)/1000*1.1) {
				t.Errorf("CPU time %s for %s of wall time at a quota of %d millicores", u.CPUTime, u.WallTime, lim.CPUMillis)
			}
			if u.WallTime < 2*time.Second {
				t.Errorf("wall time %s, but the job slept 2 s", u.WallTime)
			}
		})
	}
}

// Where the kernel lacks the peak counters (cgroup v2 before 5.19 for
// memory, 6.13 for tasks) they are sampled every 100 ms, and where it
// lacks cgroup.kill (before 5.14) each process is killed in the frozen
// tree: with the driver made to do without them, a fork bomb is still
// ended whole at its deadline, and the peaks of a job that holds its
// memory and tasks for a while are what it reached.
func TestWithoutNewerKernelFeatures(t *testing.T) {
	e := newEnv(t)
	e.m.cg.fallBack()
	if !e.m.cg.sampling() {
		t.Fatal("the driver does not sample without the kernel's peaks")
	}
	lim := defaultLimits
	lim.Pids = 32
	lim.Deadline = slowdown * 2 * time.Second
	// The shell waits in a loop of builtins: a `sleep` could not fork
	// once the bomb holds every task the limit allows, and the shell
	// would end before its deadline.
	r := e.run(t, context.Background(), job{src: e.source(t, nil), cmd: []string{"sh", "-c", "bomb() { bomb | bomb & }; bomb; while :; do :; done"}, limits: &lim})
	if r.err != nil || r.res.Reason != ReasonTimeout {
		t.Fatalf("fork bomb: %s (%s), %v; want a timeout", r.res.Reason, r.res.Message, r.err)
	}
	if pids := e.m.cg.procs(r.sb.cgRel); len(pids) > 0 {
		t.Fatalf("processes left in the job's cgroup: %v", pids)
	}
	if pids := procsInUIDRange(e.cfg.UIDBase); len(pids) > 0 {
		t.Fatalf("sandbox processes left: %v", pids)
	}

	l := e.start(t, "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do sleep 30 & done; exec /work/probe balloon 96 hold", defaultLimits)
	l.waitOutput(t, "allocated all 96")
	time.Sleep(slowdown * 500 * time.Millisecond)
	l.signal(t)
	b := l.wait(t)
	wantExit(t, b, 0)
	u := b.res.Usage
	if u.PeakMemoryBytes < 96<<20 || u.PeakMemoryBytes > defaultLimits.MemoryBytes {
		t.Errorf("sampled peak memory %d, want at least the 96 MiB the job held", u.PeakMemoryBytes)
	}
	if u.PeakPids < 21 || u.PeakPids > defaultLimits.Pids {
		t.Errorf("sampled peak tasks %d, want at least the 21 processes the job held", u.PeakPids)
	}
}
