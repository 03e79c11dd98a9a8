package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Brokered credentials a job asks for, and the start approval that holds
// a job asking for one whose policy says approval: required: the job
// waits, queued and placed nowhere, until approvers who are not its
// requester approve; denied or expired, it is cancelled and never runs.

// MaxCredentials bounds the brokered credentials one job asks for.
const MaxCredentials = 16

// startPoll is how often a job waiting for its start approval reads it
// again.
const startPoll = 10 * time.Second

// brokeredPort is the port a credential's hosts are reached on: the proxy
// adds credentials inside TLS connections only.
const brokeredPort = 443

// StartRequest is what a start approval is about, as the approval stores
// it: every credential the job asks for, with its hosts.
type StartRequest struct {
	Credentials []StartCredential
}

// StartCredential is one brokered credential a job asks for.
type StartCredential struct {
	Name             string
	Hosts            []string
	ApprovalRequired bool
}

// Encode serializes r as a start approval stores it, with the digest a
// decision must name.
func (r StartRequest) Encode() (wire []byte, digest string, err error) { return encodeDigested(r) }

// DecodeStart reads what a start approval recorded.
func DecodeStart(wire []byte) (StartRequest, error) {
	var r StartRequest
	if err := json.Unmarshal(wire, &r); err != nil {
		return StartRequest{}, fmt.Errorf("jobs: stored start request: %w", err)
	}
	return r, nil
}

// needsApproval reports whether any credential r asks for requires a
// start approval.
func (r StartRequest) needsApproval() bool {
	return slices.ContainsFunc(r.Credentials, func(c StartCredential) bool { return c.ApprovalRequired })
}

// approvalNames are the credentials that require the approval.
func (r StartRequest) approvalNames() []string {
	var out []string
	for _, c := range r.Credentials {
		if c.ApprovalRequired {
			out = append(out, c.Name)
		}
	}
	return out
}

// checkCredentials takes the brokered credentials a spec asks for from
// the tenant's policy: each named once, and every host of each reachable
// by the job's network policy on port 443, or the proxy could never add
// it. Errors name the credential, never a value.
func checkCredentials(t *policy.Tenant, names []string, runtime string, n Network) (StartRequest, error) {
	var out StartRequest
	if len(names) == 0 {
		return out, nil
	}
	if len(names) > MaxCredentials {
		return out, invalid("spec.credentials", "%d given, at most %d", len(names), MaxCredentials)
	}
	if runtime == policy.RuntimeVM {
		// The vm class cannot take the per-job CA file the proxy's
		// interception needs yet.
		return out, invalid("spec.credentials", "not supported under runtime %s yet", policy.RuntimeVM)
	}
	reach := egress.Policy{}
	if n.Mode == NetworkDomains {
		ports, _ := egress.Ports(n.DomainPorts) // checked with the network policy
		for _, d := range n.Domains {
			reach.Names = append(reach.Names, egress.Name{Name: d, Ports: ports})
		}
	}
	for i, name := range names {
		c, err := named(t, t.Credentials, names, i, "spec.credentials", "brokered credential", invalid)
		if err != nil {
			return out, err
		}
		field := fmt.Sprintf("spec.credentials[%d]", i)
		for _, h := range c.Hosts {
			want := egress.Policy{Names: []egress.Name{{Name: h, Ports: []uint16{brokeredPort}}}}
			if len(reach.Covers(want)) > 0 {
				return out, invalid(field, "credential %q is added for host %s, which the job's network policy does not reach on port %d: add it to the policy's domains (mode domains)", name, h, brokeredPort)
			}
		}
		out.Credentials = append(out.Credentials, StartCredential{Name: name, Hosts: slices.Clone(c.Hosts), ApprovalRequired: c.ApprovalRequired})
	}
	return out, nil
}

// openStart records job j's start approval, asked by caller.
func (s *Service) openStart(ctx context.Context, caller string, j store.Job, t *policy.Tenant, r StartRequest) (store.Approval, error) {
	wire, digest, err := r.Encode()
	if err != nil {
		return store.Approval{}, err
	}
	now := s.now()
	a := store.Approval{
		ID: newID(), Kind: store.KindStart, JobID: j.ID, Tenant: j.Tenant, Requester: j.Requester,
		BundleDigest: digest, Change: wire, State: store.ApprovalPending, Required: t.Approvals.Required,
		CreatedAt: now, ExpiresAt: now.Add(t.Approvals.TTL),
	}
	a, _, err = s.cfg.Store.CreateApprovalAudited(ctx, a, audit.Event{
		Kind: audit.KindApprovalOpened, Caller: caller, Subject: a.ID, Time: now, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("start of job %s needs %d approval(s): it asks for brokered credential(s) %s", j.ID, a.Required, strings.Join(r.approvalNames(), ", ")),
	})
	if err != nil {
		return store.Approval{}, err
	}
	s.cfg.Logger.InfoContext(ctx, "start approval opened", "job", j.ID, "approval", a.ID, "credentials", r.approvalNames())
	return a, nil
}

// startGate is the start approval's hold on queued job j with grant g,
// before it is placed or dispatched. It returns go when the job may go on
// (from is then when its start deadline starts counting: its approval,
// or its submission when it needs none); otherwise done says the job needs
// no more driving until a decision kicks it (or its approval's expiry
// does).
func (s *Service) startGate(j store.Job, g GrantRequest) (ok bool, from time.Time, done bool, err error) {
	t := s.cfg.Tenants[j.Tenant]
	if len(g.Credentials) == 0 || t == nil {
		return true, j.CreatedAt, false, nil
	}
	var r StartRequest
	for _, name := range g.Credentials {
		// The policy in force: a credential made approval: required
		// after the job was submitted holds it too. One removed is
		// stillAllowed's to refuse.
		c := t.Credentials[name]
		r.Credentials = append(r.Credentials, StartCredential{Name: name, Hosts: c.Hosts, ApprovalRequired: c.ApprovalRequired})
	}
	if !r.needsApproval() {
		return true, j.CreatedAt, false, nil
	}
	// An approval decides what it showed: approved or pending for other
	// hosts or credentials than the policy now says (a widening since),
	// it does not let the job go; a new one is opened.
	_, digest, err := r.Encode()
	if err != nil {
		return false, time.Time{}, false, err
	}
	list, _, err := s.cfg.Store.ListApprovals(s.ctx, store.ApprovalFilter{JobID: j.ID, Kind: store.KindStart, Limit: 20})
	if err != nil {
		return false, time.Time{}, false, err
	}
	now := s.now()
	var pending *store.Approval
	ended := ""
	for i := range list {
		a := list[i]
		live := now.Before(a.ExpiresAt)
		stale := a.BundleDigest != digest
		switch {
		case stale && (a.State == store.ApprovalApproved || a.State == store.ApprovalPending):
			continue
		case a.State == store.ApprovalConsumed:
			return true, decidedAt(a), false, nil
		case a.State == store.ApprovalApproved && live:
			_, err := s.cfg.Store.ConsumeApprovalAudited(s.ctx, store.ConsumeRequest{Kind: store.KindStart, ID: a.ID, JobID: a.JobID,
				BundleDigest: a.BundleDigest, By: s.actor(j), At: now},
				audit.Event{Kind: audit.KindApprovalConsumed, Caller: s.actor(j), Subject: a.ID, JobID: j.ID, Time: now, Outcome: audit.OutcomeAllowed,
					Reason: fmt.Sprintf("start of job %s approved: it goes to an executor", j.ID)})
			if err != nil {
				return false, time.Time{}, false, err
			}
			return true, decidedAt(a), false, nil
		case a.State == store.ApprovalPending && live:
			pending = &list[i]
		case a.State == store.ApprovalDenied && ended == "":
			ended = fmt.Sprintf("its start approval %s was denied", a.ID)
		case ended == "":
			ended = fmt.Sprintf("its start approval %s expired at %s undecided", a.ID, a.ExpiresAt.Format(time.RFC3339))
		}
	}
	switch {
	case pending != nil:
		// A decision made through another replica kicks nothing here.
		s.wakeAt(j.ID, pending.ExpiresAt)
		return false, time.Time{}, true, s.noteWaiting(j.ID, fmt.Sprintf("its start approval %s (brokered credential(s) %s) is pending until %s",
			pending.ID, strings.Join(r.approvalNames(), ", "), pending.ExpiresAt.Format(time.RFC3339)))
	case ended != "":
		_, err := s.updateAudited(s.ctx, j.ID, func(cur *store.Job) error {
			if cur.State != store.StateQueued {
				return errUnchanged
			}
			cur.State, cur.Message = store.StateCancelled, "cancelled: "+ended+"; it never ran"
			return nil
		}, func(cur *store.Job) audit.Event {
			return audit.Event{Kind: audit.KindJobCancelled, Caller: s.actor(*cur), Subject: cur.ID, Outcome: audit.OutcomeAllowed, Reason: cur.Message}
		})
		return false, time.Time{}, true, err
	}
	// None yet (the submission's opening failed): open it now.
	a, err := s.openStart(s.ctx, s.actor(j), j, t, r)
	if err != nil {
		return false, time.Time{}, false, err
	}
	s.wakeAt(j.ID, a.ExpiresAt)
	return false, time.Time{}, true, nil
}

// decidedAt is when approval a reached its state: its last vote.
func decidedAt(a store.Approval) time.Time {
	if n := len(a.Votes); n > 0 {
		return a.Votes[n-1].DecidedAt
	}
	return a.CreatedAt
}

// wakeAt drives job id again just after t (its approval's expiry), or
// within startPoll, so a job whose approval was decided elsewhere or
// expired undecided goes on or ends. After a restart the
// claim's resume drives it again.
// A job has at most one such wake-up armed: every drive of a waiting job
// asks for one, and each would otherwise start a chain of its own.
func (s *Service) wakeAt(id string, t time.Time) {
	wait := min(max(t.Sub(s.now()), 0)+time.Second, startPoll)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, armed := s.wakes[id]; armed {
		return
	}
	s.wakes[id] = time.AfterFunc(wait, func() {
		s.mu.Lock()
		delete(s.wakes, id)
		s.mu.Unlock()
		s.kick(id)
	})
}

// StartDecided drives the job of start approval a after a decision on it:
// approved, the job goes to an executor; denied, it is cancelled.
func (s *Service) StartDecided(a store.Approval) {
	if a.Kind == store.KindStart && a.State != store.ApprovalPending {
		s.kick(a.JobID)
	}
}
