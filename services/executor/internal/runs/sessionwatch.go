package runs

import (
	"context"
	"path/filepath"
	"time"
)

// ExecEvent is one message of an exec watch: output, or the ended exec.
type ExecEvent struct {
	Exec   *Exec
	Stream string
	Offset int64
	Data   []byte
	Cut    bool
}

// WatchExec sends an exec's output from the given offsets as it comes,
// and once it has ended and all of its output was sent, its record.
func (m *Manager) WatchExec(ctx context.Context, jobID, execID string, stdoutOffset, stderrOffset int64, send func(ExecEvent) error) error {
	if stdoutOffset < 0 || stderrOffset < 0 {
		return invalidf("offsets must not be negative")
	}
	m.mu.Lock()
	e, xe, err := m.lookupExec(jobID, execID)
	m.mu.Unlock()
	if err != nil {
		return err
	}
	dir := m.execDir(jobID, xe.rec.Seq)
	offsets := map[string]int64{"stdout": stdoutOffset, "stderr": stderrOffset}
	cutSent := map[string]bool{}
	for {
		m.mu.Lock()
		rec, changed := xe.rec, e.changed
		m.mu.Unlock()
		for _, s := range []struct {
			name string
			o    *output
			cut  bool
		}{{"stdout", xe.stdout, rec.StdoutTruncated}, {"stderr", xe.stderr, rec.StderrTruncated}} {
			err := sendStream(filepath.Join(dir, s.name+".log"), s.name, s.o, s.cut, offsets, cutSent, func(ev Event) error {
				return send(ExecEvent{Stream: ev.Stream, Offset: ev.Offset, Data: ev.Data, Cut: ev.Cut})
			})
			if err != nil {
				return err
			}
		}
		if rec.State == ExecEnded {
			return send(ExecEvent{Exec: &rec})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// watchIdle ends session e once it has had no exec running for longer than
// its idle timeout, or, when its grant says so, puts it to sleep (sleep.go)
// and watches on, until ctx ends.
func (m *Manager) watchIdle(ctx context.Context, e *entry) {
	m.mu.Lock()
	idle, _, _ := e.session()
	e.lastActive = m.cfg.Now()
	if e.idleChanged == nil {
		e.idleChanged = make(chan struct{})
	}
	changed := e.idleChanged
	m.mu.Unlock()
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
			// An Update may have changed the idle timeout: it counts
			// from the last activity as the new one from now on.
		}
		m.mu.Lock()
		idle, _, _ = e.session()
		changed = e.idleChanged
		if e.run.Suspended || e.suspending || e.filesActive > 0 {
			// Suspended is not idle (the deadline alone bounds it), nor
			// is a session whose files are being read or written.
			e.lastActive = m.cfg.Now()
		}
		left := idle - m.cfg.Now().Sub(e.lastActive)
		if e.runningExecs == 0 && left <= 0 && e.sleepsOnIdle() {
			if e.live != nil && e.stopping == "" {
				m.cfg.Logger.Info("session idle; putting it to sleep", "job_id", e.run.JobID, "idle_timeout", idle)
				m.suspendLocked(e, ReasonIdleTimeout)
			}
			// Asleep is not idle: its idle time counts from its waking.
			e.lastActive = m.cfg.Now()
			m.mu.Unlock()
			t.Reset(idle)
			continue
		}
		if e.runningExecs == 0 && left <= 0 {
			m.cfg.Logger.Info("session idle; ending it", "job_id", e.run.JobID, "idle_timeout", idle)
			m.stopSession(e, ReasonIdleTimeout)
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		if left <= 0 {
			left = idle
		}
		t.Reset(left)
	}
}
