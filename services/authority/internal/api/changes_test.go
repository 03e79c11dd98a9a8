package api_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/audit"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

// running submits a job and waits until the fake executor runs it.
func (h *harness) running(key string) *authorityv1.Job {
	h.t.Helper()
	dev := h.client(devID)
	j := h.submit(dev, key, spec()).GetJob()
	return h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
}

func allowPolicy(cidr string, ports ...uint32) *typesv1.NetworkPolicy {
	return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{Rules: []*typesv1.AllowRule{{Cidr: cidr, Ports: ports}}}}}
}

func denyAll() *typesv1.NetworkPolicy {
	return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}
}

// auditKinds counts a job's audit events by kind/OUTCOME.
func (h *harness) auditKinds(jobID string) map[string]int {
	h.t.Helper()
	ev, err := h.client(aliceID).ListAuditEvents(h.t.Context(), &authorityv1.ListAuditEventsRequest{JobId: jobID, PageSize: 1000})
	if err != nil {
		h.t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range ev.GetEvents() {
		seen[e.GetKind()+"/"+strings.TrimPrefix(e.GetOutcome().String(), "AUDIT_OUTCOME_")]++
	}
	return seen
}

func TestNarrowingAppliesAtOnce(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	j := h.running("narrow")
	before := j.GetLimits()
	if before.GetMemoryBytes() != policy.DefaultLimits.MemoryBytes || j.GetGrantGeneration() != 1 {
		t.Fatalf("limits in force before = %v, generation %d", before, j.GetGrantGeneration())
	}
	resp, err := dev.UpdateJobLimits(t.Context(), &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(),
		Limits: &typesv1.ResourceLimits{MemoryBytes: 128 << 20, Pids: 64}})
	if err != nil {
		t.Fatalf("lowering limits: %v", err)
	}
	got := resp.GetJob()
	if resp.GetApprovalId() != "" || got.GetLimits().GetMemoryBytes() != 128<<20 || got.GetLimits().GetPids() != 64 ||
		got.GetLimits().GetCpuMillis() != before.GetCpuMillis() || got.GetGrantGeneration() != 2 ||
		got.GetNetworkPolicyStatus().GetState() != typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED {
		t.Fatalf("after lowering: approval %q, job %v", resp.GetApprovalId(), got)
	}
	ups := h.fake.Updates(j.GetJobId())
	if len(ups) != 1 || ups[0].GetGeneration() != 2 || ups[0].GetLimits().GetMemoryBytes() != 128<<20 || ups[0].GetNetworkPolicyGeneration() != 1 {
		t.Fatalf("grants the executor put in force: %v", ups)
	}
	// Narrowing the network (deny-all is the narrowest there is) from an
	// allow policy needs nothing either; the network generation moves.
	s := spec()
	s.NetworkPolicy = allowPolicy("10.1.0.0/16", 443)
	j2 := h.submit(dev, "narrow-net", s).GetJob()
	h.waitState(dev, j2.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	for _, np := range []*typesv1.NetworkPolicy{allowPolicy("10.1.2.0/24", 443), denyAll()} {
		nr, err := dev.UpdateNetworkPolicy(t.Context(), &authorityv1.UpdateNetworkPolicyRequest{JobId: j2.GetJobId(), Policy: np})
		if err != nil || nr.GetApprovalId() != "" || !proto.Equal(nr.GetStatus().GetPolicy(), np) ||
			nr.GetStatus().GetState() != typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED {
			t.Fatalf("narrowing to %v: %v, %v", np, nr, err)
		}
	}
	ups = h.fake.Updates(j2.GetJobId())
	if len(ups) != 2 || ups[1].GetNetworkPolicyGeneration() != 3 || ups[1].GetNetworkPolicy().GetDenyAll() == nil {
		t.Fatalf("network grants in force: %v", ups)
	}
	if k := h.auditKinds(j.GetJobId()); k["job.changed/ALLOWED"] != 1 {
		t.Errorf("audit of the narrowing: %v", k)
	}
}

func TestWideningWaitsForAnotherApprover(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev, alice, bob, devAppr, publisher := h.client(devID), h.client(aliceID), h.client(bobID), h.client(devApproverID), h.client(publisherID)
	j := h.running("widen")
	id := j.GetJobId()

	resp, err := dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id,
		Limits: &typesv1.ResourceLimits{MemoryBytes: 1 << 30, Deadline: durationpb.New(policy.DefaultLimits.Deadline / 2)}})
	if err != nil || resp.GetApprovalId() == "" {
		t.Fatalf("raising memory: %v, %v; want an approval", resp, err)
	}
	aid := resp.GetApprovalId()
	if got := resp.GetJob(); got.GetGrantGeneration() != 1 || got.GetLimits().GetMemoryBytes() != policy.DefaultLimits.MemoryBytes {
		t.Fatalf("the job changed before approval: %v", got)
	}
	if len(h.fake.Updates(id)) != 0 {
		t.Fatal("the executor got a widened grant before approval")
	}

	ga, err := alice.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: aid})
	if err != nil {
		t.Fatal(err)
	}
	a := ga.GetApproval()
	ch := a.GetChange()
	if a.GetKind() != authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE || a.GetTarget() != nil || a.GetRequester() != devID.String() ||
		ch.GetBaseGeneration() != 1 || ch.GetToLimits().GetMemoryBytes() != 1<<30 || ch.GetFromLimits().GetMemoryBytes() != policy.DefaultLimits.MemoryBytes ||
		len(ch.GetWidens()) != 1 || !strings.HasPrefix(ch.GetWidens()[0], "memory_bytes:") || !strings.HasPrefix(a.GetBundleDigest(), "sha256:") {
		t.Fatalf("change approval = %v", a)
	}

	approve := &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: a.GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE}
	_, err = devAppr.DecideApproval(ctx, approve)
	wantStatus(t, err, codes.PermissionDenied, "may not decide")
	_, err = dev.DecideApproval(ctx, approve)
	wantStatus(t, err, codes.PermissionDenied)
	_, err = bob.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: digestA, Decision: authorityv1.Decision_DECISION_APPROVE})
	wantStatus(t, err, codes.FailedPrecondition, "bundle_digest")
	// The publisher can never spend a change approval.
	_, err = publisher.ConsumeApproval(ctx, &authorityv1.ConsumeApprovalRequest{ApprovalId: aid, JobId: id, BundleDigest: a.GetBundleDigest(),
		Target: &typesv1.PublishTarget{Repository: "demo", Branch: "main"}})
	if status.Code(err) == codes.OK {
		t.Fatal("the publisher consumed a change approval")
	}

	dr, err := alice.DecideApproval(ctx, approve)
	if err != nil || dr.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
		t.Fatalf("alice approves the change: %v, %v; want it applied (consumed)", dr, err)
	}
	got, err := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
	if err != nil || got.GetJob().GetGrantGeneration() != 2 || got.GetJob().GetLimits().GetMemoryBytes() != 1<<30 ||
		got.GetJob().GetLimits().GetDeadline().AsDuration() != policy.DefaultLimits.Deadline/2 {
		t.Fatalf("job after the approved change: %v, %v", got, err)
	}
	ups := h.fake.Updates(id)
	if len(ups) != 1 || ups[0].GetLimits().GetMemoryBytes() != 1<<30 || ups[0].GetGeneration() != 2 {
		t.Fatalf("grants the executor put in force: %v", ups)
	}
	_, err = bob.DecideApproval(ctx, approve)
	wantStatus(t, err, codes.FailedPrecondition)

	k := h.auditKinds(id)
	for _, want := range []string{"approval.opened/ALLOWED", "approval.decided/ALLOWED", "approval.decided/DENIED", "approval.consumed/ALLOWED", "job.changed/ALLOWED"} {
		if k[want] == 0 {
			t.Errorf("no %s in %v", want, k)
		}
	}
	if k["job.changed/ALLOWED"] != 1 || k["approval.consumed/ALLOWED"] != 1 {
		t.Errorf("the change applied %d times, its approval consumed %d times", k["job.changed/ALLOWED"], k["approval.consumed/ALLOWED"])
	}
}

func TestWideningNetworkNeedsApproval(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev, alice := h.client(devID), h.client(aliceID)
	j := h.running("widen-net")
	id := j.GetJobId()

	_, err := dev.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: id, Policy: allowPolicy("192.168.0.0/16", 443)})
	wantStatus(t, err, codes.PermissionDenied, "policy.allow.rules[0].cidr", "outside")
	_, err = dev.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: id})
	wantStatus(t, err, codes.InvalidArgument, "policy")
	_, err = dev.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: id, Policy: denyAll()})
	wantStatus(t, err, codes.InvalidArgument, "already runs under exactly")

	resp, err := dev.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: id, Policy: allowPolicy("10.1.0.0/16", 443)})
	if err != nil || resp.GetApprovalId() == "" || resp.GetStatus().GetPolicy().GetDenyAll() == nil || resp.GetStatus().GetGeneration() != 1 {
		t.Fatalf("widening deny-all to allow: %v, %v; want an approval and deny-all still in force", resp, err)
	}
	a, err := alice.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: resp.GetApprovalId()})
	if err != nil || len(a.GetApproval().GetChange().GetWidens()) != 1 || !strings.Contains(a.GetApproval().GetChange().GetWidens()[0], "10.1.0.0/16") {
		t.Fatalf("change = %v, %v", a, err)
	}
	if _, err := alice.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: resp.GetApprovalId(),
		BundleDigest: a.GetApproval().GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE}); err != nil {
		t.Fatal(err)
	}
	got, err := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
	st := got.GetJob().GetNetworkPolicyStatus()
	if err != nil || !proto.Equal(st.GetPolicy(), allowPolicy("10.1.0.0/16", 443)) || st.GetGeneration() != 2 ||
		st.GetState() != typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED {
		t.Fatalf("network status after the approved change: %v, %v", st, err)
	}
	// A port the policy does not cover widens again; a sub-range of it
	// on a covered port does not.
	resp, err = dev.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: id, Policy: allowPolicy("10.1.0.0/16", 22)})
	if err != nil || resp.GetApprovalId() == "" {
		t.Fatalf("another port: %v, %v; want an approval", resp, err)
	}
	resp, err = dev.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: id, Policy: allowPolicy("10.1.7.0/24", 443)})
	if err != nil || resp.GetApprovalId() != "" || resp.GetStatus().GetGeneration() != 3 {
		t.Fatalf("a covered sub-range: %v, %v; want it applied at once", resp, err)
	}
}

func TestWideningPolicyAllowAndDeny(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	h.tenants["dev"].Approvals.Widening = policy.WidenAllow
	h.restart()
	j := h.running("allow")
	resp, err := h.client(devID).UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(), Limits: &typesv1.ResourceLimits{Pids: 512}})
	if err != nil || resp.GetApprovalId() != "" || resp.GetJob().GetLimits().GetPids() != 512 {
		t.Fatalf("widening under an allow policy: %v, %v", resp, err)
	}
	// Above the tenant's ceiling nothing helps.
	_, err = h.client(devID).UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(), Limits: &typesv1.ResourceLimits{Pids: policy.DefaultMax.Pids + 1}})
	wantStatus(t, err, codes.InvalidArgument, "limits.pids", "ceiling")
	_, err = h.client(devID).UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(), Limits: &typesv1.ResourceLimits{DiskBytes: 8 << 20}})
	wantStatus(t, err, codes.InvalidArgument, "limits.disk_bytes", "cannot change on a running job")

	h.tenants["dev"].Approvals.Widening = policy.WidenDeny
	h.restart()
	_, err = h.client(devID).UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(), Limits: &typesv1.ResourceLimits{Pids: 600}})
	wantStatus(t, err, codes.PermissionDenied, "refuses widening", "pids")
	// Narrowing still applies under a deny policy.
	resp, err = h.client(devID).UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(), Limits: &typesv1.ResourceLimits{Pids: 100}})
	if err != nil || resp.GetJob().GetLimits().GetPids() != 100 {
		t.Fatalf("narrowing under a deny policy: %v, %v", resp, err)
	}
	if k := h.auditKinds(j.GetJobId()); k["job.change_refused/DENIED"] < 3 || k["job.changed/ALLOWED"] != 2 {
		t.Errorf("audit: %v", k)
	}
}

func TestChangeRefusals(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev, other, alice := h.client(devID), h.client(otherID), h.client(aliceID)
	j := h.running("refusals")
	id := j.GetJobId()

	// Another tenant cannot even see the job; services and approvers are
	// not callers of this RPC at all.
	_, err := other.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Limits: &typesv1.ResourceLimits{Pids: 10}})
	wantStatus(t, err, codes.NotFound)
	_, err = h.client(executorID).UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Limits: &typesv1.ResourceLimits{Pids: 10}})
	wantStatus(t, err, codes.PermissionDenied)
	_, err = alice.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: id, Policy: denyAll()})
	wantStatus(t, err, codes.PermissionDenied)
	_, err = dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id})
	wantStatus(t, err, codes.InvalidArgument, "limits")
	_, err = dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Limits: &typesv1.ResourceLimits{MemoryBytes: -1}})
	wantStatus(t, err, codes.InvalidArgument, "limits.memory_bytes")

	// Two widenings asked against the same grant: the first approved one
	// applies, the second can no longer (the job moved on) and stays
	// unspent.
	r1, err := dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Limits: &typesv1.ResourceLimits{Pids: 300}})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Limits: &typesv1.ResourceLimits{Pids: 400}})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(aid string) (*authorityv1.DecideApprovalResponse, error) {
		a, err := alice.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: aid})
		if err != nil {
			t.Fatal(err)
		}
		return alice.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: a.GetApproval().GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE})
	}
	if _, err := decide(r1.GetApprovalId()); err != nil {
		t.Fatal(err)
	}
	_, err = decide(r2.GetApprovalId())
	wantStatus(t, err, codes.FailedPrecondition, "changed since", "ask again")
	if a, _ := alice.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: r2.GetApprovalId()}); a.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_APPROVED {
		t.Errorf("the stale change's approval = %v; want approved and unspent", a.GetApproval().GetState())
	}
	if got, _ := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id}); got.GetJob().GetLimits().GetPids() != 300 {
		t.Fatalf("pids in force = %d, want 300", got.GetJob().GetLimits().GetPids())
	}

	// The executor refuses a grant: the previous one stays in force.
	h.fake.FailUpdates(status.Error(codes.FailedPrecondition, "memory.limit_in_bytes: device or resource busy"))
	_, err = dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Limits: &typesv1.ResourceLimits{MemoryBytes: 64 << 20}})
	wantStatus(t, err, codes.FailedPrecondition, "executor refused", "busy")
	got, err := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
	if err != nil || got.GetJob().GetLimits().GetMemoryBytes() != policy.DefaultLimits.MemoryBytes || got.GetJob().GetGrantGeneration() != 2 {
		t.Fatalf("after a refused change: %v, %v; want the previous grant back", got, err)
	}
	h.fake.FailUpdates(nil)
	if k := h.auditKinds(id); k["job.change_failed/DENIED"] != 1 {
		t.Errorf("audit: %v", k)
	}

	// A job that ended cannot change.
	h.fake.End(id, 3)
	if _, err := h.client(executorID).ReportResult(ctx, &authorityv1.ReportResultRequest{JobId: id, Result: exited(digestA), Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_FINISHED)
	_, err = dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id, Limits: &typesv1.ResourceLimits{Pids: 10}})
	wantStatus(t, err, codes.FailedPrecondition, "finished")
}

// TestApprovedChangeSurvivesACrashBeforeItApplied leaves a change approved
// but not applied — what a crash between the deciding vote's commit and
// the change would leave — and restarts the authority: the change applies,
// once.
func TestApprovedChangeSurvivesACrashBeforeItApplied(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	j := h.running("crash")
	resp, err := h.client(devID).UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(), Limits: &typesv1.ResourceLimits{Pids: 700}})
	if err != nil || resp.GetApprovalId() == "" {
		t.Fatalf("widening: %v, %v", resp, err)
	}
	h.auth.stop()
	st, err := sqlite.Open(ctx, filepath.Join(h.data, "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.DecideApprovalAudited(ctx, resp.GetApprovalId(), func(a *store.Approval) (store.Vote, audit.Event, error) {
		a.State = store.ApprovalApproved
		return store.Vote{Approver: aliceID.String(), Decision: store.DecisionApprove, DecidedAt: time.Now()},
			audit.Event{Kind: "approval.decided", Caller: aliceID.String(), Subject: a.ID, Outcome: "allowed"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	h.start()
	eventually(t, "the approved change applied after the restart", func() bool {
		got, err := h.client(devID).GetJob(ctx, &authorityv1.GetJobRequest{JobId: j.GetJobId()})
		return err == nil && got.GetJob().GetLimits().GetPids() == 700 && got.GetJob().GetGrantGeneration() == 2 &&
			got.GetJob().GetNetworkPolicyStatus().GetState() == typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED
	})
	a, err := h.client(aliceID).GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: resp.GetApprovalId()})
	if err != nil || a.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
		t.Fatalf("approval after the restart: %v, %v", a, err)
	}
	if ups := h.fake.Updates(j.GetJobId()); len(ups) != 1 || ups[0].GetLimits().GetPids() != 700 {
		t.Fatalf("grants the executor put in force: %v", ups)
	}
	// A second restart applies nothing again.
	h.restart()
	time.Sleep(100 * time.Millisecond)
	if k := h.auditKinds(j.GetJobId()); k["job.changed/ALLOWED"] != 1 || k["approval.consumed/ALLOWED"] != 1 {
		t.Fatalf("audit after two restarts: %v", k)
	}
}
