package runs

import (
	"context"
	"slices"

	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Admission is what the manager admits runs against, for the executor's
// heartbeat: its capacity, what of it the runs not yet ended leave free
// (admit's accounting; zero where the capacity bounds nothing), and
// those runs' job ids.
type Admission struct {
	Capacity, Free Capacity
	// Open are the job ids of the runs not yet ended, sorted, at most the
	// limit Admission was asked for; Truncated says there are more.
	Open      []string
	Truncated bool
}

// Admission is a snapshot of the manager's admission accounting, listing
// at most maxOpen job ids.
func (m *Manager) Admission(maxOpen int) Admission {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.cfg.Capacity
	h := m.held(nil)
	free := func(bound, held int64) int64 {
		if bound <= 0 {
			return 0
		}
		return max(bound-held, 0)
	}
	a := Admission{Capacity: c, Free: Capacity{
		MemoryBytes: free(c.MemoryBytes, h.memory), CPUMillis: free(c.CPUMillis, h.cpu), DiskBytes: free(c.DiskBytes, h.disk),
		Jobs: int(free(int64(c.Jobs), int64(h.jobs))),
	}}
	for id, e := range m.runs {
		if !e.run.State.Terminal() {
			a.Open = append(a.Open, id)
		}
	}
	slices.Sort(a.Open)
	if len(a.Open) > maxOpen {
		a.Open, a.Truncated = a.Open[:maxOpen], true
	}
	return a
}

// CancelBecause cancels a run as Cancel does, and its result's message
// says why (a cancel its client asked for says nothing more). A run not
// here is refused as Cancel refuses it.
func (m *Manager) CancelBecause(jobID, why string) (Run, error) {
	m.mu.Lock()
	if e, ok := m.runs[jobID]; ok && !e.run.State.Terminal() && e.cancelWhy == "" {
		e.cancelWhy = why
	}
	m.mu.Unlock()
	return m.Cancel(jobID)
}

// cancelText is the message of a run that ended cancelled: why it was
// cancelled (CancelBecause) before what the run's end says. Callers hold
// m.mu.
func (e *entry) cancelText(reason sandbox.Reason, message string) string {
	if reason != sandbox.ReasonCancelled || e.cancelWhy == "" {
		return message
	}
	if message == "" {
		return e.cancelWhy
	}
	return e.cancelWhy + "; " + message
}

// Fence says whether the executor may start sandboxes: not while the
// authority may have declared it lost and placed its jobs elsewhere
// (package fleetclient).
type Fence interface {
	// Fenced reports whether new sandboxes must wait, and a channel
	// closed when that may have changed.
	Fenced() (bool, <-chan struct{})
}

// waitFence waits until the executor may start e's sandbox (Config.Fence)
// or ctx ends, logging once that it waits. ctx is checked before the
// fence, so a run cancelled before the fence opened never starts.
func (m *Manager) waitFence(ctx context.Context, e *entry) error {
	if m.cfg.Fence == nil {
		return nil
	}
	logged := false
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		fenced, changed := m.cfg.Fence.Fenced()
		if !fenced {
			return nil
		}
		if !logged {
			m.cfg.Logger.Warn("the run waits in staging: the authority has not answered this executor's heartbeat lately, and a fenced executor starts no sandbox", "job_id", e.run.JobID)
			logged = true
		}
		select {
		case <-ctx.Done():
		case <-changed:
		}
	}
}
