package runs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// StartExec starts x in the running session jobID, or returns the exec of
// that id when it was started with the same spec (created false), running
// or ended. The same id with another spec is ErrAlreadyExists naming the
// field. Concurrent calls with one id start it once. A new exec wakes an
// asleep session and waits for it (Wake).
func (m *Manager) StartExec(ctx context.Context, jobID string, x ExecSpec) (Exec, bool, error) {
	rec, created, _, err := m.startWaking(ctx, jobID, x, false)
	return rec, created, err
}

// startWaking is startExec, with an asleep session woken first.
func (m *Manager) startWaking(ctx context.Context, jobID string, x ExecSpec, fed bool) (Exec, bool, *execEntry, error) {
	type started struct {
		rec     Exec
		created bool
		xe      *execEntry
	}
	s, err := waking(ctx, m, jobID, func() (started, error) {
		rec, created, xe, err := m.startExec(jobID, x, fed)
		return started{rec, created, xe}, err
	})
	return s.rec, s.created, s.xe, err
}

// startExec is StartExec; a caller that can feed a streamed stdin (fed)
// may start an exec that takes one, and gets its entry to feed it.
func (m *Manager) startExec(jobID string, x ExecSpec, fed bool) (Exec, bool, *execEntry, error) {
	if err := checkExecSpec(&x); err != nil {
		return Exec{}, false, nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		return Exec{}, false, nil, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); !ok {
		return Exec{}, false, nil, fmt.Errorf("%w: run %s is a job, not a session: it takes no execs", errdefs.ErrFailedPrecondition, jobID)
	}
	if xe, ok := e.execs[x.ID]; ok {
		if f := xe.rec.differs(&x); f != "" {
			return Exec{}, false, nil, fmt.Errorf("%w: spec.exec_id %q: an exec of this id was started with a different %s", errdefs.ErrAlreadyExists, x.ID, f)
		}
		return xe.rec, false, xe, nil
	}
	_, maxExecs, _ := e.session()
	switch {
	case x.StdinStream && !fed:
		return Exec{}, false, nil, fmt.Errorf("%w: spec.stdin_stream: StartExec has no stream to feed stdin from; start the exec with RunExec", errdefs.ErrFailedPrecondition)
	case e.run.State != Running || e.stopping != "":
		return Exec{}, false, nil, fmt.Errorf("%w: session %s is %s: it takes no new exec", errdefs.ErrFailedPrecondition, jobID, e.sessionState())
	case e.runningExecs >= maxExecs:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s runs %d execs, its most at once", errdefs.ErrResourceExhausted, jobID, maxExecs)
	case len(e.execs) >= MaxExecs:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s has run %d execs, its most", errdefs.ErrResourceExhausted, jobID, MaxExecs)
	case e.execOutput >= SessionOutputBudget:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s's execs have written %d bytes of output, its most (%d): finish it and start another",
			errdefs.ErrResourceExhausted, jobID, e.execOutput, SessionOutputBudget)
	// After the refusals: an exec refused anyway wakes no session.
	case e.wakeable():
		return Exec{}, false, nil, errAsleep
	case e.live == nil || e.suspending:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s is %s: it takes no new exec", errdefs.ErrFailedPrecondition, jobID, e.sessionState())
	}
	if x.Cwd != "" {
		// Resolved as the files API resolves paths: a directory the job
		// sees, not one a symlink leads out to.
		if err := e.live.CheckDir("spec.cwd", x.Cwd); err != nil {
			return Exec{}, false, nil, err
		}
	}
	rec := Exec{
		SessionID: jobID, Spec: x, StdinSize: int64(len(x.Stdin)), StdinSHA256: sha256Hex(x.Stdin),
		Seq: e.lastSeq + 1, State: ExecRunning, ExitCode: -1, StartedAt: m.cfg.Now(),
	}
	e.lastSeq = rec.Seq
	rec.Spec.Stdin = nil
	if x.StdinStream {
		rec.StdinSHA256 = "" // known once stdin closes
	}
	dir := m.execDir(jobID, rec.Seq)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Exec{}, false, nil, err
	}
	xe := &execEntry{rec: rec, done: make(chan struct{})}
	if x.StdinStream {
		xe.stdin = newStdinPipe()
	}
	notify := func() { m.mu.Lock(); e.notify(); m.mu.Unlock() }
	limit := min(m.cfg.OutputLimit, ExecOutputLimit)
	xe.stdout = lazyOutput(filepath.Join(dir, "stdout.log"), limit, notify)
	xe.stderr = lazyOutput(filepath.Join(dir, "stderr.log"), limit, notify)
	if err := m.persistExec(&xe.rec, true); err != nil {
		xe.stdout.close()
		xe.stderr.close()
		return Exec{}, false, nil, err
	}
	if e.execs == nil {
		e.execs = map[string]*execEntry{}
	}
	e.execs[x.ID] = xe
	m.metrics.execStarted()
	e.execOrder = append(e.execOrder, xe)
	e.runningExecs++
	e.lastActive = m.cfg.Now()
	ctx, cancel := context.WithCancel(context.WithoutCancel(m.ctx))
	xe.cancel = cancel
	sb := e.live
	e.execWG.Add(1)
	go func() {
		defer e.execWG.Done()
		defer cancel()
		m.runExec(ctx, e, xe, sb, x)
	}()
	e.notify()
	return xe.rec, true, xe, nil
}

// runExec runs one exec to its end and records how it ended.
func (m *Manager) runExec(ctx context.Context, e *entry, xe *execEntry, sb *sandbox.Sandbox, x ExecSpec) {
	spec := sandbox.ExecSpec{Argv: x.Argv, Env: x.Env, Cwd: x.Cwd, Timeout: x.Timeout, Stdout: xe.stdout, Stderr: xe.stderr}
	if len(x.Stdin) > 0 {
		spec.Stdin = bytes.NewReader(x.Stdin)
	}
	if xe.stdin != nil {
		spec.Stdin = xe.stdin.r
	}
	res, err := sb.Exec(ctx, spec)
	var stdinSize int64
	var stdinSum, stdinCut string
	if xe.stdin != nil {
		stdinSize, stdinSum, stdinCut = xe.stdin.finish()
	}
	switch {
	case m.ctx.Err() != nil:
		// The executor stopped, and the sandbox with it.
		res.Reason, res.ExitCode, res.Message = ReasonExecutorRestarted, -1, "the executor stopped while the exec ran"
	case errors.Is(err, context.Canceled):
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonCancelled, -1, "it had not started"
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		// The sandbox stopped (suspended, finished, cancelled) before the
		// command could start.
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonCancelled, -1, "the session's sandbox stopped before the exec started"
	case err != nil:
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonSandboxError, -1, err.Error()
		m.cfg.Logger.Error("exec failed", "job_id", e.run.JobID, "exec_id", x.ID, "error", err)
	}
	xe.stdout.close()
	xe.stderr.close()
	m.endExec(e, xe, func(r *Exec) {
		r.Reason, r.ExitCode, r.Message = res.Reason, res.ExitCode, res.Message
		r.WallTime, r.CPUTime = res.WallTime, res.CPUTime
		if xe.stdin != nil {
			r.StdinSize, r.StdinSHA256 = stdinSize, stdinSum
		}
		if stdinCut != "" {
			r.Message = stdinCut + "; " + r.Message
		}
	})
}

// endExec records xe ended, with its output's sizes, digests and tails.
func (m *Manager) endExec(e *entry, xe *execEntry, f func(*Exec)) {
	dir := m.execDir(e.run.JobID, xe.rec.Seq)
	out := streamSummary(filepath.Join(dir, "stdout.log"))
	errs := streamSummary(filepath.Join(dir, "stderr.log"))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endExecLocked(e, xe, out, errs, f)
	e.runningExecs--
}

// endExecLocked is endExec's record keeping. Callers hold m.mu.
func (m *Manager) endExecLocked(e *entry, xe *execEntry, out, errs summary, f func(*Exec)) {
	r := &xe.rec
	f(r)
	r.Message = m.callerText(e, r.Message)
	r.State, r.EndedAt = ExecEnded, m.cfg.Now()
	r.StdoutSize, r.StdoutSHA256, r.StdoutTail = out.size, out.sha, out.tail
	r.StderrSize, r.StderrSHA256, r.StderrTail = errs.size, errs.sha, errs.tail
	if xe.stdout != nil {
		_, r.StdoutTruncated = xe.stdout.state()
		_, r.StderrTruncated = xe.stderr.state()
	}
	if err := m.persistExec(r, false); err != nil {
		m.cfg.Logger.Error("persist exec", "job_id", e.run.JobID, "exec_id", r.Spec.ID, "error", err)
	}
	e.lastActive = m.cfg.Now()
	e.execOutput += r.StdoutSize + r.StderrSize
	close(xe.done)
	e.notify()
}

// CancelExec stops a running exec: SIGTERM to its process group, SIGKILL
// after the grace period. An ended exec is returned as it is.
func (m *Manager) CancelExec(jobID, execID string) (Exec, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, xe, err := m.lookupExec(jobID, execID)
	if err != nil {
		return Exec{}, err
	}
	if xe.rec.State == ExecRunning && xe.cancel != nil {
		xe.cancel()
	}
	return xe.rec, nil
}
