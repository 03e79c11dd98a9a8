package runs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// TestSessionKeptAcrossRestart stops the executor under a running session
// (Close, as a graceful stop does) with one exec running, and starts it
// again (New, Recover) on the same directories, under runc and runsc: the
// session is suspended for the restart, its running exec ended
// executor_restarted and its ended ones kept; once resumed it sees its
// /work changes and /out, not /tmp; a retried exec id is still the exec it
// was; and its bundle at the finish has the whole patch and every exec.
func TestSessionKeptAcrossRestart(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			sid := h.startSession(t, h.sessionGrant(class, time.Minute))
			h.execWait(t, sid, sh("write", "echo kept > /work/kept.txt && echo out > /out/o.txt && echo tmp > /tmp/t"))
			if _, _, err := h.m.StartExec(context.Background(), sid, sh("long", "sleep 300")); err != nil {
				t.Fatal(err)
			}
			before, err := h.m.Get(sid)
			if err != nil {
				t.Fatal(err)
			}
			h.m.Close()
			if got, _ := h.m.Get(sid); got.State.Terminal() {
				t.Fatalf("a graceful stop ended the session: %s %+v", got.State, got.Result)
			}
			m2 := h.restart(t, nil)
			run := h.waitRun(t, sid, "kept, suspended", func(r Run, _ bool) bool { return r.Suspended })
			if run.State != Running || run.SuspendReason != ReasonExecutorRestarted || !run.StartedAt.Equal(before.StartedAt) {
				t.Fatalf("session after the restart: %s suspended=%v reason=%q started %s (was %s)", run.State, run.Suspended, run.SuspendReason, run.StartedAt, before.StartedAt)
			}
			if x, err := m2.GetExec(sid, "long"); err != nil || x.State != ExecEnded || x.Reason != ReasonExecutorRestarted {
				t.Fatalf("the exec running at the stop: %+v %v", x, err)
			}
			if _, _, err := m2.StartExec(context.Background(), sid, sh("early", "true")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("an exec in a session suspended by the restart: %v, want FailedPrecondition", err)
			}
			if _, err := m2.Resume(context.Background(), sid); err != nil {
				t.Fatal(err)
			}
			h.waitRun(t, sid, "resumed", func(r Run, up bool) bool { return !r.Suspended && up })
			x := h.execWait(t, sid, sh("read", "cat /work/kept.txt /out/o.txt; test -e /tmp/t || echo no-tmp; git -C /work status --short"))
			if got, want := string(x.StdoutTail), "kept\nout\nno-tmp\n?? kept.txt\n"; x.ExitCode != 0 || got != want {
				t.Fatalf("after the restart the session sees %q (exit %d, stderr %q), want %q", got, x.ExitCode, x.StderrTail, want)
			}
			if x, created, err := m2.StartExec(context.Background(), sid, sh("write", "echo kept > /work/kept.txt && echo out > /out/o.txt && echo tmp > /tmp/t")); err != nil || created || x.Seq != 1 {
				t.Fatalf("a retry of an exec from before the restart: created=%v seq=%d %v", created, x.Seq, err)
			}
			if _, err := m2.Finish(sid); err != nil {
				t.Fatal(err)
			}
			end := h.waitEnd(t, sid)
			if end.State != Finished || end.Result.Reason != ReasonFinished || end.Result.FilesChanged != 1 {
				t.Fatalf("finished session: %s %+v", end.State, end.Result)
			}
			patch, _ := os.ReadFile(filepath.Join(m2.runDir(sid), "review.patch"))
			if !strings.Contains(string(patch), "+kept") {
				t.Fatalf("the patch lost the change made before the restart:\n%s", patch)
			}
			if reports := h.waitReports(t, 1); len(reports) != 1 || len(reports[0].Execs) != 3 {
				t.Fatalf("reports after the restart: %d (execs in the first %d), want 1 with the 3 execs", len(reports), len(reports[0].Execs))
			}
		})
	}
}

// TestSessionSuspendedExpiresAfterRestart: a session kept across a restart
// is still bound by its deadline, counted from its first start.
func TestSessionSuspendedExpiresAfterRestart(t *testing.T) {
	h, _ := newHarness(t, false)
	g := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	g.Limits.Deadline = 6 * time.Second
	sid := h.startSession(t, g)
	h.execWait(t, sid, sh("write", "echo x > /work/x"))
	h.m.Close()
	h.restart(t, nil)
	run := h.waitEnd(t, sid)
	if run.Result.Reason != "timeout" || time.Since(run.StartedAt) > 20*time.Second {
		t.Fatalf("a kept session past its deadline: %s %+v", run.State, run.Result)
	}
	assertNothingKept(t, h)
}

// restart starts a new manager on h's directories, as the next executor
// process does once the old one stopped: prepare (if any) runs first, then
// Recover; h.m is the new manager, closed at the test's end.
func (h *harness) restart(t *testing.T, prepare func()) *Manager {
	t.Helper()
	m, err := New(h.m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if prepare != nil {
		prepare()
	}
	if err := m.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.m = m
	return m
}

// assertNothingKept fails if any scratch is still kept in the harness's
// sandbox state directory.
func assertNothingKept(t *testing.T, h *harness) {
	t.Helper()
	if ents, err := os.ReadDir(filepath.Join(h.base, "sandbox", "kept")); err != nil || len(ents) > 0 {
		t.Fatalf("kept after the session ended: %v, %v", ents, err)
	}
}

// TestSessionFinishedAsTheExecutorStops: a session its client finished
// just as the executor stops is finished, with its bundle, not kept and
// brought back suspended.
func TestSessionFinishedAsTheExecutorStops(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	h.execWait(t, sid, sh("write", "echo x > /work/x"))
	if _, err := h.m.Finish(sid); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	run, err := h.m.Get(sid)
	if err != nil || run.State != Finished || run.Result.Reason != ReasonFinished || run.Result.BundleDigest == "" {
		t.Fatalf("a session finished as the executor stopped: %s %+v, %v", run.State, run.Result, err)
	}
	assertNothingKept(t, h)
}

// TestSessionCancelledWhileBeingRecovered: a kept session its client
// cancels before its sandbox is made again ends cancelled with its bundle
// (the cancel waits for the sandbox), and leaves nothing kept.
func TestSessionCancelledWhileBeingRecovered(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	h.execWait(t, sid, sh("write", "echo x > /work/x"))
	h.m.Close()
	// Its git objects are to be staged again, and the authority holds
	// that fetch: the cancel comes while the session is being made again.
	gate := make(chan struct{})
	m2 := h.restart(t, func() {
		objects, _ := filepath.Glob(filepath.Join(h.base, "sources", "*", "*", "trees", h.commit+".objects*.ready"))
		if len(objects) == 0 {
			t.Fatal("no staged git objects to remove: this test would prove nothing")
		}
		for _, p := range objects {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
		h.auth.gate = gate
	})
	if _, err := m2.Cancel(sid); err != nil {
		t.Fatal(err)
	}
	close(gate)
	run := h.waitEnd(t, sid)
	if run.State != Cancelled || run.Result.FilesChanged != 1 || run.Result.BundleDigest == "" {
		t.Fatalf("a kept session cancelled while recovered: %s %+v", run.State, run.Result)
	}
	assertNothingKept(t, h)
}
