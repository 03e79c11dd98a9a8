package runs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Start starts g's run, or returns the existing run for the job id
// (created false). g must have been verified (package convert refuses a
// bad signature, an unknown key or an expired grant even for a known job
// id). A new run whose limits do not fit beside those of the runs not yet
// ended is refused (Config.Capacity).
func (m *Manager) Start(g Grant) (Run, bool, error) { return m.StartContext(context.Background(), g) }

// StartContext is Start whose run's trace spans (making its sandbox, and
// so on) continue ctx's trace: the StartJob call's, and so the
// submission's.
func (m *Manager) StartContext(ctx context.Context, g Grant) (Run, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.runs[g.JobID]; ok {
		return e.run, false, nil
	}
	if _, ok := m.unstarted[g.JobID]; ok {
		m.metrics.runRefused(refusedOther)
		return Run{}, false, fmt.Errorf("%w: job %s was cancelled before it started", errdefs.ErrFailedPrecondition, g.JobID)
	}
	if st, ok := m.cfg.Sandbox.Available(g.Class); !ok {
		m.metrics.runRefused(refusedUnavailable)
		return Run{}, false, fmt.Errorf("%w: runtime_class %s is not available on this executor: %s", errdefs.ErrFailedPrecondition, g.Class, st.Reason)
	}
	if err := m.checkCaches(g); err != nil {
		m.metrics.runRefused(refusedOther)
		return Run{}, false, err
	}
	if err := m.checkCredentials(g); err != nil {
		m.metrics.runRefused(refusedOther)
		return Run{}, false, err
	}
	if err := m.checkEnforceable(g.Network); err != nil {
		m.metrics.runRefused(refusedOther)
		return Run{}, false, err
	}
	// The first policy is generation 1 (the authority's first grant says
	// so); without one, a later change could not be told from it. A
	// generation of 0 is taken as 1, as the authority does.
	if gen := g.NetworkGeneration; gen < 1 {
		m.metrics.runRefused(refusedOther)
		return Run{}, false, fmt.Errorf("%w: grant network_policy_generation %d: must be at least 1", errdefs.ErrInvalidArgument, gen)
	}
	if gen := g.Generation; gen < 0 {
		m.metrics.runRefused(refusedOther)
		return Run{}, false, fmt.Errorf("%w: grant generation %d: must not be negative", errdefs.ErrInvalidArgument, gen)
	}
	if err := m.cfg.Capacity.admit(m.held(nil), g.hostLimits()); err != nil {
		m.metrics.runRefused(refusedCapacity)
		return Run{}, false, err
	}
	m.kickShed()
	if err := os.MkdirAll(m.runDir(g.JobID), 0o700); err != nil {
		return Run{}, false, err
	}
	e := &entry{
		run:     Run{JobID: g.JobID, State: Staging, SignedGrant: g.Signed, Grant: g, CreatedAt: m.cfg.Now()},
		changed: make(chan struct{}),
		trace:   trace.SpanContextFromContext(ctx),
	}
	var err error
	notify := func() { m.mu.Lock(); e.notify(); m.mu.Unlock() }
	if e.stdout, err = newOutput(filepath.Join(m.runDir(e.run.JobID), "stdout.log"), m.cfg.OutputLimit, notify); err != nil {
		return Run{}, false, err
	}
	if e.stderr, err = newOutput(filepath.Join(m.runDir(e.run.JobID), "stderr.log"), m.cfg.OutputLimit, notify); err != nil {
		return Run{}, false, err
	}
	if err := m.persist(&e.run); err != nil {
		return Run{}, false, err
	}
	m.runs[e.run.JobID] = e
	m.metrics.runStarted(g)
	m.launch(e)
	return e.run, true, nil
}

// launch runs e in the background until it ends or the executor stops.
// Callers hold m.mu.
func (m *Manager) launch(e *entry) {
	ctx, cancel := context.WithCancel(m.ctx)
	e.cancel = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		m.execute(ctx, e)
	}()
}

// Cancel stops a run. Cancelling an ended run changes nothing.
func (m *Manager) Cancel(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		m.forgetUnstarted()
		m.unstarted[jobID] = m.cfg.Now()
		return Run{}, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); ok {
		m.stopSession(e, sandbox.ReasonCancelled)
	} else if !e.run.State.Terminal() && e.cancel != nil {
		e.cancel()
	}
	return e.run, nil
}

// unstartedKeep is how long a cancel of a job with no run here refuses its
// StartJob, and unstartedMax how many such jobs are remembered: the race
// it closes lasts one StartJob attempt, so both are generous.
const (
	unstartedKeep = time.Hour
	unstartedMax  = 1 << 16
)

// forgetUnstarted drops the cancels older than unstartedKeep and, past
// unstartedMax, the oldest. Called with m.mu held.
func (m *Manager) forgetUnstarted() {
	now := m.cfg.Now()
	var oldest string
	for id, at := range m.unstarted {
		if now.Sub(at) > unstartedKeep {
			delete(m.unstarted, id)
		} else if oldest == "" || at.Before(m.unstarted[oldest]) {
			oldest = id
		}
	}
	if len(m.unstarted) >= unstartedMax {
		delete(m.unstarted, oldest)
	}
}
