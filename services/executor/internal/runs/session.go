package runs

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Session reasons: how a session ends when its client did not cancel it
// and its deadline did not pass.
const (
	ReasonFinished    sandbox.Reason = "finished"
	ReasonIdleTimeout sandbox.Reason = "idle_timeout"
)

// Session defaults, where the grant leaves them zero, and bounds on what
// one exec may carry.
const (
	DefaultIdleTimeout        = 15 * time.Minute
	DefaultMaxConcurrentExecs = 4
	MaxExecStdin              = 1 << 20
	// MaxExecs bounds the execs one session may run in all, and
	// ExecOutputLimit each stream of one, and SessionOutputBudget what
	// they may keep in all: their records and output are kept on the
	// executor's disk, outside the session's disk limit, to the end.
	MaxExecs            = 2000
	ExecOutputLimit     = 1 << 20
	SessionOutputBudget = 256 << 20
	// maxExecArgs and maxExecArgBytes bound an exec's argv and env: each
	// record carries them to the end, and into review.
	maxExecArgs     = 4096
	maxExecArgBytes = 128 << 10
)

// sessionOf is e's session spec, nil for a job. Callers hold m.mu.
func (e *entry) session() (idle time.Duration, maxExecs int, ok bool) {
	s := e.run.Grant.Session
	if s == nil {
		return 0, 0, false
	}
	idle, maxExecs = s.IdleTimeout, s.MaxConcurrentExecs
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	if maxExecs <= 0 {
		maxExecs = DefaultMaxConcurrentExecs
	}
	return idle, maxExecs, true
}

// sessionState says, for a refusal, where a session is. Callers hold m.mu.
func (e *entry) sessionState() string {
	switch {
	case e.stopping != "" && !e.run.State.Terminal():
		return "ending (" + string(e.stopping) + ")"
	case e.run.Suspended && e.resumeAsked:
		return "resuming"
	case e.run.Suspended && e.run.SuspendReason == ReasonIdleTimeout:
		return "asleep (its next exec or files call wakes it)"
	case e.run.Suspended:
		return "suspended (resume it first)"
	case e.suspending && e.suspendWhy == ReasonIdleTimeout:
		return "falling asleep"
	case e.suspending:
		return "being suspended"
	case e.run.State == Running && e.live == nil:
		return "starting"
	}
	return string(e.run.State)
}

// runSession runs a session's sandbox until the session ends, and after
// each suspension (Suspend) restarts it, once resumed, on the same /work
// and /out. It says how the session ended as sb.Run says how a job did.
func (m *Manager) runSession(ctx context.Context, e *entry, sb *sandbox.Sandbox) (sandbox.Result, error) {
	m.mu.Lock()
	// A session kept across the executor's restart starts suspended.
	suspended := e.run.Suspended
	m.mu.Unlock()
	res := sb.BaseResult()
	for {
		if !suspended {
			var (
				runErr error
				again  bool
			)
			if res, again, runErr = m.runSessionOnce(ctx, e, sb); !again {
				return res, runErr
			}
		}
		suspended = false
		res, ended := m.waitSuspended(ctx, e, sb, res)
		if ended && m.ctx.Err() != nil {
			// The executor is stopping: the session stays suspended as it
			// is (asleep stays asleep) while execute keeps its files.
			return m.sessionEnded(e, res), nil
		}
		// One step, under the lock: no Suspend or Resume sees a session
		// half resumed. A Suspend that came after the resume was asked
		// withdrew it, and an end that came meanwhile wins: the session
		// waits on, or ends as it is.
		resumed := true
		m.update(e, func(r *Run) {
			if !ended && (!e.resumeAsked || ctx.Err() != nil) {
				resumed = false
				return
			}
			r.endSuspension(m.cfg.Now())
			e.suspending, e.suspendWhy, e.resumeAsked, e.lastActive = false, "", false, m.cfg.Now()
		})
		if ended {
			return m.sessionEnded(e, res), nil
		}
		if !resumed {
			continue
		}
		m.cfg.Logger.Info("session resumed", "job_id", e.run.JobID)
	}
}

// runSessionOnce runs a session's sandbox until it stops. Suspended (again
// true), it is ready to run again and recorded suspended; otherwise the
// session has ended, as the result says.
func (m *Manager) runSessionOnce(ctx context.Context, e *entry, sb *sandbox.Sandbox) (res sandbox.Result, again bool, err error) {
	runCtx, stopRun := context.WithCancel(ctx)
	filesCtx, stopFiles := context.WithCancel(ctx)
	m.mu.Lock()
	e.stopRun, e.live = stopRun, sb
	e.filesCtx, e.filesCancel = filesCtx, stopFiles
	e.notify()
	m.mu.Unlock()
	res, runErr := sb.Run(runCtx)
	stopRun()
	// The sandbox stopped, so every exec in it ends, and no files call
	// may touch it once the calls in flight (told to stop) return:
	// what the patch and the records take is final.
	m.mu.Lock()
	e.live = nil
	suspend := e.suspending && e.stopping == "" && ctx.Err() == nil && runErr == nil && res.Reason == sandbox.ReasonCancelled
	m.mu.Unlock()
	stopFiles()
	e.filesMu.Lock()
	e.filesMu.Unlock() //nolint:staticcheck // waits for the calls in flight
	e.execWG.Wait()
	if !suspend {
		return m.sessionEnded(e, res), false, runErr
	}
	if err := sb.Restart(); err != nil {
		m.cfg.Logger.Error("suspend a session", "job_id", e.run.JobID, "error", err)
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonSandboxError, -1, "the sandbox could not be suspended: "+err.Error()
		return m.sessionEnded(e, res), false, nil
	}
	var why sandbox.Reason
	m.update(e, func(r *Run) { why = e.suspendWhy; r.beginSuspension(m.cfg.Now(), why) })
	m.cfg.Logger.Info("session suspended", "job_id", e.run.JobID, "reason", cmp.Or(string(why), "client"))
	return res, true, nil
}

// waitSuspended waits for a suspended session to be resumed (ended false),
// or to end: finished, cancelled, or past its deadline, which counts on.
func (m *Manager) waitSuspended(ctx context.Context, e *entry, sb *sandbox.Sandbox, res sandbox.Result) (sandbox.Result, bool) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		m.mu.Lock()
		asked, changed, started := e.resumeAsked, e.changed, e.run.StartedAt
		m.mu.Unlock()
		// Its end first: a session finished, cancelled or past its deadline
		// while it was being resumed (or woken) ends; it does not run again.
		if ctx.Err() != nil {
			res.Reason, res.ExitCode, res.Message = sandbox.ReasonCancelled, -1, "the session was suspended: no process was running"
			return res, true
		}
		if lim := sb.Limits(); m.cfg.Now().Sub(started) >= lim.Deadline {
			res.Reason, res.ExitCode = sandbox.ReasonTimeout, -1
			res.Message = fmt.Sprintf("the deadline of %s passed while the session was suspended", lim.Deadline)
			return res, true
		}
		if asked {
			return res, false
		}
		select {
		case <-changed:
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// sessionEnded records why a session ended and words its result: one the
// client finished, or that sat idle, was stopped, not cancelled.
func (m *Manager) sessionEnded(e *entry, res sandbox.Result) sandbox.Result {
	m.mu.Lock()
	if e.stopping == "" && m.ctx.Err() == nil {
		// Not when the executor stops: a session it stops under is kept
		// (execute), not ended.
		e.stopping = res.Reason
	}
	stopping := e.stopping
	e.suspending = false
	e.notify() // a Wake waiting on it learns it ended
	m.mu.Unlock()
	if res.Reason == sandbox.ReasonCancelled && (stopping == ReasonFinished || stopping == ReasonIdleTimeout) {
		res.Reason, res.ExitCode = stopping, -1
		res.Message = map[sandbox.Reason]string{
			ReasonFinished:    "the client finished the session",
			ReasonIdleTimeout: "no exec ran for longer than the session's idle timeout",
		}[stopping]
	}
	return res
}

// Suspend stops a running session's sandbox: every exec in it ends
// cancelled, every process is gone; its /work changes and /out are kept for
// Resume, and /tmp and $HOME are emptied. Suspending a suspended session
// changes nothing, but for one asleep or being resumed: it stays
// suspended, now by its client, and no longer wakes by itself.
func (m *Manager) Suspend(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, err := m.runningSession(jobID)
	if err != nil {
		return Run{}, err
	}
	return m.suspendByClientLocked(e)
}

// suspendByClientLocked is Suspend of e. Callers hold m.mu.
func (m *Manager) suspendByClientLocked(e *entry) (Run, error) {
	jobID := e.run.JobID
	if e.asleep() {
		e.suspendWhy = ""
		if e.run.Suspended {
			e.run.SuspendReason = ""
			if err := m.persist(&e.run); err != nil {
				m.cfg.Logger.Error("persist run", "job_id", jobID, "error", err)
			}
		}
		e.notify()
		return e.run, nil
	}
	if e.run.Suspended && e.resumeAsked {
		// Being resumed or woken: the client's suspension wins, and it
		// stays suspended, by its client, until Resume.
		e.resumeAsked, e.suspendWhy, e.run.SuspendReason = false, "", ""
		if err := m.persist(&e.run); err != nil {
			m.cfg.Logger.Error("persist run", "job_id", jobID, "error", err)
		}
		e.notify()
		return e.run, nil
	}
	if e.suspending || e.run.Suspended {
		return e.run, nil
	}
	if e.live == nil || e.stopping != "" {
		return Run{}, fmt.Errorf("%w: session %s is %s: only a running session can be suspended", errdefs.ErrFailedPrecondition, jobID, e.sessionState())
	}
	m.suspendLocked(e, "")
	return e.run, nil
}

// Resume starts a suspended session's sandbox again: a fresh sandbox on
// the same base with the session's /work changes and /out. A suspended
// session holds no memory or CPU of the executor's capacity; one that no
// longer fits beside the runs admitted meanwhile stays suspended
// (ErrResourceExhausted). An asleep session is woken as an exec wakes it:
// Resume returns once it runs (Wake).
func (m *Manager) Resume(ctx context.Context, jobID string) (Run, error) {
	m.mu.Lock()
	e, err := m.runningSession(jobID)
	if err != nil {
		m.mu.Unlock()
		return Run{}, err
	}
	if e.asleep() || e.run.Suspended && e.resumeAsked && e.run.SuspendReason == ReasonIdleTimeout {
		m.mu.Unlock()
		if err := m.Wake(ctx, jobID); err != nil {
			return Run{}, err
		}
		return m.Get(jobID)
	}
	defer m.mu.Unlock()
	switch {
	case e.run.Suspended && !e.resumeAsked:
		if err := m.resumeLocked(e); err != nil {
			return Run{}, fmt.Errorf("session %s stays suspended: %w", jobID, err)
		}
	case e.suspending && !e.run.Suspended:
		return Run{}, fmt.Errorf("%w: session %s is still being suspended; resume it once it is", errdefs.ErrFailedPrecondition, jobID)
	}
	return e.run, nil
}

// runningSession is the session jobID while it has not ended. Callers hold
// m.mu.
func (m *Manager) runningSession(jobID string) (*entry, error) {
	e, ok := m.runs[jobID]
	if !ok {
		return nil, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); !ok {
		return nil, fmt.Errorf("%w: run %s is a job, not a session", errdefs.ErrFailedPrecondition, jobID)
	}
	if e.run.State != Running {
		return nil, fmt.Errorf("%w: session %s is %s", errdefs.ErrFailedPrecondition, jobID, e.run.State)
	}
	return e, nil
}

// Finish ends a running session: its sandbox stops, its running execs
// end cancelled, and its bundle is built and reported with reason
// finished. Finishing an ended session changes nothing; a job is refused.
func (m *Manager) Finish(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		return Run{}, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); !ok {
		return Run{}, fmt.Errorf("%w: run %s is a job, not a session: it ends when its command does", errdefs.ErrFailedPrecondition, jobID)
	}
	m.stopSession(e, ReasonFinished)
	return e.run, nil
}

// stopSession stops e's sandbox for reason, once. Callers hold m.mu.
func (m *Manager) stopSession(e *entry, reason sandbox.Reason) {
	if e.run.State.Terminal() || e.stopping != "" {
		return
	}
	e.stopping = reason
	if e.cancel != nil {
		e.cancel()
	}
	e.notify()
}
