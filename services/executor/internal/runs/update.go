package runs

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Update puts a newer grant of a staging or running job in force: its
// limits on the live sandbox and its network policy in the job's
// namespace, and only once both are in force does the run's grant become
// g. A run still staging takes the new grant's limits and policy when its
// sandbox is made. On error the grant in force stays and so do its limits
// and policy. Sending the grant in force again returns the run as it is.
//
// The order keeps that promise: what the network step would refuse is
// checked first; then memory, pids and CPU change, then the policy, and
// the deadline last. Should the policy fail and the old limits not come
// back, the stored grant would no longer be what the kernel enforces: the
// job is then stopped (failed, its result saying why) rather than left
// running under limits no grant in force gave it.
//
// g must have been verified like a grant to Start, have a higher
// generation than the grant in force, and differ from it only in limits,
// network policy and their generations and times (its Fixed fields must
// be those of the grant in force: a grant cannot make a job run something
// else, somewhere else, for someone else). Raised memory or CPU must fit beside the
// other runs (Config.Capacity); lowered limits always do.
func (m *Manager) Update(ctx context.Context, g Grant) (Run, error) {
	id := g.JobID
	m.mu.Lock()
	e, ok := m.runs[id]
	m.mu.Unlock()
	if !ok {
		return Run{}, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, id)
	}
	e.updateMu.Lock()
	defer e.updateMu.Unlock()
	m.mu.Lock()
	run := e.run
	m.mu.Unlock()
	cur := run.Grant
	if cur.Digest == g.Digest {
		return run, nil
	}
	if run.State.Terminal() {
		return Run{}, fmt.Errorf("%w: job %s has ended (%s)", errdefs.ErrFailedPrecondition, id, run.State)
	}
	// A grant without a generation is generation 1, as the authority
	// takes it.
	if max(g.Generation, 1) <= max(cur.Generation, 1) {
		return Run{}, fmt.Errorf("%w: grant generation %d: job %s runs under generation %d; only a higher one applies",
			errdefs.ErrFailedPrecondition, g.Generation, id, cur.Generation)
	}
	if f := fixedFieldChanged(cur, g); f != "" {
		return Run{}, fmt.Errorf("%w: grant field %s differs from the grant job %s runs under; only limits, network policy and a session's settings may change",
			errdefs.ErrPermissionDenied, f, id)
	}
	if err := checkSessionChange(cur.Session, g.Session); err != nil {
		return Run{}, fmt.Errorf("job %s: %w", id, err)
	}
	lim := g.Limits
	if lim.DiskBytes != cur.Limits.DiskBytes {
		// Refused in staging too, so the answer does not depend on how far
		// the job has got.
		return Run{}, fmt.Errorf("%w: limits.disk_bytes %d: cannot change on a running job: the scratch filesystem is sized when the sandbox is made",
			errdefs.ErrInvalidArgument, lim.DiskBytes)
	}
	if err := sandbox.CheckLimits(g.Class, lim); err != nil {
		return Run{}, err
	}
	policy := g.Network
	if err := m.checkEnforceable(policy); err != nil {
		return Run{}, err
	}
	netChanged, err := networkChange(cur, g)
	if err != nil {
		return Run{}, err
	}
	// Raised limits must fit beside the other runs. The run holds both
	// its limits from before they reach the kernel until the grant in
	// force is the new one or the update failed, so no Start or other
	// Update takes what this one may put in force meanwhile.
	m.mu.Lock()
	err = m.cfg.Capacity.refit(m.held(e), cur.Limits, lim)
	if err == nil {
		e.raising = &lim
	}
	m.mu.Unlock()
	if err != nil {
		return Run{}, err
	}
	defer func() {
		m.mu.Lock()
		e.raising = nil
		m.mu.Unlock()
	}()

	netGen := g.NetworkGeneration
	netErr := func(err error) error {
		if errors.Is(err, netpolicy.ErrUnavailable) {
			err = fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
		}
		return fmt.Errorf("job %s: network policy generation %d: %w", id, netGen, err)
	}
	// What the network step would refuse is refused before anything
	// changes (runsc's deny-all cannot be widened, the namespace is gone):
	// a shortened deadline must not end the job for an update that fails.
	if netChanged && e.net != nil {
		started := NetworkPolicy{Net: netpolicy.Policy{Proxied: e.egress != nil}}
		if err := checkModeChange(started, policy); err != nil {
			return Run{}, netErr(err)
		}
		if err := e.net.CanApply(policy.Net, netGen); err != nil {
			return Run{}, netErr(err)
		}
	}
	if e.sb != nil {
		old := e.sb.Limits()
		// Memory, pids and CPU first; the deadline last, once nothing
		// else can fail, since a shorter one can end the job at once.
		early := lim
		early.Deadline = old.Deadline
		if err := e.sb.UpdateLimits(early); err != nil {
			return Run{}, m.limitsErr(id, err)
		}
		if netChanged && e.net != nil {
			if err := m.applyNetwork(ctx, e, policy, netGen); err != nil {
				if rerr := e.sb.UpdateLimits(old); rerr != nil && !errors.Is(rerr, sandbox.ErrEnded) {
					// The job would run under limits no grant in force
					// gave it (say a raised memory limit it now uses):
					// it is stopped instead, and its result says why.
					m.abort(e, fmt.Sprintf("grant generation %d failed (%v) and the limits of the grant in force could not be restored (%v); the job was stopped rather than run under limits no grant in force gave it",
						g.Generation, err, rerr))
					return Run{}, fmt.Errorf("job %s: network policy generation %d: %v; restoring the limits in force failed too (%v): the job was stopped", id, netGen, err, rerr)
				}
				return Run{}, netErr(err)
			}
		}
		if lim.Deadline != old.Deadline {
			// The other limits passed above, so only a job that ended
			// meanwhile refuses: it ran under the grant in force, which
			// stays its grant.
			if err := e.sb.UpdateLimits(lim); err != nil {
				return Run{}, m.limitsErr(id, err)
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// execute may have recorded the end meanwhile (it does so before it
	// takes updateMu to tear down): an ended run keeps the grant it ran
	// under.
	if e.run.State.Terminal() {
		return Run{}, fmt.Errorf("%w: job %s has ended (%s)", errdefs.ErrFailedPrecondition, id, e.run.State)
	}
	// From here StartExec bounds concurrent execs by the new grant, and
	// the idle watcher, woken by notify, times idleness by it.
	e.run.Grant = g
	e.run.SignedGrant = g.Signed
	if e.idleChanged != nil {
		close(e.idleChanged)
		e.idleChanged = make(chan struct{})
	}
	if netChanged && e.net != nil {
		e.run.NetworkUpdatedAt = m.cfg.Now()
	}
	// Only the in-memory record must be right: a crash fails every run
	// that was in flight (Recover) whatever its record says.
	if err := m.persist(&e.run); err != nil {
		m.cfg.Logger.Error("persist run", "job_id", id, "error", err)
	}
	e.notify()
	m.cfg.Logger.Info("grant updated", "job_id", id, "generation", g.Generation,
		"network_policy_generation", g.NetworkGeneration, "network_changed", netChanged)
	return e.run, nil
}

// checkSessionChange refuses a grant that would make a job a session or a
// session a job, or that gives a session settings no session could have.
// Lowering max_concurrent_execs stops no exec: StartExec refuses new ones
// until fewer run.
func checkSessionChange(cur, next *SessionSpec) error {
	switch {
	case (cur == nil) != (next == nil):
		return fmt.Errorf("%w: grant field session: a job cannot become a session, nor a session a job", errdefs.ErrPermissionDenied)
	case next == nil:
		return nil
	case next.IdleTimeout < 0:
		return fmt.Errorf("%w: session.idle_timeout %s: must not be negative", errdefs.ErrInvalidArgument, next.IdleTimeout)
	case next.MaxConcurrentExecs < 0:
		return fmt.Errorf("%w: session.max_concurrent_execs %d: must not be negative", errdefs.ErrInvalidArgument, next.MaxConcurrentExecs)
	}
	return nil
}

// limitsErr is the error of a refused limits change of job id.
func (m *Manager) limitsErr(id string, err error) error {
	if errors.Is(err, sandbox.ErrEnded) {
		return fmt.Errorf("%w: job %s has ended", errdefs.ErrFailedPrecondition, id)
	}
	return fmt.Errorf("job %s: %w", id, err)
}

// abort stops e's job because the executor can no longer enforce the
// grant in force; the run ends failed with why.
func (m *Manager) abort(e *entry, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg.Logger.Error("stopping a job whose grant cannot be enforced", "job_id", e.run.JobID, "reason", why)
	if e.abort == "" {
		e.abort = why
	}
	if e.cancel != nil {
		e.cancel()
	}
}

// networkChange reports whether next changes cur's network policy; a
// change needs a higher network_policy_generation, and the generation
// never goes down.
func networkChange(cur, next Grant) (bool, error) {
	cg, ng := cur.NetworkGeneration, next.NetworkGeneration
	switch {
	case ng < cg:
		return false, fmt.Errorf("%w: network_policy_generation %d: the job's policy is at generation %d",
			errdefs.ErrFailedPrecondition, ng, cg)
	case ng == cg && !cur.Network.equal(next.Network):
		return false, fmt.Errorf("%w: network_policy changed without a higher network_policy_generation (still %d)",
			errdefs.ErrFailedPrecondition, ng)
	}
	return ng > cg, nil
}
