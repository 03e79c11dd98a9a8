package runs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// A session whose grant says on_idle sleep is not ended once idle past its
// idle timeout: it falls asleep. Asleep is suspended as Suspend suspends
// (no process runs; /work changes and /out are kept, /tmp and $HOME are
// not; its memory and CPU go back to the executor's capacity), recorded
// with suspend reason ReasonIdleTimeout. Its next exec or files call wakes
// it, and waits for it (Wake); so does Resume. A session its client
// suspended stays suspended until its client resumes it: only sleep is
// undone by itself. Its deadline counts on asleep as awake.

// WakeTimeout bounds how long a call waits for an asleep session to run
// again.
const WakeTimeout = 60 * time.Second

// wakeAttempts bounds how often a call that found its session asleep wakes
// it before giving up (it falls asleep again only after a whole idle
// timeout with no call, so once is the rule).
const wakeAttempts = 3

// errAsleep is what a call that needs a running sandbox finds of a session
// that is asleep, falling asleep or waking: the caller wakes it (Wake)
// and tries again.
var errAsleep = fmt.Errorf("%w: the session is asleep", errdefs.ErrFailedPrecondition)

// sleepsOnIdle says e's grant puts it to sleep, not to its end, once it
// is idle past its timeout. Callers hold m.mu.
func (e *entry) sleepsOnIdle() bool {
	s := e.run.Grant.Session
	return s != nil && s.SleepOnIdle
}

// wakeable says a call may wait for session e to run: it is asleep,
// falling asleep, waking (asleep, or resumed by its client), or starting.
// A session its client suspended is not. Callers hold m.mu.
func (e *entry) wakeable() bool {
	if e.stopping != "" || e.run.State != Running {
		return false
	}
	switch {
	case e.run.Suspended:
		return e.resumeAsked || e.run.SuspendReason == ReasonIdleTimeout
	case e.suspending:
		return e.suspendWhy == ReasonIdleTimeout
	}
	return e.live == nil
}

// asleep says session e is asleep or falling asleep. Callers hold m.mu.
func (e *entry) asleep() bool {
	return e.wakeable() && !e.resumeAsked && (e.run.Suspended || e.suspending)
}

// Wake wakes session jobID if it is asleep and waits, within WakeTimeout
// and ctx, until its sandbox runs again; a session that runs is left as
// it is. A session that cannot wake (capacity taken meanwhile, ended,
// suspended by its client) is an error saying why.
func (m *Manager) Wake(ctx context.Context, jobID string) error {
	ctx, cancel := context.WithTimeout(ctx, WakeTimeout)
	defer cancel()
	return m.wake(ctx, jobID)
}

// wake is Wake within ctx alone.
func (m *Manager) wake(ctx context.Context, jobID string) error {
	for {
		m.mu.Lock()
		e, err := m.runningSession(jobID)
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("session %s cannot wake: %w", jobID, err)
		}
		if !e.wakeable() {
			running := e.live != nil && !e.suspending && e.stopping == ""
			state := e.sessionState()
			m.mu.Unlock()
			if running {
				return nil
			}
			return fmt.Errorf("%w: session %s is %s", errdefs.ErrFailedPrecondition, jobID, state)
		}
		if e.run.Suspended && !e.resumeAsked {
			if err := m.resumeLocked(e); err != nil {
				m.mu.Unlock()
				return fmt.Errorf("session %s is asleep and cannot wake: %w", jobID, err)
			}
			m.cfg.Logger.Info("session waking", "job_id", jobID)
		}
		changed := e.changed
		m.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%w: session %s did not wake within %s; try again", errdefs.ErrFailedPrecondition, jobID, WakeTimeout)
			}
			return fmt.Errorf("session %s: the call ended while it woke: %w", jobID, ctx.Err())
		}
	}
}

// waking calls call until it finds its session other than asleep (wake
// wakes it in between), at most wakeAttempts times, all within one
// WakeTimeout.
func waking[T any](ctx context.Context, m *Manager, jobID string, call func() (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, WakeTimeout)
	defer cancel()
	for range wakeAttempts {
		v, err := call()
		if !errors.Is(err, errAsleep) {
			return v, err
		}
		if err := m.wake(ctx, jobID); err != nil {
			var zero T
			return zero, err
		}
	}
	var zero T
	return zero, fmt.Errorf("%w: session %s fell asleep again as it woke, %d times", errdefs.ErrFailedPrecondition, jobID, wakeAttempts)
}

// suspendLocked stops session e's sandbox, for its client (why "") or
// to sleep (ReasonIdleTimeout): runSessionOnce records it suspended once
// every process is gone. Callers hold m.mu; e runs.
func (m *Manager) suspendLocked(e *entry, why sandbox.Reason) {
	e.suspending, e.suspendWhy, e.resumeAsked = true, why, false
	e.stopRun()
	e.notify()
}

// resumeLocked asks suspended session e to run again, once it fits
// beside the runs admitted meanwhile: its memory and CPU were given back
// while it was suspended. Callers hold m.mu.
func (m *Manager) resumeLocked(e *entry) error {
	if err := m.cfg.Capacity.admit(m.held(e), e.run.Grant.hostLimits()); err != nil {
		return err
	}
	e.resumeAsked = true
	e.notify()
	return nil
}

// beginSuspension records r suspended from now, for why; a suspension
// under way goes on from when it began, for why.
func (r *Run) beginSuspension(now time.Time, why sandbox.Reason) {
	if !r.Suspended {
		r.Suspended, r.SuspendedAt = true, now
	}
	r.SuspendReason = why
}

// endSuspension records r running again, its suspension's time added to
// AsleepTime.
func (r *Run) endSuspension(now time.Time) {
	if r.Suspended && !r.SuspendedAt.IsZero() {
		r.AsleepTime += max(0, now.Sub(r.SuspendedAt))
	}
	r.Suspended, r.SuspendedAt, r.SuspendReason = false, time.Time{}, ""
}

// Times splits r's time from its start to its end (or now, while it
// runs) into awake, its sandbox running, and asleep, suspended. A run not
// started has neither.
func (r Run) Times(now time.Time) (awake, asleep time.Duration) {
	if r.StartedAt.IsZero() {
		return 0, 0
	}
	end := now
	if !r.FinishedAt.IsZero() {
		end = r.FinishedAt
	}
	asleep = r.AsleepTime
	if r.Suspended && !r.SuspendedAt.IsZero() {
		asleep += max(0, end.Sub(r.SuspendedAt))
	}
	wall := max(0, end.Sub(r.StartedAt))
	asleep = min(asleep, wall)
	return wall - asleep, asleep
}

// account fills in result the run's awake and asleep time and its network
// bytes. A job is awake for its wall time; a session for its time from
// its start to now less its suspensions, and its wall time is that whole
// time (the sandbox's own is its last stretch awake). The network bytes
// are its network namespace's (netpolicy.Net.Bytes: every packet through
// its veth, under every policy) plus, for a session kept across executor
// restarts, those of its earlier namespaces (Run.NetSentBefore).
func (m *Manager) account(e *entry, result *Result, isSession bool) {
	result.NetworkSentBytes, result.NetworkReceivedBytes = m.netBytes(e)
	m.mu.Lock()
	run := e.run
	m.mu.Unlock()
	result.AwakeTime = result.Usage.WallTime
	if isSession {
		result.AwakeTime, result.AsleepTime = run.Times(m.cfg.Now())
		result.Usage.WallTime = result.AwakeTime + result.AsleepTime
	}
}

// netBytes are e's network bytes so far: its earlier namespaces'
// (Run.NetSentBefore) and its current one's (one netlink request).
func (m *Manager) netBytes(e *entry) (sent, received int64) {
	m.mu.Lock()
	n, sent, received := e.net, e.run.NetSentBefore, e.run.NetReceivedBefore
	m.mu.Unlock()
	if n != nil {
		s, r := n.Bytes()
		sent, received = sent+s, received+r
	}
	return sent, received
}

// NetworkBytes are run jobID's network bytes so far, while it runs (a
// run that ended has them in its result): for GetRun's usage.
func (m *Manager) NetworkBytes(jobID string) (sent, received int64, err error) {
	m.mu.Lock()
	e, ok := m.runs[jobID]
	m.mu.Unlock()
	if !ok {
		return 0, 0, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	sent, received = m.netBytes(e)
	return sent, received, nil
}
