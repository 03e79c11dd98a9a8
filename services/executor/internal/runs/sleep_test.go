package runs

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// sleepyGrant is a session that sleeps once idle for idle.
func (h *harness) sleepyGrant(class sandbox.Class, idle time.Duration) *Grant {
	g := h.sessionGrant(class, idle)
	g.Session.SleepOnIdle = true
	return g
}

// asleep says a run is asleep: suspended for its idle timeout, no sandbox.
func asleep(r Run, up bool) bool {
	return r.Suspended && r.SuspendReason == ReasonIdleTimeout && !up
}

// TestSessionSleep, under runc and runsc: a session idle past its timeout
// falls asleep (suspended, reason idle_timeout, its memory given back)
// rather than ending; a retried exec id does not wake it; a new exec
// (RunExec, as the streaming call) wakes it and sees what it wrote in
// /work and /out before; it sleeps again, and a file call wakes it; its
// result splits its time into awake and asleep.
func TestSessionSleep(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			// 3 s idle: it must not fall asleep again between a call that
			// woke it and the check that it did, under load.
			sid := h.startSession(t, h.sleepyGrant(class, 3*time.Second))
			h.execWait(t, sid, sh("write", "echo before-sleep > /work/slept.txt; echo out > /out/o; echo t > /tmp/t"))
			h.waitRun(t, sid, "asleep", asleep)
			fellAsleep := time.Now()
			h.m.mu.Lock()
			held := h.m.held(nil)
			h.m.mu.Unlock()
			if held.memory != 0 || held.cpu != 0 || held.disk != baseLimits.DiskBytes {
				t.Fatalf("an asleep session holds %+v; want its disk alone", held)
			}
			// A retry of an exec that ran is answered from its record.
			if x, created, err := h.m.StartExec(context.Background(), sid, sh("write", "echo before-sleep > /work/slept.txt; echo out > /out/o; echo t > /tmp/t")); err != nil || created || x.State != ExecEnded {
				t.Fatalf("retry of an ended exec in an asleep session: %+v created=%v %v", x, created, err)
			}
			time.Sleep(2 * time.Second)
			if run, _ := h.m.Get(sid); !run.Suspended {
				t.Fatalf("the retried exec id woke the session: %+v", run)
			}
			run, _ := h.m.Get(sid)
			if _, slept := run.Times(time.Now()); slept < 2*time.Second {
				t.Fatalf("asleep for %s so far, want at least 2s", slept)
			}
			woke := time.Now()
			x, created, _, err := h.m.RunExec(context.Background(), sid, sh("after", "cat /work/slept.txt /out/o; ls -A /tmp"))
			if err != nil || !created {
				t.Fatalf("RunExec in an asleep session: created=%v %v", created, err)
			}
			wokeIn := time.Since(woke)
			sleptFor := woke.Sub(fellAsleep)
			if x = h.waitExec(t, sid, "after"); string(x.StdoutTail) != "before-sleep\nout\n" {
				t.Fatalf("after waking: %q, want the /work and /out files and an empty /tmp", x.StdoutTail)
			}
			t.Logf("asleep %s, woke in %s", sleptFor, wokeIn)

			h.waitRun(t, sid, "asleep again", asleep)
			list, _, err := h.m.ListFiles(context.Background(), sid, "/work", false)
			if err != nil {
				t.Fatalf("ListFiles in an asleep session: %v", err)
			}
			if !strings.Contains(names(list), "slept.txt") {
				t.Fatalf("ListFiles after waking: %s", names(list))
			}
			if run, _ := h.m.Get(sid); run.Suspended {
				t.Fatalf("the file call did not wake the session: %+v", run)
			}
			if _, err := h.m.Finish(sid); err != nil {
				t.Fatal(err)
			}
			end := h.waitEnd(t, sid)
			r := end.Result
			if end.State != Finished || r.Reason != ReasonFinished {
				t.Fatalf("finished: %s %+v", end.State, r)
			}
			if r.AsleepTime < sleptFor || r.AwakeTime+r.AsleepTime != r.Usage.WallTime || r.AwakeTime > r.Usage.WallTime-sleptFor {
				t.Fatalf("awake %s, asleep %s, wall %s: want asleep at least %s, and awake the rest", r.AwakeTime, r.AsleepTime, r.Usage.WallTime, sleptFor)
			}
			if wall := end.FinishedAt.Sub(end.StartedAt); r.Usage.WallTime > wall || r.Usage.WallTime < wall-5*time.Second {
				t.Fatalf("wall %s for a session that ran %s", r.Usage.WallTime, wall)
			}
		})
	}
}

func names(list []sandbox.FileInfo) string {
	var out []string
	for _, f := range list {
		out = append(out, f.Path)
	}
	return strings.Join(out, " ")
}

// TestSessionSleepExplicit: a session its client suspended does not wake
// by itself (an exec is refused naming it), nor does an asleep one its
// client then suspends; Resume of an asleep session returns once it runs.
func TestSessionSleepExplicit(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sleepyGrant(sandbox.ClassRunc, 3*time.Second))
	h.waitRun(t, sid, "asleep", asleep)
	if _, err := h.m.Resume(context.Background(), sid); err != nil {
		t.Fatalf("Resume an asleep session: %v", err)
	}
	h.m.mu.Lock()
	up := h.m.runs[sid].live != nil
	h.m.mu.Unlock()
	if run, _ := h.m.Get(sid); run.Suspended || !up {
		t.Fatalf("Resume returned before the session ran: %+v up=%v", run, up)
	}
	if _, err := h.m.Suspend(sid); err != nil {
		t.Fatal(err)
	}
	h.waitRun(t, sid, "suspended", func(r Run, up bool) bool { return r.Suspended && !up })
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("x", "true")); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "suspended (resume it first)") {
		t.Fatalf("an exec in a session its client suspended: %v", err)
	}
	if err := h.m.Wake(context.Background(), sid); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Wake of a session its client suspended: %v", err)
	}
	if _, err := h.m.Resume(context.Background(), sid); err != nil {
		t.Fatal(err)
	}
	h.waitRun(t, sid, "asleep again", asleep)
	// Suspended by its client while asleep: it stays suspended, no more
	// asleep.
	if _, err := h.m.Suspend(sid); err != nil {
		t.Fatal(err)
	}
	if run, _ := h.m.Get(sid); !run.Suspended || run.SuspendReason != "" {
		t.Fatalf("an asleep session its client suspended: %+v", run)
	}
	if _, _, err := h.m.ListFiles(context.Background(), sid, "/work", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a file call in a session its client suspended: %v", err)
	}
}

// TestSessionSleepDeadline: the deadline of an asleep session counts on
// and ends it, with its asleep time in the result.
func TestSessionSleepDeadline(t *testing.T) {
	h, _ := newHarness(t, false)
	g := h.sleepyGrant(sandbox.ClassRunc, time.Second)
	g.Limits = baseLimits
	g.Limits.Deadline = 5 * time.Second
	sid := h.startSession(t, g)
	h.waitRun(t, sid, "asleep", asleep)
	run := h.waitEnd(t, sid)
	r := run.Result
	if r.Reason != sandbox.ReasonTimeout || !strings.Contains(r.Message, "suspended") || r.AsleepTime < time.Second || r.AwakeTime >= r.Usage.WallTime {
		t.Fatalf("an asleep session past its deadline: %+v", r)
	}
}

// TestSessionWakeCapacity: an asleep session that no longer fits beside
// the runs admitted while it slept does not wake; the exec that would
// have woken it is refused saying so.
func TestSessionWakeCapacity(t *testing.T) {
	h, _ := newHarnessWith(t, false, Capacity{MemoryBytes: 384 << 20})
	sid := h.startSession(t, h.sleepyGrant(sandbox.ClassRunc, time.Second))
	h.waitRun(t, sid, "asleep", asleep)
	job := h.grantFor("echo up; sleep 60")
	h.start(t, job)
	h.waitRunning(t, job.JobID, "up")
	_, _, err := h.m.StartExec(context.Background(), sid, sh("x", "true"))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "asleep and cannot wake") {
		t.Fatalf("an exec in an asleep session with no room to wake: %v", err)
	}
	if _, err := h.m.Cancel(job.JobID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, job.JobID)
	if x := h.execWait(t, sid, sh("y", "echo ok")); string(x.StdoutTail) != "ok\n" {
		t.Fatalf("once it fits: %q", x.StdoutTail)
	}
}

// TestSessionAsleepAcrossRestart: a session asleep when the executor
// stops stays asleep across its restart (not suspended for the restart,
// nor woken), from when it fell asleep; its next exec wakes it on its
// kept files.
func TestSessionAsleepAcrossRestart(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sleepyGrant(sandbox.ClassRunc, time.Second))
	h.execWait(t, sid, sh("write", "echo kept > /work/kept.txt"))
	before := h.waitRun(t, sid, "asleep", asleep)
	h.m.Close()
	m2 := h.restart(t, nil)
	run := h.waitRun(t, sid, "asleep after the restart", func(r Run, _ bool) bool { return r.Suspended })
	if run.State != Running || run.SuspendReason != ReasonIdleTimeout || !run.SuspendedAt.Equal(before.SuspendedAt) {
		t.Fatalf("after the restart: %s suspended=%v reason=%q since %s (fell asleep %s)", run.State, run.Suspended, run.SuspendReason, run.SuspendedAt, before.SuspendedAt)
	}
	if x := h.execWait(t, sid, sh("read", "cat /work/kept.txt")); string(x.StdoutTail) != "kept\n" {
		t.Fatalf("after waking: %q", x.StdoutTail)
	}
	if _, err := m2.Finish(sid); err != nil {
		t.Fatal(err)
	}
	if end := h.waitEnd(t, sid); end.Result.Reason != ReasonFinished || end.Result.AsleepTime <= 0 {
		t.Fatalf("finished: %+v", end.Result)
	}
}

// TestSessionSuspendWhileWaking: a client's Suspend of a session being
// woken wins: the wake is withdrawn, the session stays suspended by its
// client (not asleep, not running), and an exec is refused saying so.
func TestSessionSuspendWhileWaking(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sleepyGrant(sandbox.ClassRunc, time.Second))
	h.waitRun(t, sid, "asleep", asleep)
	h.m.mu.Lock()
	e := h.m.runs[sid]
	if err := h.m.resumeLocked(e); err != nil { // as Wake does
		h.m.mu.Unlock()
		t.Fatal(err)
	}
	_, err := h.m.suspendByClientLocked(e) // as Suspend does, before the sandbox runs again
	h.m.mu.Unlock()
	if err != nil {
		t.Fatalf("Suspend of a waking session: %v", err)
	}
	time.Sleep(3 * time.Second)
	run := h.waitRun(t, sid, "suspended by its client", func(r Run, up bool) bool { return r.Suspended && !up })
	if run.SuspendReason != "" {
		t.Fatalf("suspended by its client while waking, its reason is %q", run.SuspendReason)
	}
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("x", "true")); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "suspended (resume it first)") {
		t.Fatalf("an exec after the client's suspension: %v", err)
	}
	h.m.mu.Lock()
	held := h.m.held(nil)
	h.m.mu.Unlock()
	if held.memory != 0 {
		t.Fatalf("the withdrawn wake still holds %d bytes of memory", held.memory)
	}
}

// TestSessionSleepyAcrossStop: a session falling asleep, or being woken,
// when the executor stops is brought back asleep by the next start (its
// next call wakes it), not suspended for the restart, nor started.
func TestSessionSleepyAcrossStop(t *testing.T) {
	for _, tc := range []struct {
		name string
		then func(m *Manager, e *entry) error
	}{
		{"falling asleep", func(m *Manager, e *entry) error { m.suspendLocked(e, ReasonIdleTimeout); return nil }},
		{"waking", func(m *Manager, e *entry) error { return m.resumeLocked(e) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := newHarness(t, false)
			sid := h.startSession(t, h.sleepyGrant(sandbox.ClassRunc, time.Minute))
			h.waitRun(t, sid, "running", func(r Run, up bool) bool { return up })
			if tc.name == "waking" {
				h.m.mu.Lock()
				h.m.suspendLocked(h.m.runs[sid], ReasonIdleTimeout)
				h.m.mu.Unlock()
				h.waitRun(t, sid, "asleep", asleep)
			}
			// The change and the executor's stop at once: the session's
			// goroutine sees both.
			h.m.mu.Lock()
			err := tc.then(h.m, h.m.runs[sid])
			h.m.cancel()
			h.m.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			h.m.Close()
			h.restart(t, nil)
			run := h.waitRun(t, sid, "suspended after the restart", func(r Run, _ bool) bool { return r.Suspended })
			if run.State != Running || run.SuspendReason != ReasonIdleTimeout {
				t.Fatalf("after the restart: %s suspended=%v reason=%q, want asleep", run.State, run.Suspended, run.SuspendReason)
			}
			if x := h.execWait(t, sid, sh("up", "echo up")); string(x.StdoutTail) != "up\n" {
				t.Fatalf("the exec that woke it: %q", x.StdoutTail)
			}
		})
	}
}

// TestSessionRefusedExecWakesNothing: an exec the session refuses anyway
// (its output budget spent) is refused at once, and its session sleeps on.
func TestSessionRefusedExecWakesNothing(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sleepyGrant(sandbox.ClassRunc, time.Second))
	h.waitRun(t, sid, "asleep", asleep)
	h.m.mu.Lock()
	h.m.runs[sid].execOutput = SessionOutputBudget
	h.m.mu.Unlock()
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("x", "true")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("an exec past the output budget: %v", err)
	}
	h.m.mu.Lock()
	e := h.m.runs[sid]
	still := e.asleep() && e.run.Suspended
	h.m.mu.Unlock()
	if !still {
		t.Fatal("an exec refused for its output budget woke the session")
	}
}

// TestSessionKilledDowntimeAsleep: a session whose executor was killed
// (its record not suspended: no graceful stop wrote it) comes back
// suspended from when it last wrote to its records, so the time the
// executor was down counts asleep, not awake.
func TestSessionKilledDowntimeAsleep(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	h.execWait(t, sid, sh("write", "echo x > /work/x"))
	h.m.Close()
	// As kill -9 leaves it: the record says running, as last written.
	path := filepath.Join(h.m.runDir(sid), "run.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	r.Suspended, r.SuspendedAt, r.SuspendReason = false, time.Time{}, ""
	if data, err = json.Marshal(r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	time.Sleep(3 * time.Second) // down
	h.restart(t, nil)
	run := h.waitRun(t, sid, "suspended", func(r Run, _ bool) bool { return r.Suspended })
	if run.SuspendReason != ReasonExecutorRestarted || run.SuspendedAt.Sub(killed).Abs() > time.Second {
		t.Fatalf("after a kill: suspended at %s (reason %q), want about %s, when it last wrote", run.SuspendedAt, run.SuspendReason, killed)
	}
	if _, asleep := run.Times(time.Now()); asleep < 3*time.Second {
		t.Fatalf("asleep %s so far, want the 3 s the executor was down", asleep)
	}
}

// lastWrite is the newest write under a run's directory, bounded by the
// run's start and now.
func TestLastWrite(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	for i, name := range []string{"run.json", "execs/1/stdout.log"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		at := now.Add(-time.Duration(10+10*i) * time.Minute)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"execs/1", "execs", "."} {
		at := now.Add(-time.Hour)
		if err := os.Chtimes(filepath.Join(dir, d), at, at); err != nil {
			t.Fatal(err)
		}
	}
	if got := lastWrite(dir, now.Add(-2*time.Hour), now); !got.Equal(now.Add(-10 * time.Minute)) {
		t.Errorf("lastWrite = %s, want the run record's %s", got, now.Add(-10*time.Minute))
	}
	if got := lastWrite(dir, now.Add(-5*time.Minute), now); !got.Equal(now.Add(-5 * time.Minute)) {
		t.Errorf("a write before the start: %s, want the start", got)
	}
	if got := lastWrite(filepath.Join(dir, "none"), now.Add(-time.Hour), now); !got.Equal(now) {
		t.Errorf("no record: %s, want now", got)
	}
}
