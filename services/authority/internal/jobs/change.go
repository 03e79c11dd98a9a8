package jobs

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Changes to a running job. A grant is never widened in place: a change is
// a new authority decision that signs a new grant with the next generation.
// Narrowing (every limit no higher, every destination already allowed)
// applies at once; widening follows the tenant's approvals.widening policy:
// a change approval that approvers decide like any other (never the
// requester), applied by the authority when it is approved; applied at
// once; or refused. Either way the new grant is stored as pending, in one
// transaction with its audit entry (and, for an approved change, with the
// consumption of its approval), then handed to the executor, and the job's
// network state reads applied only once the executor says the grant is in
// force.

// ChangeRequest asks to change a running job. Nil parts stay as they are.
type ChangeRequest struct {
	JobID string
	// Limits: zero fields keep their current value.
	Limits *policy.Limits
	// Network replaces the whole policy.
	Network *Network
	// Session, for a session: zero fields keep their current value.
	Session *Session
}

// Change is a change to one job, as an approval records it: the whole
// limits and network policy before and after, and what widens.
type Change struct {
	// BaseGeneration is the grant generation the change was asked
	// against; it applies only while the job still runs under it.
	BaseGeneration int64         `json:"base_generation"`
	FromLimits     policy.Limits `json:"from_limits"`
	ToLimits       policy.Limits `json:"to_limits"`
	FromNetwork    Network       `json:"from_network"`
	ToNetwork      Network       `json:"to_network"`
	// FromSession and ToSession are a session's idle timeout and
	// concurrent execs before and after; nil for a job.
	FromSession *Session `json:"from_session,omitempty"`
	ToSession   *Session `json:"to_session,omitempty"`
	// Widens says what widens, one line each; empty for a narrowing.
	Widens []string `json:"widens,omitempty"`
}

// Encode returns the change's stored form and its digest, which an
// approver's decision must name.
func (c Change) Encode() (wire []byte, digest string, err error) { return encodeDigested(c) }

// encodeDigested serializes what an approval is about (a change, a start)
// as the approval stores it, with the digest a decision must name.
func encodeDigested(v any) (wire []byte, digest string, err error) {
	wire, err = json.Marshal(v)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(wire)
	return wire, "sha256:" + hex.EncodeToString(sum[:]), nil
}

// DecodeChange reads a change an approval recorded.
func DecodeChange(wire []byte) (Change, error) {
	var c Change
	if err := json.Unmarshal(wire, &c); err != nil {
		return Change{}, fmt.Errorf("jobs: stored change: %w", err)
	}
	return c, nil
}

// ChangeResult is what became of a change request.
type ChangeResult struct {
	// Job is the job afterwards.
	Job store.Job
	// Change is what was asked, against the grant in force.
	Change Change
	// ApprovalID is set when the change waits for an approval.
	ApprovalID string
}

// changeable reports whether a job in state st can still change.
func changeable(st store.State) bool { return st == store.StateStaging || st == store.StateRunning }

// RequestChange decides a change of a running job for caller, one of the
// job's tenant's clients, and applies it or opens its approval.
func (s *Service) RequestChange(ctx context.Context, caller identity.ID, req ChangeRequest) (ChangeResult, error) {
	res, err := s.requestChange(ctx, caller, req)
	if err != nil && changeRefusal(err) {
		if aerr := s.audit(ctx, audit.Event{Kind: audit.KindJobChangeRefused, Caller: caller.String(), Subject: req.JobID,
			JobID: res.Job.ID, Tenant: res.Job.Tenant, Outcome: audit.OutcomeDenied, Reason: err.Error()}); aerr != nil {
			return ChangeResult{}, aerr
		}
	}
	return res, err
}

// changeRefusal reports whether err refuses a change (as opposed to an
// internal failure).
func changeRefusal(err error) bool {
	for _, e := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *Service) requestChange(ctx context.Context, caller identity.ID, req ChangeRequest) (ChangeResult, error) {
	if req.Limits == nil && req.Network == nil && req.Session == nil {
		return ChangeResult{}, invalid("change", "name the limits, the network policy or the session settings to change")
	}
	j, err := s.visible(ctx, caller, req.JobID)
	if err != nil {
		return ChangeResult{}, err
	}
	res := ChangeResult{Job: j}
	t := s.cfg.Tenants[j.Tenant]
	if !changeable(j.State) {
		return res, fmt.Errorf("%w: job %s is %s; only a staging or running job can change", errdefs.ErrFailedPrecondition, j.ID, j.State)
	}
	cur, err := s.grantOf(j)
	if err != nil {
		return res, err
	}
	ch, err := planChange(t, cur, req)
	if err != nil {
		return res, err
	}
	if err := s.changeWithinQuota(t, j.ID, ch); err != nil {
		return res, err
	}
	res.Change = ch
	if len(ch.Widens) > 0 {
		switch t.Approvals.Widening {
		case policy.WidenDeny:
			return res, fmt.Errorf("%w: tenant %q's policy refuses widening a running job (%s); cancel and resubmit it",
				errdefs.ErrPermissionDenied, t.Name, strings.Join(ch.Widens, "; "))
		case policy.WidenAllow:
		default:
			a, err := s.openChange(ctx, caller, j, t, ch)
			if err != nil {
				return res, err
			}
			res.ApprovalID = a.ID
			return res, nil
		}
	}
	reason := "narrowing: " + describe(ch)
	if len(ch.Widens) > 0 {
		reason = "widening allowed by the tenant's policy: " + describe(ch)
	}
	j, err = s.applyChange(ctx, caller, cur, ch, reason, nil)
	res.Job = j
	return res, err
}

// changeWithinQuota refuses a change that would take the tenant's running
// jobs together past its quota of memory or CPU.
func (s *Service) changeWithinQuota(t *policy.Tenant, id string, ch Change) error {
	q := t.Quota
	if ch.ToLimits.MemoryBytes <= ch.FromLimits.MemoryBytes && ch.ToLimits.CPUMillis <= ch.FromLimits.CPUMillis {
		return nil
	}
	n, others := s.gate.holdingOf(t.Name, id)
	switch {
	case q.MemoryBytes > 0 && others.memory+ch.ToLimits.MemoryBytes > q.MemoryBytes:
		return fmt.Errorf("%w: limits.memory_bytes: %s would take tenant %s past its quota.memory of %s (its %d other jobs hold %s)",
			errdefs.ErrResourceExhausted, bytesText(ch.ToLimits.MemoryBytes), t.Name, bytesText(q.MemoryBytes), n, bytesText(others.memory))
	case q.CPUMillis > 0 && others.cpu+ch.ToLimits.CPUMillis > q.CPUMillis:
		return fmt.Errorf("%w: limits.cpu_millis: %d would take tenant %s past its quota.cpu_millis of %d (its %d other jobs hold %d)",
			errdefs.ErrResourceExhausted, ch.ToLimits.CPUMillis, t.Name, q.CPUMillis, n, others.cpu)
	}
	return nil
}

// planChange checks the new limits and policy against the tenant and works
// out what widens.
func planChange(t *policy.Tenant, cur GrantRequest, req ChangeRequest) (Change, error) {
	ch := Change{BaseGeneration: cur.Generation, FromLimits: cur.Limits, ToLimits: cur.Limits, FromNetwork: cur.Network, ToNetwork: cur.Network}
	if cur.Session != nil {
		from, to := *cur.Session, *cur.Session
		ch.FromSession, ch.ToSession = &from, &to
	}
	if req.Session != nil {
		if cur.Session == nil {
			return ch, fmt.Errorf("%w: session: job %s is not a session; it has no idle timeout or execs", errdefs.ErrFailedPrecondition, cur.JobID)
		}
		to, err := effectiveSession("session", *req.Session, *cur.Session, t.Sessions)
		if err != nil {
			return ch, err
		}
		ch.ToSession = &to
	}
	if l := req.Limits; l != nil {
		if l.DiskBytes != 0 && l.DiskBytes != cur.Limits.DiskBytes {
			return ch, invalid("limits.disk_bytes", "cannot change on a running job: its scratch filesystem is sized when the sandbox is made")
		}
		to, err := effectiveLimits("limits", *l, cur.Limits, t.Max)
		if err != nil {
			return ch, err
		}
		if err := runnable("limits", cur.RuntimeClass, cur.With, to); err != nil {
			return ch, err
		}
		// gVisor holds a job's tasks to the RLIMIT_NPROC it started with;
		// a VM's RAM and its guest's pids limit are set when it boots.
		switch {
		case cur.RuntimeClass == policy.RuntimeRunsc && to.Pids != cur.Limits.Pids:
			return ch, invalid("limits.pids", "cannot change on a running runsc job: gVisor keeps the task limit the job started with")
		case cur.RuntimeClass == policy.RuntimeVM && to.Pids != cur.Limits.Pids:
			return ch, invalid("limits.pids", "cannot change on a running vm job: its guest keeps the pids limit it booted with")
		case cur.RuntimeClass == policy.RuntimeVM && to.MemoryBytes != cur.Limits.MemoryBytes:
			return ch, invalid("limits.memory_bytes", "cannot change on a running vm job: it is the guest's RAM, fixed when the VM boots")
		}
		if err := withinQuota("limits", t, to); err != nil {
			return ch, err
		}
		ch.ToLimits = to
	}
	if n := req.Network; n != nil {
		to, err := checkNetwork(t, "policy", *n)
		if err != nil {
			return ch, err
		}
		// A domains job's proxy variables and resolver are set when it
		// starts: it may move between domains and deny_all only, and a job
		// that started otherwise has no egress proxy to move to. (A job at
		// deny_all after a change may have started either way: the
		// executor, which knows, refuses what it cannot follow.)
		switch {
		case to.Mode == NetworkDomains && cur.Network.Mode == NetworkAllow,
			to.Mode == NetworkDomains && cur.Network.Mode == NetworkDenyAll && cur.NetworkGeneration <= 1:
			return ch, fmt.Errorf("%w: policy.domains: the job did not start with a domains policy, so it has no egress proxy or DNS server; submit a job with domains to use names", errdefs.ErrFailedPrecondition)
		case to.Mode == NetworkAllow && cur.Network.Mode == NetworkDomains:
			return ch, fmt.Errorf("%w: policy.allow: the job started with a domains policy; while it runs it can change to other domains or to deny_all only", errdefs.ErrFailedPrecondition)
		}
		// gVisor and a VM read the sandbox's interfaces once, at start: a
		// job of such a class that started without any can never get one.
		if runspec.FixedInterfaces(cur.RuntimeClass) && cur.Network.Mode != NetworkAllow && to.Mode == NetworkAllow {
			return ch, fmt.Errorf("%w: policy: a %s job started deny_all cannot be given network access while it runs; resubmit it with an allow policy (narrower ones can then apply while it runs)",
				errdefs.ErrFailedPrecondition, cur.RuntimeClass)
		}
		ch.ToNetwork = to
	}
	if ch.ToLimits == ch.FromLimits && sameNetwork(ch.FromNetwork, ch.ToNetwork) && sameSession(ch.FromSession, ch.ToSession) {
		return ch, invalid("change", "the job already runs under exactly these limits, network policy and session settings")
	}
	ch.Widens = widens(ch)
	return ch, nil
}

// limitStep is one limit before and after a change.
type limitStep struct {
	name     string
	from, to int64
	format   func(int64) string
}

// limitSteps lists the changeable limits of c, before and after (the disk
// limit never changes on a running job), and a session's settings, which
// widen and narrow as limits do.
func limitSteps(c Change) []limitStep {
	f, to := c.FromLimits, c.ToLimits
	steps := []limitStep{
		{"cpu_millis", f.CPUMillis, to.CPUMillis, plain},
		{"memory_bytes", f.MemoryBytes, to.MemoryBytes, bytesText},
		{"pids", f.Pids, to.Pids, plain},
		{"deadline", int64(f.Deadline), int64(to.Deadline), durationText},
	}
	if fs, ts := c.FromSession, c.ToSession; fs != nil && ts != nil {
		steps = append(steps,
			limitStep{"session.idle_timeout", int64(fs.IdleTimeout), int64(ts.IdleTimeout), durationText},
			limitStep{"session.max_concurrent_execs", int64(fs.MaxConcurrentExecs), int64(ts.MaxConcurrentExecs), plain})
	}
	return steps
}

// sameSession reports whether a and b are the same session settings (or
// both no session).
func sameSession(a, b *Session) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// widens lists what the change widens.
func widens(c Change) []string {
	var out []string
	for _, x := range limitSteps(c) {
		if x.to > x.from {
			out = append(out, fmt.Sprintf("%s: %s -> %s", x.name, x.format(x.from), x.format(x.to)))
		}
	}
	for _, r := range uncovered(c.FromNetwork, c.ToNetwork) {
		out = append(out, "network_policy: "+r)
	}
	return out
}

// uncovered lists the destinations to permits that from does not
// (pkg/egress decides).
func uncovered(from, to Network) []string {
	return from.egress().Covers(to.egress())
}

// egress is n in pkg/egress's terms; deny-all and unset permit nothing.
// A rule that does not parse is left out of what a policy permits, and
// stands, unparsable, for what it asks: never covered.
func (n Network) egress() egress.Policy {
	var p egress.Policy
	switch n.Mode {
	case NetworkAllow:
		for _, r := range n.Rules {
			// Masked: whether a rule is well formed is checkNetwork's to say.
			pfx, _ := netip.ParsePrefix(r.CIDR)
			ports, _ := egress.Ports(r.Ports)
			p.Rules = append(p.Rules, egress.Rule{Prefix: pfx.Masked(), Ports: ports})
		}
	case NetworkDomains:
		ports, _ := egress.Ports(n.DomainPorts)
		for _, d := range n.Domains {
			p.Names = append(p.Names, egress.Name{Name: d, Ports: ports})
		}
	}
	return p
}

func ruleText(r AllowRule) string {
	if len(r.Ports) == 0 {
		return r.CIDR + " (all ports)"
	}
	return fmt.Sprintf("%s ports %v", r.CIDR, r.Ports)
}

func sameNetwork(a, b Network) bool {
	norm := func(m NetworkMode) NetworkMode {
		if m == NetworkUnset {
			return NetworkDenyAll
		}
		return m
	}
	if norm(a.Mode) != norm(b.Mode) || len(a.Rules) != len(b.Rules) || !slices.Equal(a.Domains, b.Domains) || !slices.Equal(a.DomainPorts, b.DomainPorts) {
		return false
	}
	for i := range a.Rules {
		if a.Rules[i].CIDR != b.Rules[i].CIDR || !slices.Equal(a.Rules[i].Ports, b.Rules[i].Ports) {
			return false
		}
	}
	return true
}

// describe says what a change does, for the audit log.
func describe(c Change) string {
	var parts []string
	for _, x := range limitSteps(c) {
		if x.to != x.from {
			parts = append(parts, fmt.Sprintf("%s %s -> %s", x.name, x.format(x.from), x.format(x.to)))
		}
	}
	if fs, ts := c.FromSession, c.ToSession; fs != nil && ts != nil && fs.OnIdle != ts.OnIdle {
		parts = append(parts, fmt.Sprintf("session.on_idle %s -> %s", cmp.Or(fs.OnIdle, "default"), cmp.Or(ts.OnIdle, "default")))
	}
	if !sameNetwork(c.FromNetwork, c.ToNetwork) {
		parts = append(parts, fmt.Sprintf("network_policy %s -> %s", networkText(c.FromNetwork), networkText(c.ToNetwork)))
	}
	return strings.Join(parts, "; ")
}

func networkText(n Network) string {
	switch n.Mode {
	case NetworkAllow:
		s := "allow ["
		for i, r := range n.Rules {
			if i > 0 {
				s += ", "
			}
			s += ruleText(r)
		}
		return s + "]"
	case NetworkDomains:
		return fmt.Sprintf("domains %v", n.Domains)
	}
	return "deny_all"
}

// openChange records the change approval.
func (s *Service) openChange(ctx context.Context, caller identity.ID, j store.Job, t *policy.Tenant, ch Change) (store.Approval, error) {
	wire, digest, err := ch.Encode()
	if err != nil {
		return store.Approval{}, err
	}
	now := s.now()
	a := store.Approval{
		ID: newID(), Kind: store.KindChange, JobID: j.ID, Tenant: j.Tenant, Requester: caller.String(),
		BundleDigest: digest, Change: wire, State: store.ApprovalPending, Required: t.Approvals.Required,
		CreatedAt: now, ExpiresAt: now.Add(t.Approvals.TTL),
	}
	a, _, err = s.cfg.Store.CreateApprovalAudited(ctx, a, audit.Event{
		Kind: audit.KindApprovalOpened, Caller: caller.String(), Subject: a.ID, Time: now, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("change of job %s needs %d approval(s): %s", j.ID, a.Required, strings.Join(ch.Widens, "; ")),
	})
	if err != nil {
		return store.Approval{}, err
	}
	s.cfg.Logger.InfoContext(ctx, "change approval opened", "job", j.ID, "approval", a.ID, "widens", ch.Widens)
	return a, nil
}

// ApplyApproved applies change approval id once approvers approved it:
// the approval is spent and the job's new grant stored in one
// transaction, then handed to the executor. by is who cast the deciding
// vote, for the log.
func (s *Service) ApplyApproved(ctx context.Context, by identity.ID, id string) (store.Job, error) {
	a, err := s.cfg.Store.GetApproval(ctx, id)
	if err != nil {
		return store.Job{}, err
	}
	if a.Kind != store.KindChange || a.State != store.ApprovalApproved {
		return store.Job{}, fmt.Errorf("%w: approval %s is not an approved change", errdefs.ErrFailedPrecondition, id)
	}
	ch, err := DecodeChange(a.Change)
	if err != nil {
		return store.Job{}, err
	}
	j, err := s.cfg.Store.GetJob(ctx, a.JobID)
	if err != nil {
		return store.Job{}, err
	}
	cur, err := s.grantOf(j)
	if err != nil {
		return store.Job{}, err
	}
	consume := &store.ConsumeRequest{
		Kind: store.KindChange, ID: a.ID, JobID: a.JobID, BundleDigest: a.BundleDigest,
		By: identity.Service(by.TrustDomain, identity.ServiceAuthority).String(), At: s.now(),
	}
	reason := fmt.Sprintf("widening approved (approval %s): %s", a.ID, describe(ch))
	j, err = s.applyChange(ctx, by, cur, ch, reason, consume)
	if err != nil && changeRefusal(err) {
		// The approval stays unspent; the log says why it did not apply.
		if aerr := s.audit(ctx, audit.Event{Kind: audit.KindJobChangeRefused, Caller: by.String(), Subject: a.JobID,
			JobID: a.JobID, Tenant: a.Tenant, Outcome: audit.OutcomeDenied, Reason: fmt.Sprintf("approval %s: %v", a.ID, err)}); aerr != nil {
			return store.Job{}, aerr
		}
	}
	return j, err
}

// applyChange signs the next grant, stores it as pending with its audit
// entry (spending consume in the same transaction when it is set), and
// hands it to the executor.
func (s *Service) applyChange(ctx context.Context, caller identity.ID, cur GrantRequest, ch Change, reason string, consume *store.ConsumeRequest) (store.Job, error) {
	// Checked again as it applies: another change may have raised the
	// tenant's total since this one was asked.
	if t := s.cfg.Tenants[cur.Tenant]; t != nil {
		if err := s.changeWithinQuota(t, cur.JobID, ch); err != nil {
			return store.Job{}, err
		}
	}
	now := s.now()
	next := cur
	next.Limits, next.Network = ch.ToLimits, ch.ToNetwork
	if ch.ToSession != nil && cur.Session != nil {
		to := *ch.ToSession
		next.Session = &to
	}
	next.Generation = cur.Generation + 1
	if !sameNetwork(ch.FromNetwork, ch.ToNetwork) {
		next.NetworkGeneration = cur.NetworkGeneration + 1
	}
	next.IssuedAt, next.ExpiresAt = now, now.Add(s.cfg.GrantTTL)
	sg, err := s.cfg.Signer.Sign(next)
	if err != nil {
		return store.Job{}, err
	}
	update := func(j *store.Job) (audit.Event, error) {
		if !changeable(j.State) {
			return audit.Event{}, fmt.Errorf("%w: job %s is %s; the change can no longer apply", errdefs.ErrFailedPrecondition, j.ID, j.State)
		}
		g, err := s.grantOf(*j)
		if err != nil {
			return audit.Event{}, err
		}
		if g.Generation != ch.BaseGeneration {
			return audit.Event{}, fmt.Errorf("%w: job %s changed since this change was asked (grant generation %d, asked against %d); ask again",
				errdefs.ErrFailedPrecondition, j.ID, g.Generation, ch.BaseGeneration)
		}
		j.Grant, j.NetworkState, j.UpdatedAt = sg.Wire, "pending", now
		return audit.Event{Kind: audit.KindJobChanged, Caller: caller.String(), Subject: j.ID, Time: now, Outcome: audit.OutcomeAllowed,
			Reason: fmt.Sprintf("grant generation %d: %s", next.Generation, reason)}, nil
	}
	var j store.Job
	if consume == nil {
		j, err = s.cfg.Store.UpdateJobAudited(ctx, cur.JobID, update)
	} else {
		_, j, err = s.cfg.Store.ApplyChangeAudited(ctx, *consume, audit.Event{
			Kind: audit.KindApprovalConsumed, Caller: consume.By, Subject: consume.ID, Time: now, Outcome: audit.OutcomeAllowed,
			Reason: "change applied to job " + cur.JobID,
		}, update)
	}
	if err != nil {
		return store.Job{}, err
	}
	s.hub.publish(j)
	// The job holds its new limits at the gate (if it holds any: one
	// whose drive ended holds nothing).
	s.gate.resize(j.ID, j.Tenant, useOf(ch.ToLimits))
	s.cfg.Logger.InfoContext(ctx, "job change granted", "job", j.ID, "generation", next.Generation, "change", describe(ch))
	return s.pushChange(ctx, j.ID, sg.Wire, cur, caller)
}

// pushChange hands grant to the executor, retrying while it is
// unreachable for a short while, and records the outcome: applied, or —
// when the executor refuses it — the previous grant back in force with the
// refusal on the log. If the executor stays unreachable the change stays
// pending and a background task keeps trying.
func (s *Service) pushChange(ctx context.Context, id string, grant []byte, prev GrantRequest, caller identity.ID) (store.Job, error) {
	err := s.sendUpdate(ctx, prev.Executor, grant, 5*time.Second)
	switch {
	case err == nil:
		return s.markApplied(id, grant)
	case errors.Is(err, errdefs.ErrUnavailable) || ctx.Err() != nil:
		s.resumeChange(id, grant)
		j, gerr := s.cfg.Store.GetJob(ctx, id)
		if gerr != nil {
			return store.Job{}, gerr
		}
		return j, fmt.Errorf("%w: the change is recorded and pending; the executor could not be reached yet (%v) and it will be retried", errdefs.ErrUnavailable, err)
	}
	// The executor refused the grant: the job keeps what it had.
	prevWire, serr := s.cfg.Signer.Sign(prev)
	if serr != nil {
		return store.Job{}, serr
	}
	reason := err.Error()
	j, uerr := s.updateAudited(context.WithoutCancel(ctx), id, func(j *store.Job) error {
		if string(j.Grant) != string(grant) {
			return errUnchanged
		}
		j.Grant, j.NetworkState = prevWire.Wire, "applied"
		return nil
	}, func(j *store.Job) audit.Event {
		return audit.Event{Kind: audit.KindJobChangeFailed, Caller: caller.String(), Subject: j.ID, Outcome: audit.OutcomeDenied,
			Reason: "the executor refused the new grant; the previous one stays in force: " + reason}
	})
	if uerr != nil {
		return store.Job{}, uerr
	}
	s.gate.resize(id, j.Tenant, useOf(prev.Limits))
	return j, fmt.Errorf("%w: the executor refused the change: %v", errdefs.ErrFailedPrecondition, err)
}

// sendUpdate calls executor's Update, retrying ErrUnavailable for up
// to patience.
func (s *Service) sendUpdate(ctx context.Context, executor string, grant []byte, patience time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	delay := s.cfg.Retry.Min
	for {
		err := s.cfg.Executors.For(executor).Update(ctx, grant)
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, s.cfg.Retry.Max)
	}
}

// markApplied records that grant is in force, if it still is the job's.
func (s *Service) markApplied(id string, grant []byte) (store.Job, error) {
	return s.update(s.ctx, id, func(j *store.Job) error {
		if string(j.Grant) != string(grant) || j.NetworkState == "applied" {
			return errUnchanged
		}
		j.NetworkState = "applied"
		return nil
	})
}

// resumeChange keeps handing a pending grant to the executor in the
// background until it is in force, the job ends or a newer grant replaces
// it.
func (s *Service) resumeChange(id string, grant []byte) {
	s.background(func(context.Context) {
		delay := s.cfg.Retry.Min
		for s.ctx.Err() == nil {
			j, err := s.cfg.Store.GetJob(s.ctx, id)
			if err != nil || !changeable(j.State) || string(j.Grant) != string(grant) {
				return
			}
			err = s.sendUpdate(s.ctx, j.Executor, grant, time.Minute)
			if err == nil {
				if _, err := s.markApplied(id, grant); err != nil {
					s.cfg.Logger.Error("record an applied change", "job", id, "error", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrUnavailable) {
				// The stored grant is not in force and will not be: say so
				// on the job and on the log.
				s.cfg.Logger.Error("the executor refused a pending change", "job", id, "error", err)
				reason := err.Error()
				if _, uerr := s.updateAudited(s.ctx, id, func(j *store.Job) error {
					if string(j.Grant) != string(grant) {
						return errUnchanged
					}
					j.NetworkState, j.Message = "failed", "the executor refused the job's latest grant: "+reason
					return nil
				}, func(j *store.Job) audit.Event {
					return audit.Event{Kind: audit.KindJobChangeFailed, Subject: j.ID, Outcome: audit.OutcomeDenied,
						Reason: "the executor refused the pending grant after a restart: " + reason}
				}); uerr != nil {
					s.cfg.Logger.Error("record a refused change", "job", id, "error", uerr)
				}
				return
			}
			select {
			case <-s.ctx.Done():
			case <-time.After(delay):
			}
			delay = min(2*delay, s.cfg.Retry.Max)
		}
	})
}

// resumeApproved applies the change approvals that were approved but not
// applied: what a crash between the deciding vote and the change would
// leave. Only those that still apply are tried (the job still runs under
// the generation they were asked against); the rest stay as they are and
// expire.
func (s *Service) resumeApproved(ctx context.Context) error {
	token := ""
	for {
		list, next, err := s.cfg.Store.ListApprovals(ctx, store.ApprovalFilter{Kind: store.KindChange,
			States: []store.ApprovalState{store.ApprovalApproved}, Limit: 100, PageToken: token})
		if err != nil {
			return err
		}
		for _, a := range list {
			if !s.now().Before(a.ExpiresAt) || len(a.Votes) == 0 {
				continue
			}
			ch, err := DecodeChange(a.Change)
			if err != nil {
				return err
			}
			j, err := s.cfg.Store.GetJob(ctx, a.JobID)
			if err != nil {
				return err
			}
			g, err := s.grantOf(j)
			if err != nil || !changeable(j.State) || g.Generation != ch.BaseGeneration {
				continue
			}
			by, err := identity.Parse(a.Votes[len(a.Votes)-1].Approver)
			if err != nil {
				return err
			}
			if _, err := s.ApplyApproved(ctx, by, a.ID); err != nil {
				s.cfg.Logger.ErrorContext(ctx, "apply an approved change after a restart", "approval", a.ID, "job", a.JobID, "error", err)
				continue
			}
			s.cfg.Logger.InfoContext(ctx, "applied an approved change after a restart", "approval", a.ID, "job", a.JobID)
		}
		if token = next; token == "" {
			return nil
		}
	}
}
