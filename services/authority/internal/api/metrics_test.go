package api_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// Real calls move the authority's metrics, each with its fixed
// attributes: submissions by outcome, a job waiting at the gate for its
// tenant's quota, jobs ended by state, an approval's vote and decision,
// and the deploy lease.
func TestMetrics(t *testing.T) {
	rd := metricstest.NewReader(t)
	h := newHarnessWith(t, harnessOptions{meter: rd.Provider, devQuota: policy.Quota{RunningJobs: 1}})
	ctx := t.Context()
	dev, executor, alice, publisher := h.client(devID), h.client(executorID), h.client(aliceID), h.client(publisherID)
	want := func(got metricstest.Recorded, name string, attrs map[string]string, v float64) {
		t.Helper()
		if n, ok := got.Value(name, attrs); !ok || n != v {
			t.Errorf("%s %v = %v (recorded %v), want %v\n%s", name, attrs, n, ok, v, got.Points(name))
		}
	}

	// Tenant dev may run one job: the second waits at the gate.
	first := h.submit(dev, "first", spec()).GetJob()
	h.waitState(dev, first.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	second := h.submit(dev, "second", spec()).GetJob()
	eventually(t, "the second job to wait", func() bool {
		n, _ := rd.Collect(t).Value("airlock.authority.jobs.waiting", map[string]string{})
		return n == 1
	})
	h.submit(dev, "second", spec()) // the same key and spec: the job recorded first
	bad := spec()
	bad.Repository = "nope"
	_, err := dev.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: bad, IdempotencyKey: "bad"})
	wantStatus(t, err, codes.PermissionDenied)

	cancelled := &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_CANCELLED, ExitCode: -1, BundleDigest: digestA}
	if _, err := executor.ReportResult(ctx, &authorityv1.ReportResultRequest{JobId: first.GetJobId(), Result: cancelled, Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	h.fake.End(first.GetJobId(), executorv1.RunState_RUN_STATE_CANCELLED)
	h.waitState(dev, second.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	if _, err := dev.CancelJob(ctx, &authorityv1.CancelJobRequest{JobId: second.GetJobId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := executor.ReportResult(ctx, &authorityv1.ReportResultRequest{JobId: second.GetJobId(), Result: cancelled, Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	h.waitState(dev, second.GetJobId(), authorityv1.JobState_JOB_STATE_CANCELLED)

	j := h.finishedWithTarget("published")
	approve := &authorityv1.DecideApprovalRequest{ApprovalId: j.GetApprovalId(), BundleDigest: digestA, Decision: authorityv1.Decision_DECISION_APPROVE}
	if _, err := alice.DecideApproval(ctx, approve); err != nil {
		t.Fatal(err)
	}
	if _, err := publisher.ConsumeApproval(ctx, &authorityv1.ConsumeApprovalRequest{ApprovalId: j.GetApprovalId(), JobId: j.GetJobId(), BundleDigest: digestA,
		Target: &typesv1.PublishTarget{Repository: "demo", Branch: "main"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: j.GetJobId(), Resource: "demo"}); err != nil {
		t.Fatal(err)
	}

	got := rd.Collect(t)
	want(got, "airlock.authority.jobs.submitted", map[string]string{"outcome": "accepted", "kind": "job"}, 3)
	want(got, "airlock.authority.jobs.submitted", map[string]string{"outcome": "repeated", "kind": "job"}, 1)
	want(got, "airlock.authority.jobs.submitted", map[string]string{"outcome": "refused", "kind": "job"}, 1)
	want(got, "airlock.authority.jobs.waiting", map[string]string{}, 0)
	want(got, "airlock.authority.jobs.ended", map[string]string{"state": "cancelled"}, 2)
	want(got, "airlock.authority.jobs.ended", map[string]string{"state": "finished"}, 1)
	want(got, "airlock.authority.approvals.votes", map[string]string{"kind": "publish", "decision": "approve"}, 1)
	want(got, "airlock.authority.approvals.decided", map[string]string{"kind": "publish", "state": "approved"}, 1)
	want(got, "airlock.authority.leases.issued", map[string]string{"purpose": "deploy"}, 1)
}
