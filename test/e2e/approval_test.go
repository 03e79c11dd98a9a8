//go:build linux

package e2e

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/seal"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestApprovalIsBoundSingleUseAndNeverSelfGranted walks the approval story
// against the real binaries: a job with a publish target finishes; an
// approver sees it; its requester cannot approve it even holding an
// approver certificate of the same name; an executor cannot approve at
// all; another approver approves; the publisher consumes it once and only
// once, leases the deploy credential sealed to itself alone, and nothing
// else; and the whole story is on an unbroken audit chain.
func TestApprovalIsBoundSingleUseAndNeverSelfGranted(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--publish-to", "sample:main", "--wait", "-o", "json", "--",
		"sh", "-c", "printf 'hello, airlock\\n' > lib/greet.txt")
	if res.code != 0 {
		t.Fatalf("job: exit %d\n%s", res.code, res.stderr)
	}
	var job struct {
		JobID  string `json:"jobId"`
		Result struct {
			BundleDigest string `json:"bundleDigest"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &job); err != nil || job.Result.BundleDigest == "" {
		t.Fatalf("job JSON: %v\n%s", err, res.stdout)
	}

	res = s.airlock(t, "approval", "list", "--as", "approver/alice", "-o", "json")
	var list struct {
		Approvals []struct {
			ApprovalID   string `json:"approvalId"`
			JobID        string `json:"jobId"`
			BundleDigest string `json:"bundleDigest"`
			State        string `json:"state"`
		} `json:"approvals"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &list); err != nil || res.code != 0 {
		t.Fatalf("approval list: exit %d %v\n%s%s", res.code, err, res.stdout, res.stderr)
	}
	if len(list.Approvals) != 1 || list.Approvals[0].JobID != job.JobID || list.Approvals[0].BundleDigest != job.Result.BundleDigest ||
		list.Approvals[0].State != "APPROVAL_STATE_PENDING" {
		t.Fatalf("want one pending approval for job %s and bundle %s, got %+v", job.JobID, job.Result.BundleDigest, list.Approvals)
	}
	id := list.Approvals[0].ApprovalID

	// The requester (client/dev) holding approver/dev: refused.
	if res := s.airlock(t, "approval", "approve", id, "--as", "approver/dev"); res.code == 0 || !strings.Contains(res.stderr, "may not decide") {
		t.Fatalf("self-approval: exit %d\n%s", res.code, res.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	decide := &authorityv1.DecideApprovalRequest{ApprovalId: id, BundleDigest: job.Result.BundleDigest, Decision: authorityv1.Decision_DECISION_APPROVE}
	if _, err := authorityv1.NewAuthorityServiceClient(s.dial(t, "service/executor", "authority")).DecideApproval(ctx, decide); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the executor approving: %v, want PermissionDenied", err)
	}
	// Approving another digest than the request's: refused.
	if res := s.airlock(t, "approval", "approve", id, "--as", "approver/bob", "--digest", "sha256:"+strings.Repeat("0", 64)); res.code == 0 {
		t.Fatal("an approval of another digest was accepted")
	}
	if res := s.airlock(t, "approval", "approve", id, "--as", "approver/alice", "--comment", "looks right"); res.code != 0 || !strings.Contains(res.stdout, "approved") {
		t.Fatalf("approve as alice: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	publisher := authorityv1.NewAuthorityServiceClient(s.dial(t, "service/publisher", "authority"))
	target := &typesv1.PublishTarget{Repository: "sample", Branch: "main"}
	consume := &authorityv1.ConsumeApprovalRequest{ApprovalId: id, JobId: job.JobID, BundleDigest: job.Result.BundleDigest, Target: target}
	if _, err := publisher.ConsumeApproval(ctx, consume); err != nil {
		t.Fatalf("first consume: %v", err)
	}
	if _, err := publisher.ConsumeApproval(ctx, consume); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second consume: %v, want FailedPrecondition", err)
	}
	// A pipeline holds no approval power and cannot consume either.
	if _, err := authorityv1.NewAuthorityServiceClient(s.dial(t, "pipeline/deploy", "authority")).ConsumeApproval(ctx, consume); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("pipeline consuming: %v, want PermissionDenied", err)
	}

	lease, err := publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{
		Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: job.JobID, Resource: "sample", Ttl: durationpb.New(2 * time.Minute)})
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	want, err := os.ReadFile(filepath.Join(s.dir, "authority", "credentials", "sample.deploy"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(lease.GetSealedCredential()), strings.TrimSpace(string(want))) {
		t.Fatal("the lease carries the credential in clear")
	}
	certFile, keyFile := pki.Paths(s.pkiDir, identity.Service("airlock.local", identity.ServicePublisher))
	certPEM, _ := os.ReadFile(certFile)
	keyPEM, _ := os.ReadFile(keyFile)
	cert, err := pki.ParseCertificatePEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	l := lease.GetLease()
	got, err := seal.Open(cert, key.(*ecdsa.PrivateKey), seal.LeaseContext(l.GetLeaseId(), job.JobID, "sample"), lease.GetSealedCredential())
	if err != nil || string(got) != string(want) {
		t.Fatalf("the publisher cannot open its lease: %q, %v", got, err)
	}
	if _, err := publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{
		Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: job.JobID, Resource: "another-repo"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("lease for another repository: %v, want PermissionDenied", err)
	}

	// The holder presents the lease before each use; the same
	// presentation is refused once an approver revoked it.
	use := &authorityv1.UseLeaseRequest{LeaseId: l.GetLeaseId(), JobId: job.JobID, Resource: "sample"}
	if _, err := publisher.UseLease(ctx, use); err != nil {
		t.Fatalf("using an active lease: %v", err)
	}
	if res := s.airlock(t, "lease", "list", "--as", "approver/alice"); res.code != 0 || !strings.Contains(res.stdout, l.GetLeaseId()) {
		t.Fatalf("lease list: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := s.airlock(t, "lease", "revoke", l.GetLeaseId(), "--as", "approver/alice"); res.code != 0 {
		t.Fatalf("lease revoke: exit %d\n%s", res.code, res.stderr)
	}
	if _, err := publisher.UseLease(ctx, use); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("using a revoked lease: %v, want FailedPrecondition (revoked)", err)
	}
	if res := s.airlock(t, "lease", "list", "--as", "approver/alice"); strings.Contains(res.stdout, l.GetLeaseId()) {
		t.Fatalf("a revoked lease is still listed as active:\n%s", res.stdout)
	}

	res = s.airlock(t, "audit", "list", "--as", "approver/alice", "--limit", "0")
	for _, kind := range []string{"approval.opened", "approval.decided", "approval.consumed", "lease.issued", "lease.used", "lease.revoked"} {
		if !strings.Contains(res.stdout, kind) {
			t.Errorf("audit log lacks %s:\n%s", kind, res.stdout)
		}
	}
	if strings.Contains(res.stdout, strings.TrimSpace(string(want))) {
		t.Error("the audit log carries the deploy credential")
	}
	if res := s.airlock(t, "audit", "verify", "--as", "approver/alice"); res.code != 0 {
		t.Fatalf("audit verify: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}
