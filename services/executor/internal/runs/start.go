package runs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Start verifies sg and starts its run, or returns the existing run for the
// job id (created false). A grant with a bad signature, an unknown key or
// past its expiry is refused even for a known job id. A new run whose
// limits do not fit beside those of the runs not yet ended is refused
// (Config.Capacity).
func (m *Manager) Start(sg *typesv1.SignedGrant) (Run, bool, error) {
	g, err := m.verify(sg)
	if err != nil {
		return Run{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.runs[g.GetJobId()]; ok {
		return e.run, false, nil
	}
	if _, ok := m.unstarted[g.GetJobId()]; ok {
		return Run{}, false, fmt.Errorf("%w: job %s was cancelled before it started", errdefs.ErrFailedPrecondition, g.GetJobId())
	}
	class := sandbox.Class(classOf(g.GetRuntimeClass()))
	if st, ok := m.cfg.Sandbox.Available(class); !ok {
		return Run{}, false, fmt.Errorf("%w: runtime_class %s is not available on this executor: %s", errdefs.ErrFailedPrecondition, class, st.Reason)
	}
	if _, err := m.policyOf(g.GetNetworkPolicy()); err != nil {
		return Run{}, false, err
	}
	// The first policy is generation 1 (the authority's first grant says
	// so); without one, a later change could not be told from it. A
	// generation of 0 is taken as 1, as the authority does.
	if gen := g.GetNetworkPolicyGeneration(); gen < 1 {
		return Run{}, false, fmt.Errorf("%w: grant network_policy_generation %d: must be at least 1", errdefs.ErrInvalidArgument, gen)
	}
	if gen := g.GetGeneration(); gen < 0 {
		return Run{}, false, fmt.Errorf("%w: grant generation %d: must not be negative", errdefs.ErrInvalidArgument, gen)
	}
	if err := m.cfg.Capacity.admit(m.held(nil), limitsOf(g.GetLimits())); err != nil {
		return Run{}, false, err
	}
	raw, err := proto.Marshal(sg)
	if err != nil {
		return Run{}, false, err
	}
	if err := os.MkdirAll(m.runDir(g.GetJobId()), 0o700); err != nil {
		return Run{}, false, err
	}
	e := &entry{
		run:     Run{JobID: g.GetJobId(), State: Staging, SignedGrant: raw, CreatedAt: m.cfg.Now()},
		grant:   g,
		changed: make(chan struct{}),
	}
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

// verify checks sg's signature, format and expiry and returns its grant.
func (m *Manager) verify(sg *typesv1.SignedGrant) (*typesv1.Grant, error) {
	g, err := m.cfg.Verifier.Verify(sg, m.cfg.Now())
	if err != nil {
		// The verifier's errors begin "grant: ".
		switch {
		case errors.Is(err, grant.ErrExpired):
			return nil, fmt.Errorf("%w: %v", errdefs.ErrFailedPrecondition, err)
		default:
			return nil, fmt.Errorf("%w: %v", errdefs.ErrPermissionDenied, err)
		}
	}
	if !jobIDFormat.MatchString(g.GetJobId()) {
		return nil, fmt.Errorf("%w: grant job_id %q: want 1-64 of [A-Za-z0-9_-]", errdefs.ErrInvalidArgument, g.GetJobId())
	}
	return g, nil
}

func classOf(c typesv1.RuntimeClass) string {
	if c == typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC {
		return string(sandbox.ClassRunsc)
	}
	return string(sandbox.ClassRunc)
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
