package runs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// sessionGrant is generation 1 of a session.
func (h *harness) sessionGrant(class sandbox.Class, idle time.Duration) *Grant {
	g := h.grantFor("")
	g.JobID = fmt.Sprintf("sess-%d", testSeq.Add(1))
	g.Command = nil
	g.Class = class
	g.Session = &SessionSpec{IdleTimeout: idle, MaxConcurrentExecs: 4}
	return g
}

func (h *harness) startSession(t *testing.T, g *Grant) string {
	t.Helper()
	h.start(t, g)
	end := time.Now().Add(60 * time.Second)
	for {
		run, err := h.m.Get(g.JobID)
		if err != nil {
			t.Fatal(err)
		}
		h.m.mu.Lock()
		up := h.m.runs[g.JobID].live != nil
		h.m.mu.Unlock()
		if run.State == Running && up {
			return g.JobID
		}
		if run.State.Terminal() || time.Now().After(end) {
			t.Fatalf("session %s did not come up: %s %+v", g.JobID, run.State, run.Result)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// execWait starts x and waits for it to end.
func (h *harness) execWait(t *testing.T, sid string, x ExecSpec) Exec {
	t.Helper()
	if _, _, err := h.m.StartExec(context.Background(), sid, x); err != nil {
		t.Fatalf("StartExec %s: %v", x.ID, err)
	}
	return h.waitExec(t, sid, x.ID)
}

func (h *harness) waitExec(t *testing.T, sid, id string) Exec {
	t.Helper()
	end := time.Now().Add(60 * time.Second)
	for {
		x, err := h.m.GetExec(sid, id)
		if err != nil {
			t.Fatal(err)
		}
		if x.State == ExecEnded {
			t.Logf("exec %s: %s exit %d %q stdout %q stderr %q", id, x.Reason, x.ExitCode, x.Message, x.StdoutTail, x.StderrTail)
			return x
		}
		if time.Now().After(end) {
			t.Fatalf("exec %s did not end", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sh(id, script string) ExecSpec { return ExecSpec{ID: id, Argv: []string{"sh", "-c", script}} }

// TestSessionAgentLoop drives a session as an agent does, under runc and
// runsc: write a file, run a failing test, edit, run it again, passing;
// finish. The bundle carries the patch and every exec, in order.
func TestSessionAgentLoop(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			sid := h.startSession(t, h.sessionGrant(class, time.Minute))
			test := `[ "$(cat answer)" = 42 ] || { echo "want 42, got $(cat answer)" >&2; exit 1; }`
			steps := []struct {
				x    ExecSpec
				exit int
			}{
				{sh("write", "echo 41 > answer"), 0},
				{sh("test-1", test), 1},
				{sh("edit", "echo 42 > answer"), 0},
				{sh("test-2", test), 0},
			}
			for _, s := range steps {
				x := h.execWait(t, sid, s.x)
				if x.Reason != sandbox.ReasonExited || x.ExitCode != s.exit {
					t.Fatalf("exec %s: %s %d, want exit %d", s.x.ID, x.Reason, x.ExitCode, s.exit)
				}
			}
			if _, err := h.m.Finish(sid); err != nil {
				t.Fatal(err)
			}
			run := h.waitEnd(t, sid)
			if run.State != Finished || run.Result.Reason != ReasonFinished || run.Result.FilesChanged != 1 {
				t.Fatalf("finished session: %s %+v", run.State, run.Result)
			}
			meta := h.bundleMeta(t, sid)
			if len(meta.Execs) != len(steps) {
				t.Fatalf("bundle has %d execs, want %d", len(meta.Execs), len(steps))
			}
			for i, s := range steps {
				x := meta.Execs[i]
				if x.Spec.ID != s.x.ID || x.Seq != int64(i+1) || x.ExitCode != s.exit || x.State != ExecEnded || x.StdoutSHA256 == "" {
					t.Errorf("bundle exec %d: %+v, want %s exit %d", i, x, s.x.ID, s.exit)
				}
			}
			if !strings.Contains(string(meta.Execs[1].StderrTail), "want 42, got 41") {
				t.Errorf("the failing test's stderr tail: %q", meta.Execs[1].StderrTail)
			}
			patch, _ := os.ReadFile(filepath.Join(h.m.runDir(sid), "review.patch"))
			if !strings.Contains(string(patch), "+42") || strings.Contains(string(patch), "+41") {
				t.Errorf("patch is not the session's end state against the base:\n%s", patch)
			}
			if reports := h.waitReports(t, 1); len(reports) != 1 || len(reports[0].Execs) != len(steps) {
				t.Fatalf("reports: %d, execs in the first: %v", len(reports), reports)
			}
		})
	}
}

// TestExecIDs: a retry under the same id is the same exec, running or
// ended, and never runs the command again; another spec under it is
// refused naming the field; 50 concurrent retries start it once; a
// watcher that drops mid-exec changes nothing.
func TestExecIDs(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	appendOnce := sh("append-1", "echo line >> /work/log; echo 0123456789; sleep 1")
	x, created, err := h.m.StartExec(context.Background(), sid, appendOnce)
	if err != nil || !created || x.State != ExecRunning {
		t.Fatalf("first start: %+v %v %v", x, created, err)
	}
	// A watcher that goes away mid-exec, then a retry.
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan string, 1)
	go func() {
		var b strings.Builder
		_ = h.m.WatchExec(ctx, sid, appendOnce.ID, 5, 0, func(ev ExecEvent) error {
			if ev.Stream == "stdout" {
				b.Write(ev.Data)
				if strings.Contains(b.String(), "\n") {
					got <- b.String()
				}
			}
			return nil
		})
	}()
	select {
	case s := <-got:
		if s != "56789\n" {
			t.Fatalf("watch from offset 5: %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no output watched")
	}
	cancel()
	x, created, err = h.m.StartExec(context.Background(), sid, appendOnce)
	if err != nil || created || x.Seq != 1 {
		t.Fatalf("retry while running: %+v created %v %v", x, created, err)
	}
	ended := h.waitExec(t, sid, appendOnce.ID)
	x, created, err = h.m.StartExec(context.Background(), sid, appendOnce)
	if err != nil || created || x.State != ExecEnded || x.ExitCode != 0 || x.StdoutSHA256 != ended.StdoutSHA256 {
		t.Fatalf("retry after the end: %+v created %v %v", x, created, err)
	}
	for field, changed := range map[string]ExecSpec{
		"argv":    sh("append-1", "echo other"),
		"cwd":     {ID: "append-1", Argv: appendOnce.Argv, Cwd: "/work/sub"},
		"env":     {ID: "append-1", Argv: appendOnce.Argv, Env: map[string]string{"A": "b"}},
		"stdin":   {ID: "append-1", Argv: appendOnce.Argv, Stdin: []byte("x")},
		"timeout": {ID: "append-1", Argv: appendOnce.Argv, Timeout: time.Second},
	} {
		_, _, err := h.m.StartExec(context.Background(), sid, changed)
		if !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "spec."+field) {
			t.Errorf("a different %s under the same id: %v", field, err)
		}
	}
	// 50 concurrent starts of one id.
	again := sh("append-2", "echo line >> /work/log")
	var wg sync.WaitGroup
	var mu sync.Mutex
	createdN := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, c, err := h.m.StartExec(context.Background(), sid, again)
			if err != nil {
				t.Errorf("concurrent start: %v", err)
			}
			if c {
				mu.Lock()
				createdN++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if createdN != 1 {
		t.Fatalf("50 concurrent starts created %d execs", createdN)
	}
	h.waitExec(t, sid, again.ID)
	if x := h.execWait(t, sid, sh("count", "wc -l < /work/log")); strings.TrimSpace(string(x.StdoutTail)) != "2" {
		t.Fatalf("the two appending execs ran %q times in all, want 2", x.StdoutTail)
	}
	for _, bad := range []ExecSpec{
		{ID: "", Argv: []string{"true"}},
		{ID: "a/b", Argv: []string{"true"}},
		{ID: "ok"},
		{ID: "ok", Argv: []string{"true"}, Cwd: "/etc"},
		{ID: "ok", Argv: []string{"true"}, Cwd: "/work/../etc"},
		{ID: "ok", Argv: []string{"true"}, Stdin: make([]byte, MaxExecStdin+1)},
	} {
		if _, _, err := h.m.StartExec(context.Background(), sid, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("StartExec(%+v): %v, want invalid argument", bad.ID, err)
		}
	}
	h.execWait(t, sid, sh("links", "mkdir -p /work/sub; ln -s /etc /work/etclink; ln -s /tmp /work/tmplink"))
	for cwd, want := range map[string]error{"/work/none": errdefs.ErrNotFound, "/work/etclink": errdefs.ErrPermissionDenied, "/work/tmplink": errdefs.ErrPermissionDenied} {
		if _, _, err := h.m.StartExec(context.Background(), sid, ExecSpec{ID: "cwd" + strings.ReplaceAll(cwd, "/", "-"), Argv: []string{"true"}, Cwd: cwd}); !errors.Is(err, want) || !strings.Contains(err.Error(), "spec.cwd") {
			t.Errorf("cwd %s: %v, want %v naming spec.cwd", cwd, err, want)
		}
	}
	if x := h.execWait(t, sid, ExecSpec{ID: "in-sub", Argv: []string{"pwd"}, Cwd: "/work/sub"}); string(x.StdoutTail) != "/work/sub\n" {
		t.Errorf("an exec in /work/sub ran in %q", x.StdoutTail)
	}
	if _, _, err := h.m.StartExec(context.Background(), "no-such-session", sh("x", "true")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("no session: %v", err)
	}
}

// TestSessionTimeouts: an exec past its own timeout ends timeout, its
// processes gone, while the session and another exec live on; a session
// idle past its idle timeout ends idle_timeout; a session past its
// deadline ends timeout.
func TestSessionTimeouts(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("bg", "sleep 30")); err != nil {
		t.Fatal(err)
	}
	x := h.execWait(t, sid, ExecSpec{ID: "slow", Argv: []string{"sh", "-c", "sleep 301 & sleep 300"}, Timeout: time.Second})
	if x.Reason != sandbox.ReasonTimeout || x.WallTime > 10*time.Second {
		t.Fatalf("timed-out exec: %+v", x)
	}
	if bg, _ := h.m.GetExec(sid, "bg"); bg.State != ExecRunning {
		t.Fatalf("the other exec ended with the timed-out one: %+v", bg)
	}
	if x := h.execWait(t, sid, sh("after", `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 30[01]'`)); !strings.HasSuffix(string(x.StdoutTail), "0\n") {
		t.Fatalf("the timed-out exec's processes live on: %q", x.StdoutTail)
	}
	if _, err := h.m.CancelExec(sid, "bg"); err != nil {
		t.Fatal(err)
	}
	if bg := h.waitExec(t, sid, "bg"); bg.Reason != sandbox.ReasonCancelled {
		t.Fatalf("cancelled exec: %+v", bg)
	}

	idle := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, 2*time.Second))
	h.execWait(t, idle, sh("one", "true"))
	start := time.Now()
	if run := h.waitEnd(t, idle); run.Result.Reason != ReasonIdleTimeout || run.State != Finished {
		t.Fatalf("idle session: %s %+v", run.State, run.Result)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the idle session ended %s after its last exec", d)
	}

	g := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	g.Limits = baseLimits
	g.Limits.Deadline = 3 * time.Second
	late := h.startSession(t, g)
	if _, _, err := h.m.StartExec(context.Background(), late, sh("long", "sleep 60")); err != nil {
		t.Fatal(err)
	}
	run := h.waitEnd(t, late)
	if run.Result.Reason != sandbox.ReasonTimeout {
		t.Fatalf("session past its deadline: %+v", run.Result)
	}
	if x, _ := h.m.GetExec(late, "long"); x.State != ExecEnded || x.Reason != sandbox.ReasonCancelled {
		t.Fatalf("the exec of a session past its deadline: %+v", x)
	}
	if _, _, err := h.m.StartExec(context.Background(), late, sh("after-end", "true")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("an exec in an ended session: %v", err)
	}
}

// TestSessionRecover: an executor that dies with a session running leaves
// it, and its running exec, recorded running; the next start ends both
// executor_restarted and keeps the exec records. A record a host crash
// left empty (they are not synced) is skipped, not a failed start.
func TestSessionRecover(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := "sess-crashed"
	dir := h.m.runDir(sid)
	g := h.seal(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	h.m.mu.Lock()
	e := &entry{run: Run{JobID: sid, State: Running, SignedGrant: g.Signed, Grant: g, CreatedAt: time.Now()}, changed: make(chan struct{})}
	h.m.mu.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := h.m.persist(&e.run); err != nil {
		t.Fatal(err)
	}
	for i, state := range []ExecState{ExecEnded, ExecRunning} {
		x := Exec{SessionID: sid, Spec: sh(fmt.Sprintf("x%d", i), "true"), Seq: int64(i + 1), State: state, StartedAt: time.Now(), StdinSHA256: sha256Hex(nil)}
		if err := os.MkdirAll(h.m.execDir(sid, x.Seq), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := h.m.persistExec(&x, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(h.m.execDir(sid, 3), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.m.execDir(sid, 3), "exec.json"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m2, err := New(h.m.cfg)
	if err != nil {
		t.Fatalf("New with an exec record a host crash left empty: %v", err)
	}
	defer m2.Close()
	// The highest seq counts the skipped record's directory, so the next
	// exec (of a session that outlives a restart) takes seq 4 and never
	// writes into it.
	m2.mu.Lock()
	last := m2.runs[sid].lastSeq
	m2.mu.Unlock()
	if last != 3 {
		t.Fatalf("the highest exec seq after loading: %d, want 3 (the unreadable record's)", last)
	}
	if err := m2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	xs, _, err := m2.ListExecs(sid)
	if err != nil || len(xs) != 2 {
		t.Fatalf("execs after the restart: %v %v", xs, err)
	}
	if xs[0].Spec.ID != "x0" || xs[1].State != ExecEnded || xs[1].Reason != ReasonExecutorRestarted {
		t.Fatalf("execs after the restart: %+v", xs)
	}
	if run, _ := m2.Get(sid); run.State != Failed || run.Result.Reason != ReasonExecutorRestarted {
		t.Fatalf("session after the restart: %+v", run)
	}
	if _, _, err := m2.StartExec(context.Background(), sid, sh("x1", "true")); err != nil {
		// The same id and spec: the recorded exec, not a refusal.
		t.Fatalf("retry of the exec the restart ended: %v", err)
	}
}

// TestSessionUpdate: a newer grant changes a running session's limits as
// it does a job's: a deadline extended before it passes keeps the session
// and its execs alive past the old one, and the sandbox's limits follow.
func TestSessionUpdate(t *testing.T) {
	h, _ := newHarness(t, false)
	// An idle timeout shorter than the wait below: only the raised one
	// keeps the session alive through it.
	g := h.sessionGrant(sandbox.ClassRunc, 2*time.Second)
	g.Limits.Deadline = 4 * time.Second
	sid := h.startSession(t, g)
	g2 := next(g, func(g *Grant) {
		g.Limits.Deadline = time.Minute
		g.Limits.Pids = 100
		g.Session.IdleTimeout = time.Minute
	})
	if _, err := h.m.Update(context.Background(), h.seal(t, g2)); err != nil {
		t.Fatalf("Update: %v", err)
	}
	time.Sleep(5 * time.Second)
	x := h.execWait(t, sid, sh("after-old-deadline", "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || echo gone; echo alive"))
	if x.ExitCode != 0 || !strings.Contains(string(x.StdoutTail), "alive") {
		t.Fatalf("the session past its old deadline and idle timeout: %+v", x)
	}
	h.m.mu.Lock()
	lim := h.m.runs[sid].live.Limits()
	h.m.mu.Unlock()
	if lim.Deadline != time.Minute || lim.Pids != 100 {
		t.Fatalf("the sandbox's limits after the update: %+v", lim)
	}

	// Lowering max_concurrent_execs below what runs stops nothing: the
	// running exec finishes, a new one is refused until it has.
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("slow-1", "sleep 2; echo done")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("slow-2", "sleep 2; echo done")); err != nil {
		t.Fatal(err)
	}
	g3 := next(g2, func(g *Grant) { g.Session.MaxConcurrentExecs = 1 })
	if _, err := h.m.Update(context.Background(), h.seal(t, g3)); err != nil {
		t.Fatalf("Update lowering max_concurrent_execs: %v", err)
	}
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("third", "true")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("an exec beyond the lowered bound: %v, want ResourceExhausted", err)
	}
	for _, id := range []string{"slow-1", "slow-2"} {
		if x := h.waitExec(t, sid, id); x.Reason != sandbox.ReasonExited || x.ExitCode != 0 || !strings.Contains(string(x.StdoutTail), "done") {
			t.Fatalf("exec %s running when the bound was lowered: %+v", id, x)
		}
	}
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("two-at-once", "sleep 1")); err != nil {
		t.Fatalf("one exec under the lowered bound: %v", err)
	}
	if _, _, err := h.m.StartExec(context.Background(), sid, sh("three-at-once", "true")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a second exec at once under a bound of 1: %v", err)
	}
	h.waitExec(t, sid, "two-at-once")

	// A lowered idle timeout holds from the update on, not from when the
	// old one would have run out.
	g5 := next(g3, func(g *Grant) { g.Session.IdleTimeout = time.Second })
	lowered := time.Now()
	if _, err := h.m.Update(context.Background(), h.seal(t, g5)); err != nil {
		t.Fatalf("Update lowering idle_timeout: %v", err)
	}
	if run := h.waitEnd(t, sid); run.Result.Reason != ReasonIdleTimeout || time.Since(lowered) > 30*time.Second {
		t.Fatalf("after lowering the idle timeout to 1s: %+v after %s", run.Result, time.Since(lowered))
	}
}

func (h *harness) waitRun(t *testing.T, sid, what string, cond func(Run, bool) bool) Run {
	t.Helper()
	end := time.Now().Add(60 * time.Second)
	for {
		run, err := h.m.Get(sid)
		if err != nil {
			t.Fatal(err)
		}
		h.m.mu.Lock()
		up := h.m.runs[sid].live != nil
		h.m.mu.Unlock()
		if cond(run, up) {
			return run
		}
		if time.Now().After(end) {
			t.Fatalf("session %s: not %s: %s %+v", sid, what, run.State, run.Result)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSessionSuspendResume: suspending keeps the session's /work changes
// and /out and nothing else (/tmp, $HOME and processes are gone); a
// resumed session runs on them; another session sees none of it; a
// suspended session can be finished, and its deadline counts on.
func TestSessionSuspendResume(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			sid := h.startSession(t, h.sessionGrant(class, time.Minute))
			h.execWait(t, sid, sh("setup", "echo kept >> README; mkdir -p /out/r; echo out > /out/r/x; echo t > /tmp/t; echo h > /root/h"))
			if _, _, err := h.m.StartExec(context.Background(), sid, sh("long", "sleep 100")); err != nil {
				t.Fatal(err)
			}
			if _, err := h.m.Suspend(sid); err != nil {
				t.Fatal(err)
			}
			h.waitRun(t, sid, "suspended", func(r Run, up bool) bool { return r.Suspended && !up })
			if x, _ := h.m.GetExec(sid, "long"); x.State != ExecEnded || x.Reason != sandbox.ReasonCancelled {
				t.Fatalf("an exec running when the session was suspended: %+v", x)
			}
			if _, _, err := h.m.StartExec(context.Background(), sid, sh("while-suspended", "true")); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "suspended") {
				t.Fatalf("an exec in a suspended session: %v", err)
			}
			if _, err := h.m.Resume(context.Background(), sid); err != nil {
				t.Fatal(err)
			}
			h.waitRun(t, sid, "resumed", func(r Run, up bool) bool { return !r.Suspended && up })
			x := h.execWait(t, sid, sh("after", `cat /work/README /out/r/x; ls -A /tmp /root | tr '\n' ' '; echo; for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 100' || true`))
			if got := string(x.StdoutTail); !strings.HasPrefix(got, "hello\nkept\nout\n") || strings.Contains(got, " t ") || strings.Contains(got, " h ") || !strings.HasSuffix(got, "\n0\n") {
				t.Fatalf("after resume: %q", got)
			}
			// Another session of another tenant on the same base.
			other := h.sessionGrant(class, time.Minute)
			other.Tenant = "globex"
			osid := h.startSession(t, other)
			if x := h.execWait(t, osid, sh("look", "cat /work/README; ls /out")); string(x.StdoutTail) != "hello\n" {
				t.Fatalf("another session sees %q", x.StdoutTail)
			}
			// Finished while suspended: the bundle has the kept changes.
			if _, err := h.m.Suspend(sid); err != nil {
				t.Fatal(err)
			}
			h.waitRun(t, sid, "suspended again", func(r Run, up bool) bool { return r.Suspended })
			if _, err := h.m.Finish(sid); err != nil {
				t.Fatal(err)
			}
			run := h.waitEnd(t, sid)
			patch, _ := os.ReadFile(filepath.Join(h.m.runDir(sid), "review.patch"))
			if run.Result.Reason != ReasonFinished || !strings.Contains(string(patch), "+kept") {
				t.Fatalf("finished while suspended: %+v\n%s", run.Result, patch)
			}
			if _, err := h.m.Finish(osid); err != nil {
				t.Fatal(err)
			}
			h.waitEnd(t, osid)
		})
	}
	t.Run("deadline", func(t *testing.T) {
		h, _ := newHarness(t, false)
		g := h.sessionGrant(sandbox.ClassRunc, time.Minute)
		g.Limits.Deadline = 4 * time.Second
		sid := h.startSession(t, g)
		if _, err := h.m.Suspend(sid); err != nil {
			t.Fatal(err)
		}
		run := h.waitEnd(t, sid)
		if run.Result.Reason != sandbox.ReasonTimeout || !strings.Contains(run.Result.Message, "suspended") {
			t.Fatalf("a session suspended past its deadline: %+v", run.Result)
		}
	})
}

// stallReader gives its first chunk, then blocks until released.
type stallReader struct {
	first   []byte
	release chan struct{}
}

func (r *stallReader) Read(p []byte) (int, error) {
	if len(r.first) > 0 {
		n := copy(p, r.first)
		r.first = r.first[n:]
		return n, nil
	}
	<-r.release
	return 0, io.EOF
}

// TestSessionFilesFence: an upload that stalls, and a download nobody
// reads, when the session is finished: the session ends at once, the
// upload is refused and nothing of it reaches the patch.
func TestSessionFilesFence(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	h.execWait(t, sid, sh("big", "head -c 4000000 /dev/zero > /work/big.bin"))
	stall := &stallReader{first: []byte("half of it\n"), release: make(chan struct{})}
	defer close(stall.release)
	wrote := make(chan error, 1)
	go func() { _, err := h.m.WriteFile(context.Background(), sid, "/work/upload.txt", 0, stall); wrote <- err }()
	readStarted := make(chan struct{})
	read := make(chan error, 1)
	go func() {
		read <- h.m.ReadFile(context.Background(), sid, "/work/big.bin", func(int64) error { close(readStarted); return nil },
			func([]byte) error { select {} }) // never takes a chunk
	}()
	<-readStarted
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if _, err := h.m.Finish(sid); err != nil {
		t.Fatal(err)
	}
	run := h.waitEnd(t, sid)
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the session took %s to end behind stalled file calls", d)
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the stalled upload was accepted")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled upload did not return once the session stopped")
	}
	patch, _ := os.ReadFile(filepath.Join(h.m.runDir(sid), "review.patch"))
	if strings.Contains(string(patch), "airlock-upload") || strings.Contains(string(patch), "upload.txt") || run.Result.FilesChanged != 1 {
		t.Fatalf("the patch has what the stalled upload wrote (%d files):\n%.500s", run.Result.FilesChanged, patch)
	}
}

// TestSessionSuspendedCapacity: a suspended session gives back its memory
// to the executor's capacity, and is resumed only when it fits again.
func TestSessionSuspendedCapacity(t *testing.T) {
	h, _ := newHarnessWith(t, false, Capacity{MemoryBytes: 384 << 20})
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	job := h.grantFor("echo up; sleep 60")
	if _, _, err := h.m.Start(h.seal(t, job)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a second 256 MiB run beside a running 256 MiB session in 384 MiB: %v", err)
	}
	if _, err := h.m.Suspend(sid); err != nil {
		t.Fatal(err)
	}
	h.waitRun(t, sid, "suspended", func(r Run, _ bool) bool { return r.Suspended })
	h.start(t, job)
	h.waitRunning(t, job.JobID, "up")
	if _, err := h.m.Resume(context.Background(), sid); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "stays suspended") {
		t.Fatalf("Resume beside the job that took its memory: %v", err)
	}
	if _, err := h.m.Cancel(job.JobID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, job.JobID)
	if _, err := h.m.Resume(context.Background(), sid); err != nil {
		t.Fatalf("Resume once it fits: %v", err)
	}
	h.waitRun(t, sid, "resumed", func(r Run, up bool) bool { return !r.Suspended && up })
	if x := h.execWait(t, sid, sh("after", "echo ok")); string(x.StdoutTail) != "ok\n" {
		t.Fatalf("after resume: %q", x.StdoutTail)
	}
}
