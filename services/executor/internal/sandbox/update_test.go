package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// live is a job running in the background, for tests that change it
// mid-run.
type live struct {
	sb   *Sandbox
	out  *syncBuffer
	done chan ran
	t0   time.Time
}

// start creates a runc job and runs it in the background; the sandbox is
// destroyed (and checked gone) at cleanup.
func (e *env) start(t *testing.T, script string, lim Limits) *live {
	t.Helper()
	var out, errb syncBuffer
	id := fmt.Sprintf("upd-%d", testSeq.Add(1))
	sb, err := e.m.Create(context.Background(), Spec{ID: id, Class: ClassRunc, Source: e.source(t, nil),
		Command: []string{"sh", "-c", script}, Limits: lim, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	l := &live{sb: sb, out: &out, done: make(chan ran, 1), t0: time.Now()}
	go func() {
		res, err := sb.Run(context.Background())
		l.done <- ran{sb: sb, res: res, err: err, stdout: out.String(), stderr: errb.String()}
	}()
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return l
}

// waitOutput waits until the job has printed s.
func (l *live) waitOutput(t *testing.T, s string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the job to print %q", s), 20*time.Second, func() bool { return strings.Contains(l.out.String(), s) })
}

// signal sends the job's first process SIGUSR1, which waitForSignal's
// loop waits for. The job must have installed its handler: a namespace's
// init drops a signal it has none for.
func (l *live) signal(t *testing.T) {
	t.Helper()
	if err := l.sb.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
}

func (l *live) wait(t *testing.T) ran {
	t.Helper()
	select {
	case r := <-l.done:
		t.Logf("reason=%s exit=%d msg=%q after %s\nstdout: %s\nstderr: %s", r.res.Reason, r.res.ExitCode, r.res.Message,
			time.Since(l.t0).Round(time.Millisecond), trunc(r.stdout), trunc(r.stderr))
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		return r
	case <-time.After(90 * time.Second):
		t.Fatal("the job did not end")
		return ran{}
	}
}

// waitForSignal prints ready once it takes SIGUSR1, then waits for one.
// A running job is stepped by a signal, never by a file the host writes
// into its mounts: a batch job under runsc caches what it knows of them
// (runscBatchFlags) and would never see the file.
const waitForSignal = `go=; trap 'go=1' USR1; echo ready; while [ -z "$go" ]; do sleep 0.05; done; `

// jobLimits reads the limits of sb's cgroup back from the kernel. No swap
// beyond the memory limit is ever allowed.
func jobLimits(t *testing.T, e *env, sb *Sandbox) cgroupLimits {
	t.Helper()
	l, err := e.m.cg.readLimits(sb.cgRel)
	if err != nil {
		t.Fatal(err)
	}
	if l.SwapBytes != 0 {
		t.Errorf("the job may swap %d bytes beyond its memory limit", l.SwapBytes)
	}
	return l
}

// A lower memory limit binds what the job allocates afterwards: 100 MiB
// fits the 256 MiB it started with, not the 48 MiB it was lowered to.
func TestUpdateLowerMemory(t *testing.T) {
	e := newEnv(t)
	l := e.start(t, waitForSignal+"exec /work/probe balloon 100", defaultLimits)
	l.waitOutput(t, "ready")
	lim := defaultLimits
	lim.MemoryBytes = 48 << 20
	if err := l.sb.UpdateLimits(lim); err != nil {
		t.Fatal(err)
	}
	if got := jobLimits(t, e, l.sb).MemoryBytes; got != lim.MemoryBytes {
		t.Errorf("memory limit = %d, want %d", got, lim.MemoryBytes)
	}
	l.signal(t)
	r := l.wait(t)
	if r.res.Reason != ReasonOOM {
		t.Fatalf("reason %s, want oom", r.res.Reason)
	}
	if strings.Contains(r.stdout, "allocated all") {
		t.Fatal("the balloon got all its memory")
	}
	if want := fmt.Sprintf("memory limit of %d bytes", lim.MemoryBytes); !strings.Contains(r.res.Message, want) {
		t.Errorf("message %q does not name the new limit (%q)", r.res.Message, want)
	}
}

// A lower memory limit above what the job holds that cannot be reclaimed
// is put in force, the page cache above it dropped, and the job lives on:
// 56 MiB of a file's cache and 24 MiB of its own memory fit 48 MiB. (On
// cgroup v2, lowering memory.max at once would have the kernel reclaim
// and then OOM-kill; the limit goes through memory.high first.)
func TestUpdateLowerMemoryDropsCache(t *testing.T) {
	e := newEnv(t)
	l := e.start(t, "head -c 56m /dev/zero > /tmp/cache && exec /work/probe balloon 24 hold", defaultLimits)
	l.waitOutput(t, "allocated all 24")
	if cur, _ := e.m.cg.current(l.sb.cgRel); cur < 72<<20 {
		t.Fatalf("the job holds %d bytes, not the 80 MiB of cache and memory this test lowers the limit below", cur)
	}
	lim := defaultLimits
	lim.MemoryBytes = 48 << 20
	if err := l.sb.UpdateLimits(lim); err != nil {
		t.Fatalf("UpdateLimits to 48 MiB with 24 MiB held and the rest cache: %v", err)
	}
	if got := jobLimits(t, e, l.sb).MemoryBytes; got != lim.MemoryBytes {
		t.Errorf("memory limit = %d, want %d", got, lim.MemoryBytes)
	}
	l.signal(t)
	r := l.wait(t)
	wantExit(t, r, 0)
	if !strings.Contains(r.stdout, "held 24") {
		t.Errorf("the job did not finish holding its memory: %q", r.stdout)
	}
}

// Memory the job holds and the kernel cannot reclaim (shmem, with no swap
// to move it to) keeps the limit where it was, and says why.
func TestUpdateMemoryBelowUsageRefused(t *testing.T) {
	e := newEnv(t)
	l := e.start(t, "head -c 40m /dev/zero > /dev/shm/hold; "+waitForSignal+"rm /dev/shm/hold; echo done", defaultLimits)
	l.waitOutput(t, "ready")
	lim := defaultLimits
	lim.MemoryBytes = 24 << 20
	lim.Pids = 64
	err := l.sb.UpdateLimits(lim)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "cannot reclaim") {
		t.Fatalf("UpdateLimits below usage: %v, want failed precondition", err)
	}
	t.Log(err)
	got := jobLimits(t, e, l.sb)
	if got.MemoryBytes != defaultLimits.MemoryBytes {
		t.Errorf("memory limit = %d after a refused update, want the old %d", got.MemoryBytes, defaultLimits.MemoryBytes)
	}
	if got.Pids != defaultLimits.Pids {
		t.Errorf("pids.max = %d after a refused update, want the old %d", got.Pids, defaultLimits.Pids)
	}
	if got := l.sb.Limits(); got != defaultLimits {
		t.Errorf("Limits() = %+v after a refused update", got)
	}
	l.signal(t)
	wantExit(t, l.wait(t), 0)
}

// spawnScript starts 24 sleeps once signalled, printing a line per
// success; a failed fork ends the loop.
const spawnScript = waitForSignal + `i=0
while [ $i -lt 24 ]; do
  sleep 60 & 
  i=$((i+1))
  echo "spawned $i"
done
echo "all spawned"`

// More pids let a job fork what its old limit refused.
func TestUpdateRaisePids(t *testing.T) {
	e := newEnv(t)
	lim := defaultLimits
	lim.Pids = 16
	for _, raise := range []bool{false, true} {
		t.Run(fmt.Sprintf("raise=%v", raise), func(t *testing.T) {
			l := e.start(t, spawnScript, lim)
			l.waitOutput(t, "ready")
			if raise {
				more := lim
				more.Pids = 64
				if err := l.sb.UpdateLimits(more); err != nil {
					t.Fatal(err)
				}
				if got := jobLimits(t, e, l.sb).Pids; got != 64 {
					t.Fatalf("pids.max = %d, want 64", got)
				}
			}
			l.signal(t)
			r := l.wait(t)
			if raise {
				wantExit(t, r, 0)
				if !strings.Contains(r.stdout, "all spawned") {
					t.Fatal("the job could not spawn all its sleeps under the raised limit")
				}
				return
			}
			if strings.Contains(r.stdout, "all spawned") || !strings.Contains(r.stdout, "spawned 8") {
				t.Fatalf("under 16 pids the job should spawn some but not all of 24 sleeps")
			}
		})
	}
}

// A lower deadline times a job out early, counted from its start: at once
// when already past. The message names the new deadline.
func TestUpdateLowerDeadline(t *testing.T) {
	e := newEnv(t)
	for _, d := range []time.Duration{time.Millisecond, 3 * time.Second} {
		t.Run(d.String(), func(t *testing.T) {
			l := e.start(t, "echo started; exec sleep 300", defaultLimits)
			l.waitOutput(t, "started")
			lim := defaultLimits
			lim.Deadline = d
			if err := l.sb.UpdateLimits(lim); err != nil {
				t.Fatal(err)
			}
			updated := time.Now()
			r := l.wait(t)
			if r.res.Reason != ReasonTimeout {
				t.Fatalf("reason %s, want timeout", r.res.Reason)
			}
			if want := fmt.Sprintf("deadline of %s passed", d); !strings.Contains(r.res.Message, want) {
				t.Errorf("message %q, want it to name %q", r.res.Message, want)
			}
			if d > time.Second && r.res.Usage.WallTime < d {
				t.Errorf("timed out after %s, before the new deadline %s", r.res.Usage.WallTime, d)
			}
			if late := time.Since(updated); late > d+5*time.Second {
				t.Errorf("the job ended %s after the update, for a deadline of %s", late, d)
			}
		})
	}
}

// A raised deadline lets a job finish that the old one would have killed.
func TestUpdateRaiseDeadline(t *testing.T) {
	e := newEnv(t)
	lim := defaultLimits
	lim.Deadline = 2 * time.Second
	l := e.start(t, "echo started; sleep 4; echo finished", lim)
	l.waitOutput(t, "started")
	lim.Deadline = time.Minute
	if err := l.sb.UpdateLimits(lim); err != nil {
		t.Fatal(err)
	}
	r := l.wait(t)
	wantExit(t, r, 0)
	if !strings.Contains(r.stdout, "finished") || r.res.Usage.WallTime < 4*time.Second {
		t.Fatalf("the job did not run past its old deadline: wall %s", r.res.Usage.WallTime)
	}
}

// Before Run, an update changes the cgroup and the deadline Run arms.
// Invalid limits and a disk change are refused and change nothing; after
// the run ends every update is refused.
func TestUpdateLimitsChecks(t *testing.T) {
	e := newEnv(t)
	sb, err := e.m.Create(context.Background(), Spec{ID: "upd-checks", Class: ClassRunc, Source: e.source(t, nil),
		Command: []string{"sh", "-c", "sleep 300"}, Limits: defaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	bad := func(f func(l *Limits)) Limits {
		l := defaultLimits
		f(&l)
		return l
	}
	for _, tc := range []struct {
		name string
		lim  Limits
		want string
	}{
		{"disk", bad(func(l *Limits) { l.DiskBytes *= 2 }), "limits.disk_bytes"},
		{"memory", bad(func(l *Limits) { l.MemoryBytes = 1 << 20 }), "limits.memory_bytes"},
		{"pids", bad(func(l *Limits) { l.Pids = 2 }), "limits.pids"},
		{"cpu", bad(func(l *Limits) { l.CPUMillis = 0 }), "limits.cpu_millis"},
		{"deadline", bad(func(l *Limits) { l.Deadline = 0 }), "limits.deadline"},
	} {
		err := sb.UpdateLimits(tc.lim)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want invalid argument naming %s", tc.name, err, tc.want)
		}
	}
	if err := sb.UpdateLimits(bad(func(l *Limits) { l.DiskBytes++ })); err == nil || !strings.Contains(err.Error(), "scratch filesystem is sized when the sandbox is made") {
		t.Errorf("disk change: %v", err)
	}
	if got := sb.Limits(); got != defaultLimits {
		t.Fatalf("Limits() = %+v after refused updates", got)
	}
	lim := defaultLimits
	lim.CPUMillis, lim.MemoryBytes, lim.Pids, lim.Deadline = 500, 128<<20, 40, 500*time.Millisecond
	if err := sb.UpdateLimits(lim); err != nil {
		t.Fatal(err)
	}
	if got, want := jobLimits(t, e, sb), (cgroupLimits{MemoryBytes: 128 << 20, Pids: 40, CPUMillis: 500}); got != want {
		t.Errorf("cgroup limits %+v, want %+v", got, want)
	}
	res, err := sb.Run(context.Background())
	if err != nil || res.Reason != ReasonTimeout || !strings.Contains(res.Message, "deadline of 500ms") {
		t.Fatalf("Run = %+v, %v; want a timeout at the updated 500ms", res, err)
	}
	if err := sb.UpdateLimits(defaultLimits); !errors.Is(err, errdefs.ErrFailedPrecondition) || !errors.Is(err, ErrEnded) {
		t.Fatalf("update after the run: %v, want failed precondition", err)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := sb.UpdateLimits(defaultLimits); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("update after Destroy: %v, want failed precondition", err)
	}
}
