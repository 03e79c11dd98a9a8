package runs

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/airlockhq/airlock/pkg/errdefs"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// changeable are the Grant fields a newer grant of a running job may
// change. Every other field, including any added later, must stay as it
// was: a grant cannot make a job run something else, somewhere else, for
// someone else.
var changeable = map[protoreflect.Name]bool{
	"limits":                    true,
	"network_policy":            true,
	"network_policy_generation": true,
	"generation":                true,
	"issued_at":                 true,
	"expires_at":                true,

	// A session's idle timeout and concurrent execs; a job cannot become
	// a session nor a session a job (checked in Update).
	"session": true,
}

// Update puts a newer grant of a staging or running job in force: its
// limits on the live sandbox and its network policy in the job's
// namespace, and only once both are in force does the run's grant become
// sg. A run still staging takes the new grant's limits and policy when its
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
// sg must verify like a grant to Start, have a higher generation than the
// grant in force, and differ from it only in limits, network policy and
// their generations and times. Raised memory or CPU must fit beside the
// other runs (Config.Capacity); lowered limits always do.
func (m *Manager) Update(ctx context.Context, sg *typesv1.SignedGrant) (Run, error) {
	g, err := m.verify(sg)
	if err != nil {
		return Run{}, err
	}
	id := g.GetJobId()
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
	curSG, err := run.Grant()
	if err != nil {
		return Run{}, fmt.Errorf("run %s: stored grant: %w", id, err)
	}
	if bytes.Equal(curSG.GetBody(), sg.GetBody()) {
		return run, nil
	}
	if run.State.Terminal() {
		return Run{}, fmt.Errorf("%w: job %s has ended (%s)", errdefs.ErrFailedPrecondition, id, run.State)
	}
	// The stored body verified when it was accepted.
	cur := &typesv1.Grant{}
	if err := proto.Unmarshal(curSG.GetBody(), cur); err != nil {
		return Run{}, fmt.Errorf("run %s: stored grant: %w", id, err)
	}
	// A grant without a generation is generation 1, as the authority
	// takes it.
	if max(g.GetGeneration(), 1) <= max(cur.GetGeneration(), 1) {
		return Run{}, fmt.Errorf("%w: grant generation %d: job %s runs under generation %d; only a higher one applies",
			errdefs.ErrFailedPrecondition, g.GetGeneration(), id, cur.GetGeneration())
	}
	if f := fixedFieldChanged(cur, g); f != "" {
		return Run{}, fmt.Errorf("%w: grant field %s differs from the grant job %s runs under; only limits, network policy and a session's settings may change",
			errdefs.ErrPermissionDenied, f, id)
	}
	if err := checkSessionChange(cur.GetSession(), g.GetSession()); err != nil {
		return Run{}, fmt.Errorf("job %s: %w", id, err)
	}
	lim := limitsOf(g.GetLimits())
	if lim.DiskBytes != cur.GetLimits().GetDiskBytes() {
		// Refused in staging too, so the answer does not depend on how far
		// the job has got.
		return Run{}, fmt.Errorf("%w: limits.disk_bytes %d: cannot change on a running job: the scratch filesystem is sized when the sandbox is made",
			errdefs.ErrInvalidArgument, lim.DiskBytes)
	}
	if err := sandbox.CheckLimits(sandbox.Class(classOf(g.GetRuntimeClass())), lim); err != nil {
		return Run{}, err
	}
	policy, err := m.policyOf(g.GetNetworkPolicy())
	if err != nil {
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
	err = m.cfg.Capacity.refit(m.held(e), limitsOf(cur.GetLimits()), lim)
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

	netGen := g.GetNetworkPolicyGeneration()
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
		started := jobPolicy{net: netpolicy.Policy{Proxied: e.egress != nil}}
		if err := checkModeChange(started, policy); err != nil {
			return Run{}, netErr(err)
		}
		if err := e.net.CanApply(policy.net, netGen); err != nil {
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
						g.GetGeneration(), err, rerr))
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
	raw, err := proto.Marshal(sg)
	if err != nil {
		return Run{}, err
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
	e.grant = g
	e.run.SignedGrant = raw
	if netChanged && e.net != nil {
		e.run.NetworkUpdatedAt = m.cfg.Now()
	}
	// Only the in-memory record must be right: a crash fails every run
	// that was in flight (Recover) whatever its record says.
	if err := m.persist(&e.run); err != nil {
		m.cfg.Logger.Error("persist run", "job_id", id, "error", err)
	}
	e.notify()
	m.cfg.Logger.Info("grant updated", "job_id", id, "generation", g.GetGeneration(),
		"network_policy_generation", g.GetNetworkPolicyGeneration(), "network_changed", netChanged)
	return e.run, nil
}

// checkSessionChange refuses a grant that would make a job a session or a
// session a job, or that gives a session settings no session could have.
// Lowering max_concurrent_execs stops no exec: StartExec refuses new ones
// until fewer run.
func checkSessionChange(cur, next *typesv1.SessionSpec) error {
	switch {
	case (cur == nil) != (next == nil):
		return fmt.Errorf("%w: grant field session: a job cannot become a session, nor a session a job", errdefs.ErrPermissionDenied)
	case next == nil:
		return nil
	case next.GetIdleTimeout() != nil && (next.GetIdleTimeout().CheckValid() != nil || next.GetIdleTimeout().AsDuration() < 0):
		return fmt.Errorf("%w: session.idle_timeout: not a duration of zero or more", errdefs.ErrInvalidArgument)
	case next.GetMaxConcurrentExecs() < 0:
		return fmt.Errorf("%w: session.max_concurrent_execs %d: must not be negative", errdefs.ErrInvalidArgument, next.GetMaxConcurrentExecs())
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

// fixedFieldChanged names the first field other than the changeable ones in
// which a and b differ, unknown fields included, or returns "".
func fixedFieldChanged(a, b *typesv1.Grant) string {
	ma, mb := a.ProtoReflect(), b.ProtoReflect()
	fields := ma.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if changeable[fd.Name()] {
			continue
		}
		if ma.Has(fd) != mb.Has(fd) || !ma.Get(fd).Equal(mb.Get(fd)) {
			return string(fd.Name())
		}
	}
	if !bytes.Equal(ma.GetUnknown(), mb.GetUnknown()) {
		return "(unknown fields)"
	}
	return ""
}

// networkChange reports whether next changes cur's network policy; a
// change needs a higher network_policy_generation, and the generation
// never goes down.
func networkChange(cur, next *typesv1.Grant) (bool, error) {
	cg, ng := cur.GetNetworkPolicyGeneration(), next.GetNetworkPolicyGeneration()
	switch {
	case ng < cg:
		return false, fmt.Errorf("%w: network_policy_generation %d: the job's policy is at generation %d",
			errdefs.ErrFailedPrecondition, ng, cg)
	case ng == cg && !proto.Equal(cur.GetNetworkPolicy(), next.GetNetworkPolicy()):
		return false, fmt.Errorf("%w: network_policy changed without a higher network_policy_generation (still %d)",
			errdefs.ErrFailedPrecondition, ng)
	}
	return ng > cg, nil
}
