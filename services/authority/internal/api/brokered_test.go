package api_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestBrokeredLeaseRefusals is the brokered credentials' lease from the
// attacker's side, over mTLS: an executor that asks for a deploy
// credential, another executor of the fleet, a name the job did not ask
// for, a client, and a job that ended are all refused.
func TestBrokeredLeaseRefusals(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	j := h.submit(dev, "brokered", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	exec := h.client(executorID)
	brokered := func(name string) *authorityv1.LeaseCredentialRequest {
		return &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_BROKERED, JobId: j.GetJobId(), Resource: name}
	}

	_, err := exec.LeaseCredential(t.Context(), &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY,
		JobId: j.GetJobId(), Resource: "demo"})
	wantStatus(t, err, codes.PermissionDenied, "only the publisher")
	_, err = exec.LeaseCredential(t.Context(), &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ,
		JobId: j.GetJobId(), Resource: "demo"})
	wantStatus(t, err, codes.PermissionDenied, "only the publisher")

	other := h.addExecutor("b", bigReport())
	_, err = h.client(other.id).LeaseCredential(t.Context(), brokered("github"))
	wantStatus(t, err, codes.PermissionDenied, "not placed on service/executor/b")

	_, err = exec.LeaseCredential(t.Context(), brokered("github"))
	wantStatus(t, err, codes.PermissionDenied, `did not ask for the brokered credential "github"`)

	_, err = dev.LeaseCredential(t.Context(), brokered("github"))
	wantStatus(t, err, codes.PermissionDenied)
	_, err = h.client(publisherID).LeaseCredential(t.Context(), brokered("github"))
	wantStatus(t, err, codes.PermissionDenied, "only the executor")

	// An executor may call RevokeCredential; the lease must exist.
	_, err = exec.RevokeCredential(t.Context(), &authorityv1.RevokeCredentialRequest{LeaseId: "nope"})
	wantStatus(t, err, codes.NotFound)

	if _, err := exec.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA), Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_FINISHED)
	_, err = exec.LeaseCredential(t.Context(), brokered("github"))
	wantStatus(t, err, codes.FailedPrecondition, "ended (finished)")
}
