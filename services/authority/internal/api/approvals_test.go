package api_test

import (
	"crypto/ecdsa"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/seal"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/leases"
)

// finishedWithTarget submits a job with a publish target, lets it run and
// reports its result as the executor, and returns the finished job.
func (h *harness) finishedWithTarget(key string) *authorityv1.Job {
	h.t.Helper()
	dev, executor := h.client(devID), h.client(executorID)
	s := spec()
	s.PublishTarget = &typesv1.PublishTarget{Repository: "demo", Branch: "main"}
	j := h.submit(dev, key, s).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	rep := &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA),
		Patch: []byte("diff --git a/x b/x\n"), Detail: noFiles()}
	rr, err := executor.ReportResult(h.t.Context(), rep)
	if err != nil {
		h.t.Fatalf("ReportResult: %v", err)
	}
	if rr.GetJob().GetApprovalId() == "" {
		h.t.Fatalf("no approval opened for a finished job with a publish target: %v", rr.GetJob())
	}
	// A retried report changes nothing and opens no second approval.
	again, err := executor.ReportResult(h.t.Context(), rep)
	if err != nil || again.GetJob().GetApprovalId() != rr.GetJob().GetApprovalId() {
		h.t.Fatalf("retried ReportResult: approval %q, %v; want %q", again.GetJob().GetApprovalId(), err, rr.GetJob().GetApprovalId())
	}
	return rr.GetJob()
}

func TestApprovalToLeaseStory(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev, alice, bob, devAppr := h.client(devID), h.client(aliceID), h.client(bobID), h.client(devApproverID)
	executor, publisher, other := h.client(executorID), h.client(publisherID), h.client(otherID)
	j := h.finishedWithTarget("story")
	aid := j.GetApprovalId()

	// Listed for an approver; read-only for the tenant's client.
	list, err := alice.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{States: []authorityv1.ApprovalState{authorityv1.ApprovalState_APPROVAL_STATE_PENDING}})
	if err != nil || len(list.GetApprovals()) != 1 || list.GetApprovals()[0].GetApprovalId() != aid {
		t.Fatalf("approver's pending list = %v, %v", list, err)
	}
	a := list.GetApprovals()[0]
	if a.GetJobId() != j.GetJobId() || a.GetBundleDigest() != digestA || a.GetTarget().GetRepository() != "demo" ||
		a.GetTarget().GetBranch() != "main" || a.GetRequester() != devID.String() || a.GetRequiredApprovals() != 1 {
		t.Errorf("approval = %v", a)
	}
	if got, err := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: j.GetJobId()}); err != nil || got.GetJob().GetApprovalId() != aid {
		t.Errorf("GetJob approval_id = %q, %v", got.GetJob().GetApprovalId(), err)
	}
	if l, err := dev.ListJobs(ctx, &authorityv1.ListJobsRequest{Tenant: "dev"}); err != nil || l.GetJobs()[0].GetApprovalId() != aid {
		t.Errorf("ListJobs approval_id = %v, %v", l, err)
	}
	if l, err := dev.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{Tenant: "dev"}); err != nil || len(l.GetApprovals()) != 1 {
		t.Errorf("client's list = %v, %v", l, err)
	}
	_, err = other.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, "tenant")
	_, err = other.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: aid})
	wantStatus(t, err, codes.NotFound)
	got, err := alice.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: aid})
	if err != nil {
		t.Fatal(err)
	}
	rv := got.GetReview()
	if string(rv.GetPatch()) != "diff --git a/x b/x\n" || string(rv.GetDetail().GetStdout().GetData()) != "ok\n" || rv.GetDetail().GetPatchSize() != 19 || rv.GetCommit() != j.GetCommit() ||
		strings.Join(rv.GetCommand(), " ") != "make test" || rv.GetNetworkPolicy().GetDenyAll() == nil || rv.GetResult().GetBundleDigest() != digestA {
		t.Errorf("review material = %v", rv)
	}

	approve := &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: digestA, Decision: authorityv1.Decision_DECISION_APPROVE}
	// Clients and services never reach DecideApproval; the requester is
	// refused under an approver certificate too.
	_, err = dev.DecideApproval(ctx, approve)
	wantStatus(t, err, codes.PermissionDenied)
	_, err = executor.DecideApproval(ctx, approve)
	wantStatus(t, err, codes.PermissionDenied)
	_, err = devAppr.DecideApproval(ctx, approve)
	wantStatus(t, err, codes.PermissionDenied, "may not decide")
	_, err = bob.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: digestA, Decision: authorityv1.Decision_DECISION_DENY})
	wantStatus(t, err, codes.InvalidArgument, "comment")
	_, err = bob.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: digestB, Decision: authorityv1.Decision_DECISION_APPROVE})
	wantStatus(t, err, codes.FailedPrecondition, "bundle_digest")

	consume := &authorityv1.ConsumeApprovalRequest{ApprovalId: aid, JobId: j.GetJobId(), BundleDigest: digestA,
		Target: &typesv1.PublishTarget{Repository: "demo", Branch: "main"}}
	_, err = publisher.ConsumeApproval(ctx, consume)
	wantStatus(t, err, codes.FailedPrecondition, "pending, not approved")

	dr, err := alice.DecideApproval(ctx, approve)
	if err != nil || dr.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_APPROVED || len(dr.GetApproval().GetVotes()) != 1 {
		t.Fatalf("alice approves: %v, %v", dr, err)
	}
	_, err = alice.ConsumeApproval(ctx, consume)
	wantStatus(t, err, codes.PermissionDenied)

	// Leasing before the approval is consumed is refused.
	leaseReq := &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: j.GetJobId(), Resource: "demo"}
	_, err = publisher.LeaseCredential(ctx, leaseReq)
	wantStatus(t, err, codes.FailedPrecondition, "not consumed")

	wrong := &authorityv1.ConsumeApprovalRequest{ApprovalId: aid, JobId: j.GetJobId(), BundleDigest: digestA,
		Target: &typesv1.PublishTarget{Repository: "demo", Branch: "release"}}
	_, err = publisher.ConsumeApproval(ctx, wrong)
	wantStatus(t, err, codes.FailedPrecondition, "target:")
	cr, err := publisher.ConsumeApproval(ctx, consume)
	if err != nil || cr.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
		t.Fatalf("consume: %v, %v", cr, err)
	}
	_, err = publisher.ConsumeApproval(ctx, consume)
	wantStatus(t, err, codes.FailedPrecondition, "consumed")

	// The lease: sealed to the publisher's own certificate.
	leaseReq.Ttl = durationpb.New(time.Hour)
	lr, err := publisher.LeaseCredential(ctx, leaseReq)
	if err != nil {
		t.Fatalf("LeaseCredential: %v", err)
	}
	l := lr.GetLease()
	if l.GetHolder() != publisherID.String() || l.GetResource() != "demo" || l.GetJobId() != j.GetJobId() ||
		l.GetExpiresAt().AsTime().Sub(l.GetIssuedAt().AsTime()) > leases.MaxTTL {
		t.Errorf("lease = %v", l)
	}
	if strings.Contains(string(lr.GetSealedCredential()), deploySecret) {
		t.Fatal("the credential travels in the clear")
	}
	certFile, keyFile := pki.Paths(h.pkiDir, publisherID)
	cpem, _ := os.ReadFile(certFile)
	kpem, _ := os.ReadFile(keyFile)
	cert, err := pki.ParseCertificatePEM(cpem)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(kpem)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := seal.Open(cert, key.(*ecdsa.PrivateKey), leases.SealContext(l.GetLeaseId(), j.GetJobId(), "demo"), lr.GetSealedCredential())
	if err != nil || string(secret) != deploySecret {
		t.Fatalf("publisher opens its credential: %q, %v", secret, err)
	}
	if strings.Contains(h.logs.String(), deploySecret) {
		t.Error("the deploy credential reached the log")
	}

	// Only the publisher leases, only for the job's target repository.
	_, err = executor.LeaseCredential(ctx, leaseReq)
	wantStatus(t, err, codes.PermissionDenied)
	otherRepo := &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: j.GetJobId(), Resource: "mirrored"}
	_, err = publisher.LeaseCredential(ctx, otherRepo)
	wantStatus(t, err, codes.PermissionDenied, "resource:")

	// The holder announces each use; anyone else, another job or another
	// resource is refused.
	use := &authorityv1.UseLeaseRequest{LeaseId: l.GetLeaseId(), JobId: j.GetJobId(), Resource: "demo"}
	if ur, err := publisher.UseLease(ctx, use); err != nil || ur.GetLease().GetLeaseId() != l.GetLeaseId() {
		t.Fatalf("UseLease by its holder: %v, %v", ur, err)
	}
	_, err = publisher.UseLease(ctx, &authorityv1.UseLeaseRequest{LeaseId: l.GetLeaseId(), JobId: "other-job", Resource: "demo"})
	wantStatus(t, err, codes.PermissionDenied, "job_id")
	_, err = publisher.UseLease(ctx, &authorityv1.UseLeaseRequest{LeaseId: l.GetLeaseId(), JobId: j.GetJobId(), Resource: "mirrored"})
	wantStatus(t, err, codes.PermissionDenied, "resource")
	_, err = executor.UseLease(ctx, use)
	wantStatus(t, err, codes.PermissionDenied)

	// Revoke; the lease is then inactive.
	active, err := alice.ListLeases(ctx, &authorityv1.ListLeasesRequest{})
	if err != nil || len(active.GetLeases()) != 1 {
		t.Fatalf("active leases = %v, %v", active, err)
	}
	// The publisher lists the leases it holds (to end any a crash left).
	if mine, err := publisher.ListLeases(ctx, &authorityv1.ListLeasesRequest{}); err != nil || len(mine.GetLeases()) != 1 || mine.GetLeases()[0].GetLeaseId() != l.GetLeaseId() {
		t.Fatalf("the publisher's active leases = %v, %v", mine, err)
	}
	rr, err := publisher.RevokeCredential(ctx, &authorityv1.RevokeCredentialRequest{LeaseId: l.GetLeaseId(), Reason: "pushed"})
	if err != nil || rr.GetLease().GetRevokedAt() == nil {
		t.Fatalf("revoke: %v, %v", rr, err)
	}
	_, err = publisher.UseLease(ctx, use)
	wantStatus(t, err, codes.FailedPrecondition, "revoked")
	active, err = alice.ListLeases(ctx, &authorityv1.ListLeasesRequest{})
	if err != nil || len(active.GetLeases()) != 0 {
		t.Fatalf("active leases after revoking = %v, %v", active, err)
	}
	all, err := alice.ListLeases(ctx, &authorityv1.ListLeasesRequest{IncludeInactive: true, JobId: j.GetJobId()})
	if err != nil || len(all.GetLeases()) != 1 || all.GetLeases()[0].GetRevokedAt() == nil {
		t.Fatalf("all leases = %v, %v", all, err)
	}

	// Every decision is in the log.
	ev, err := alice.ListAuditEvents(ctx, &authorityv1.ListAuditEventsRequest{JobId: j.GetJobId(), PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range ev.GetEvents() {
		seen[e.GetKind()+"/"+strings.TrimPrefix(e.GetOutcome().String(), "AUDIT_OUTCOME_")]++
	}
	for _, k := range []string{"approval.opened/ALLOWED", "approval.decided/ALLOWED", "approval.decided/DENIED",
		"approval.consumed/ALLOWED", "approval.consumed/DENIED", "lease.issued/ALLOWED", "lease.issued/DENIED", "lease.revoked/ALLOWED",
		"lease.used/ALLOWED", "lease.used/DENIED"} {
		if seen[k] == 0 {
			t.Errorf("no %s event in %v", k, seen)
		}
	}
	if seen["approval.opened/ALLOWED"] != 1 || seen["approval.consumed/ALLOWED"] != 1 {
		t.Errorf("opened %d, consumed %d times; want once each", seen["approval.opened/ALLOWED"], seen["approval.consumed/ALLOWED"])
	}
}

func TestNoApprovalWithoutTarget(t *testing.T) {
	h := newHarness(t)
	dev, executor := h.client(devID), h.client(executorID)
	j := h.submit(dev, "plain", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	rr, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA), Detail: noFiles()})
	if err != nil || rr.GetJob().GetApprovalId() != "" {
		t.Fatalf("job without a target: approval %q, %v", rr.GetJob().GetApprovalId(), err)
	}
	l, err := h.client(aliceID).ListApprovals(t.Context(), &authorityv1.ListApprovalsRequest{})
	if err != nil || len(l.GetApprovals()) != 0 {
		t.Fatalf("approvals = %v, %v", l, err)
	}
}

// TestApproverSeesOnlyItsTenants is issue 9 §3 from the other approver's
// side: approver/eve, whom no tenant lists, cannot list, read, stream,
// decide or see the leases of another tenant's requests, nor revoke its
// lease; the listed approver still can.
func TestApproverSeesOnlyItsTenants(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	alice, eve, publisher := h.client(aliceID), h.client(eveID), h.client(publisherID)
	j := h.finishedWithTarget("scoped")
	aid := j.GetApprovalId()

	if l, err := eve.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{}); err != nil || len(l.GetApprovals()) != 0 {
		t.Errorf("eve lists %v, %v; want nothing", l.GetApprovals(), err)
	}
	_, err := eve.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, "not an approver of tenant")
	_, err = eve.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: aid})
	wantStatus(t, err, codes.NotFound)
	wantStatus(t, readReview(t, eve, &authorityv1.ReadReviewRequest{ApprovalId: aid}).err, codes.NotFound)
	_, err = eve.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: digestA, Decision: authorityv1.Decision_DECISION_APPROVE})
	if status.Code(err) != codes.NotFound && status.Code(err) != codes.PermissionDenied {
		t.Errorf("eve decides: %v, want refused", err)
	}

	if _, err := alice.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: digestA, Decision: authorityv1.Decision_DECISION_APPROVE}); err != nil {
		t.Fatal(err)
	}
	if _, err := publisher.ConsumeApproval(ctx, &authorityv1.ConsumeApprovalRequest{ApprovalId: aid, JobId: j.GetJobId(), BundleDigest: digestA,
		Target: &typesv1.PublishTarget{Repository: "demo", Branch: "main"}}); err != nil {
		t.Fatal(err)
	}
	lr, err := publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: j.GetJobId(), Resource: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := eve.ListLeases(ctx, &authorityv1.ListLeasesRequest{IncludeInactive: true}); err != nil || len(l.GetLeases()) != 0 {
		t.Errorf("eve lists leases %v, %v; want none", l.GetLeases(), err)
	}
	_, err = eve.RevokeCredential(ctx, &authorityv1.RevokeCredentialRequest{LeaseId: lr.GetLease().GetLeaseId(), Reason: "mine now"})
	wantStatus(t, err, codes.NotFound)
	if l, err := alice.ListLeases(ctx, &authorityv1.ListLeasesRequest{}); err != nil || len(l.GetLeases()) != 1 {
		t.Errorf("alice lists leases %v, %v; want the one", l.GetLeases(), err)
	}
	if _, err := alice.RevokeCredential(ctx, &authorityv1.RevokeCredentialRequest{LeaseId: lr.GetLease().GetLeaseId(), Reason: "done"}); err != nil {
		t.Errorf("alice revokes: %v", err)
	}
}
