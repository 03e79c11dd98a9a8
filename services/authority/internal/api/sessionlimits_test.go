package api_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// sessionSpec is a session on the demo repository.
func sessionSpec(s *typesv1.SessionSpec) *authorityv1.JobSpec {
	p := spec()
	p.Command, p.Session = nil, s
	return p
}

// runningSession creates a session and waits until the fake executor runs it.
func (h *harness) runningSession(key string, s *typesv1.SessionSpec) *authorityv1.Job {
	h.t.Helper()
	dev := h.client(devID)
	resp, err := dev.CreateSession(h.t.Context(), &authorityv1.CreateSessionRequest{Tenant: "dev", IdempotencyKey: key, Spec: sessionSpec(s)})
	if err != nil {
		h.t.Fatalf("CreateSession: %v", err)
	}
	return h.waitState(dev, resp.GetSession().GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
}

// TestSessionSettingsByPolicy: a session's idle timeout and concurrent
// execs take the tenant's defaults and stop at its ceilings; raising them
// on a running session is a widening that waits for an approver, lowering
// them applies at once, and either reaches the executor as a newer grant.
func TestSessionSettingsByPolicy(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{devSessions: policy.Sessions{
		DefaultIdleTimeout: 5 * time.Minute, MaxIdleTimeout: time.Hour, DefaultConcurrentExecs: 2, MaxConcurrentExecs: 4}})
	ctx := t.Context()
	dev, alice := h.client(devID), h.client(aliceID)

	for _, tc := range []struct {
		s    *typesv1.SessionSpec
		want string
	}{
		{&typesv1.SessionSpec{IdleTimeout: durationpb.New(2 * time.Hour)}, "spec.session.idle_timeout: 2h0m0s is above the tenant's ceiling of 1h0m0s"},
		{&typesv1.SessionSpec{MaxConcurrentExecs: 5}, "spec.session.max_concurrent_execs: 5 is above the tenant's ceiling of 4"},
	} {
		_, err := dev.CreateSession(ctx, &authorityv1.CreateSessionRequest{Tenant: "dev", IdempotencyKey: "too-much", Spec: sessionSpec(tc.s)})
		wantStatus(t, err, codes.InvalidArgument, tc.want)
	}

	j := h.runningSession("settings", nil)
	id := j.GetJobId()
	if s := j.GetSession(); s.GetIdleTimeout().AsDuration() != 5*time.Minute || s.GetMaxConcurrentExecs() != 2 {
		t.Fatalf("session in force = %v, want the tenant's defaults", s)
	}

	// Lowering applies at once and reaches the executor.
	resp, err := dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Session: &typesv1.SessionSpec{MaxConcurrentExecs: 1}})
	if err != nil || resp.GetApprovalId() != "" || resp.GetJob().GetSession().GetMaxConcurrentExecs() != 1 ||
		resp.GetJob().GetSession().GetIdleTimeout().AsDuration() != 5*time.Minute || resp.GetJob().GetGrantGeneration() != 2 {
		t.Fatalf("lowering max_concurrent_execs: %v, %v", resp, err)
	}
	ups := h.fake.Updates(id)
	if len(ups) != 1 || ups[0].GetSession().GetMaxConcurrentExecs() != 1 || ups[0].GetGeneration() != 2 {
		t.Fatalf("grants the executor put in force: %v", ups)
	}

	// Past the ceiling is refused, naming it.
	_, err = dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Session: &typesv1.SessionSpec{IdleTimeout: durationpb.New(90 * time.Minute)}})
	wantStatus(t, err, codes.InvalidArgument, "session.idle_timeout: 1h30m0s is above the tenant's ceiling of 1h0m0s")
	// A job has no session to change.
	plain := h.running("plain")
	_, err = dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: plain.GetJobId(), Session: &typesv1.SessionSpec{MaxConcurrentExecs: 1}})
	wantStatus(t, err, codes.FailedPrecondition, "not a session")

	// Raising waits for an approver other than the requester.
	resp, err = dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Session: &typesv1.SessionSpec{IdleTimeout: durationpb.New(time.Hour)}})
	if err != nil || resp.GetApprovalId() == "" {
		t.Fatalf("raising idle_timeout: %v, %v; want an approval", resp, err)
	}
	if len(h.fake.Updates(id)) != 1 {
		t.Fatal("the executor got a widened grant before approval")
	}
	ga, err := alice.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: resp.GetApprovalId()})
	if err != nil {
		t.Fatal(err)
	}
	ch := ga.GetApproval().GetChange()
	if ch.GetFromSession().GetIdleTimeout().AsDuration() != 5*time.Minute || ch.GetToSession().GetIdleTimeout().AsDuration() != time.Hour ||
		len(ch.GetWidens()) != 1 || ch.GetWidens()[0] != "session.idle_timeout: 5m0s -> 1h0m0s" {
		t.Fatalf("change approval = %v", ch)
	}
	dr, err := alice.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: resp.GetApprovalId(), BundleDigest: ga.GetApproval().GetBundleDigest(),
		Decision: authorityv1.Decision_DECISION_APPROVE})
	if err != nil || dr.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
		t.Fatalf("alice approves: %v, %v", dr, err)
	}
	ups = h.fake.Updates(id)
	if len(ups) != 2 || ups[1].GetSession().GetIdleTimeout().AsDuration() != time.Hour || ups[1].GetSession().GetMaxConcurrentExecs() != 1 || ups[1].GetGeneration() != 3 {
		t.Fatalf("grants the executor put in force: %v", ups)
	}
	got := h.state(dev, id)
	if got.GetSession().GetIdleTimeout().AsDuration() != time.Hour || got.GetSession().GetMaxConcurrentExecs() != 1 {
		t.Fatalf("session in force after the approved change: %v", got.GetSession())
	}
}

// TestSessionOnIdleByPolicy: what a session does once idle is the
// tenant's default unless it says, reaches the executor in its grant, and
// sleep is refused naming spec.session.on_idle where the tenant forbids
// it; an unknown action is refused too. A suspended session is listed
// suspended, with since when.
func TestSessionOnIdleByPolicy(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{devSessions: policy.Sessions{DefaultOnIdle: policy.OnIdleSleep}})
	ctx := t.Context()
	dev := h.client(devID)
	j := h.runningSession("default-sleep", nil)
	if got := j.GetSession().GetOnIdle(); got != typesv1.IdleAction_IDLE_ACTION_SLEEP {
		t.Fatalf("session in force on_idle = %v, want the tenant's default SLEEP", got)
	}
	if gs := h.fake.Grants(j.GetJobId()); len(gs) == 0 || gs[0].GetSession().GetOnIdle() != typesv1.IdleAction_IDLE_ACTION_SLEEP {
		t.Fatalf("grants the executor got: %v", gs)
	}
	e := h.runningSession("asks-end", &typesv1.SessionSpec{OnIdle: typesv1.IdleAction_IDLE_ACTION_END})
	if gs := h.fake.Grants(e.GetJobId()); len(gs) == 0 || gs[0].GetSession().GetOnIdle() != typesv1.IdleAction_IDLE_ACTION_END {
		t.Fatalf("grants of a session asking to end: %v", gs)
	}
	// Changed on a running session: no widening, in force at once.
	up, err := dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: e.GetJobId(), Session: &typesv1.SessionSpec{OnIdle: typesv1.IdleAction_IDLE_ACTION_SLEEP}})
	if err != nil || up.GetApprovalId() != "" || up.GetJob().GetSession().GetOnIdle() != typesv1.IdleAction_IDLE_ACTION_SLEEP {
		t.Fatalf("changing on_idle to sleep: %v, %v", up, err)
	}
	if ups := h.fake.Updates(e.GetJobId()); len(ups) != 1 || ups[0].GetSession().GetOnIdle() != typesv1.IdleAction_IDLE_ACTION_SLEEP {
		t.Fatalf("grants the executor put in force: %v", ups)
	}
	_, err = dev.CreateSession(ctx, &authorityv1.CreateSessionRequest{Tenant: "dev", IdempotencyKey: "nap", Spec: sessionSpec(&typesv1.SessionSpec{OnIdle: typesv1.IdleAction(7)})})
	wantStatus(t, err, codes.InvalidArgument, "spec.session.on_idle: 7: not an action this server knows")

	if _, err := dev.SuspendSession(ctx, &authorityv1.SuspendSessionRequest{SessionId: j.GetJobId()}); err != nil {
		t.Fatal(err)
	}
	list, err := dev.ListSessions(ctx, &authorityv1.ListSessionsRequest{Tenant: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	if s := list.GetSuspended(); len(s) != 1 || s[0].GetSessionId() != j.GetJobId() || s[0].GetSuspendedAt() == nil {
		t.Fatalf("suspended sessions listed: %v", s)
	}
	got, err := dev.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: j.GetJobId()})
	if err != nil || !got.GetSuspended() || got.GetSuspendedAt() == nil {
		t.Fatalf("GetSession of a suspended session: %v, %v", got, err)
	}

	forbid := newHarnessWith(t, harnessOptions{devSessions: policy.Sessions{ForbidSleep: true}})
	_, err = forbid.client(devID).CreateSession(ctx, &authorityv1.CreateSessionRequest{Tenant: "dev", IdempotencyKey: "sleep",
		Spec: sessionSpec(&typesv1.SessionSpec{OnIdle: typesv1.IdleAction_IDLE_ACTION_SLEEP})})
	wantStatus(t, err, codes.PermissionDenied, "spec.session.on_idle: sleep: the tenant's policy does not allow sessions to sleep")
	if j := forbid.runningSession("default", nil); j.GetSession().GetOnIdle() != typesv1.IdleAction_IDLE_ACTION_END {
		t.Fatalf("the default where sleep is forbidden: %v", j.GetSession())
	}
}
