package api_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/seal"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

// pipelineID is a deploy pipeline: it asks the publisher to publish, and
// must reach nothing of the authority's publish plumbing itself.
var pipelineID = identity.MustParse("spiffe://" + td + "/pipeline/deploy")

// finishedPublishingTo submits a job on demo whose result is to be
// published to repo's main branch, reports its result as the executor and
// returns the finished job, its approval pending.
func (h *harness) finishedPublishingTo(key, repo string) *authorityv1.Job {
	h.t.Helper()
	dev, executor := h.client(devID), h.client(executorID)
	s := spec()
	s.PublishTarget = &typesv1.PublishTarget{Repository: repo, Branch: "main"}
	j := h.submit(dev, key, s).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	rr, err := executor.ReportResult(h.t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA),
		Patch: []byte("diff --git a/x b/x\n"), Detail: noFiles()})
	if err != nil || rr.GetJob().GetApprovalId() == "" {
		h.t.Fatalf("ReportResult for a job publishing to %s: %v, %v; want an approval opened", repo, rr, err)
	}
	return rr.GetJob()
}

// publisherKey returns the publisher's certificate and key, what a sealed
// credential opens with.
func (h *harness) publisherKey() (*x509.Certificate, *ecdsa.PrivateKey) {
	h.t.Helper()
	certFile, keyFile := pki.Paths(h.pkiDir, publisherID)
	cpem, err := os.ReadFile(certFile)
	if err != nil {
		h.t.Fatal(err)
	}
	kpem, err := os.ReadFile(keyFile)
	if err != nil {
		h.t.Fatal(err)
	}
	cert, err := pki.ParseCertificatePEM(cpem)
	if err != nil {
		h.t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(kpem)
	if err != nil {
		h.t.Fatal(err)
	}
	return cert, key.(*ecdsa.PrivateKey)
}

// reconfigure changes the tenants' policy (h.tenants) while no authority
// runs, then starts one on the same data: what an operator's edit and a
// restart do.
func (h *harness) reconfigure(change func()) {
	h.auth.stop()
	change()
	h.start()
}

// withPipeline issues a certificate for pipelineID under the harness's CA.
func (h *harness) withPipeline() authorityv1.AuthorityServiceClient {
	h.t.Helper()
	if _, err := pki.IssueInto(h.pkiDir, pipelineID, pki.IssueOptions{}); err != nil {
		h.t.Fatal(err)
	}
	return h.client(pipelineID)
}

func vote(aid string, d authorityv1.Decision, comment string) *authorityv1.DecideApprovalRequest {
	return &authorityv1.DecideApprovalRequest{ApprovalId: aid, BundleDigest: digestA, Decision: d, Comment: comment}
}

var policyDigest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func TestGetPublishSpec(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	// Two approvals needed, a written content policy and a private CA for
	// the mirrored repository, which has a source credential.
	caPEM, err := os.ReadFile(pki.CAPath(h.pkiDir))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "git-ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	dev := h.tenants["dev"]
	mirrored := dev.Repositories["mirrored"]
	h.reconfigure(func() {
		dev.Approvals.Required = 2
		dev.Publish = policy.Publish{
			Content: contentcheck.Policy{Protected: []string{"deploy/**", "*.pem"}, AllowProtected: []string{"CODEOWNERS"}, MaxFileBytes: 1 << 20, AllowBinary: true},
			OnMoved: policy.OnMovedRefuse,
		}
		mirrored.CA = caFile
		dev.Repositories["mirrored"] = mirrored
	})

	publisher, alice, bob := h.client(publisherID), h.client(aliceID), h.client(bobID)
	j := h.finishedPublishingTo("spec", "mirrored")
	aid := j.GetApprovalId()
	base := h.origin.RevParse("main")
	if j.GetCommit() != base {
		t.Fatalf("job ran on %q, want main's %q", j.GetCommit(), base)
	}
	get := func() *authorityv1.GetPublishSpecResponse {
		t.Helper()
		resp, err := publisher.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: aid})
		if err != nil {
			t.Fatalf("GetPublishSpec: %v", err)
		}
		return resp
	}

	// Pending: the spec says so, with no approvers and no approval time.
	pending := get()
	if pending.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING || len(pending.GetApprovers()) != 0 || pending.GetApprovedAt() != nil {
		t.Errorf("spec of a pending approval: state %v, approvers %v, approved_at %v", pending.GetApproval().GetState(), pending.GetApprovers(), pending.GetApprovedAt())
	}

	// Bob votes first, then Alice: the order cast, not the names' order.
	if _, err := bob.DecideApproval(ctx, vote(aid, authorityv1.Decision_DECISION_APPROVE, "")); err != nil {
		t.Fatal(err)
	}
	half := get()
	if half.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING || !slices.Equal(half.GetApprovers(), []string{bobID.String()}) || half.GetApprovedAt() != nil {
		t.Errorf("spec after one of two votes: state %v, approvers %v, approved_at %v", half.GetApproval().GetState(), half.GetApprovers(), half.GetApprovedAt())
	}
	time.Sleep(10 * time.Millisecond) // two votes never share a timestamp
	if _, err := alice.DecideApproval(ctx, vote(aid, authorityv1.Decision_DECISION_APPROVE, "")); err != nil {
		t.Fatal(err)
	}

	resp := get()
	a := resp.GetApproval()
	if a.GetApprovalId() != aid || a.GetJobId() != j.GetJobId() || a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_APPROVED ||
		a.GetTarget().GetRepository() != "mirrored" || a.GetTarget().GetBranch() != "main" || a.GetBundleDigest() != digestA {
		t.Errorf("approval = %v", a)
	}
	if resp.GetRepositoryUrl() != "file://"+h.origin.Dir || !bytes.Equal(resp.GetRepositoryCa(), caPEM) || !resp.GetReadCredential() {
		t.Errorf("repository: url %q, ca %d bytes (want %d), read_credential %v", resp.GetRepositoryUrl(), len(resp.GetRepositoryCa()), len(caPEM), resp.GetReadCredential())
	}
	if resp.GetBaseCommit() != base {
		t.Errorf("base_commit = %q, want %q", resp.GetBaseCommit(), base)
	}
	if want := []string{bobID.String(), aliceID.String()}; !slices.Equal(resp.GetApprovers(), want) {
		t.Errorf("approvers = %v, want %v", resp.GetApprovers(), want)
	}
	votes := a.GetVotes()
	if len(votes) != 2 || !votes[0].GetDecidedAt().AsTime().Before(votes[1].GetDecidedAt().AsTime()) {
		t.Fatalf("votes = %v; want two, bob's first", votes)
	}
	if resp.GetApprovedAt() == nil || !resp.GetApprovedAt().AsTime().Equal(votes[1].GetDecidedAt().AsTime()) {
		t.Errorf("approved_at = %v, want the deciding (second) vote's %v", resp.GetApprovedAt(), votes[1].GetDecidedAt().AsTime())
	}
	p := resp.GetPolicy()
	if !slices.Equal(p.GetProtected(), []string{"deploy/**", "*.pem"}) || !slices.Equal(p.GetAllowProtected(), []string{"CODEOWNERS"}) ||
		p.GetMaxFileBytes() != 1<<20 || !p.GetAllowBinary() || p.GetOnMoved() != policy.OnMovedRefuse {
		t.Errorf("policy = %v", p)
	}
	digest := resp.GetPolicyDigest()
	if !policyDigest.MatchString(digest) {
		t.Errorf("policy_digest = %q, want sha256: and 64 hex digits", digest)
	}
	if again := get(); again.GetPolicyDigest() != digest || !proto.Equal(again.GetPolicy(), p) {
		t.Errorf("a second call: digest %q, policy %v; want %q, %v", again.GetPolicyDigest(), again.GetPolicy(), digest, p)
	}
	// The spec names that a credential exists, never the credential.
	wire, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{secret, mirrored.Credential, filepath.Base(mirrored.Credential), caFile} {
		if bytes.Contains(wire, []byte(leak)) {
			t.Errorf("the spec carries %q", leak)
		}
	}

	// The digest follows the policy: a changed rule changes it, the same
	// rules written in another order do not.
	respec := func(change func(*policy.Publish)) string {
		t.Helper()
		h.reconfigure(func() { change(&dev.Publish) })
		publisher = h.client(publisherID)
		return get().GetPolicyDigest()
	}
	reordered := respec(func(p *policy.Publish) { p.Content.Protected = []string{"*.pem", "deploy/**", "*.pem"} })
	if reordered != digest {
		t.Errorf("the same protected globs reordered changed the digest: %s, want %s", reordered, digest)
	}
	moved := respec(func(p *policy.Publish) { p.OnMoved = policy.OnMovedReapply })
	if moved == digest || !policyDigest.MatchString(moved) {
		t.Errorf("on_moved refuse -> reapply: digest %s, was %s", moved, digest)
	}
	if got := get().GetPolicy().GetOnMoved(); got != policy.OnMovedReapply {
		t.Errorf("on_moved after the change = %q", got)
	}
	binary := respec(func(p *policy.Publish) { p.Content.AllowBinary = false })
	if binary == moved || binary == digest {
		t.Errorf("allow_binary true -> false kept the digest %s", binary)
	}
	glob := respec(func(p *policy.Publish) { p.Content.AllowProtected = []string{"CODEOWNERS", "deploy/**"} })
	if glob == binary {
		t.Errorf("another allow_protected glob kept the digest %s", glob)
	}
	size := respec(func(p *policy.Publish) { p.Content.MaxFileBytes = 2 << 20 })
	if size == glob {
		t.Errorf("another max_file_bytes kept the digest %s", size)
	}

	// A CA the authority cannot read is its own problem: Unavailable, and
	// the operator's path stays in the log.
	gone := filepath.Join(t.TempDir(), "gone.crt")
	h.reconfigure(func() {
		mirrored.CA = gone
		dev.Repositories["mirrored"] = mirrored
	})
	_, err = h.client(publisherID).GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: aid})
	wantStatus(t, err, codes.Unavailable, `"mirrored"`)
	if err != nil && strings.Contains(err.Error(), gone) {
		t.Errorf("the error names the CA's path: %v", err)
	}
}

// TestGetPublishSpecWithoutCredential: demo has no source credential and
// no CA; the spec says so.
func TestGetPublishSpecWithoutCredential(t *testing.T) {
	h := newHarness(t)
	j := h.finishedWithTarget("plain")
	resp, err := h.client(publisherID).GetPublishSpec(t.Context(), &authorityv1.GetPublishSpecRequest{ApprovalId: j.GetApprovalId()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRepositoryUrl() != h.origin.Dir || resp.GetReadCredential() || len(resp.GetRepositoryCa()) != 0 || resp.GetBaseCommit() != h.origin.RevParse("main") {
		t.Errorf("spec of demo = url %q, read_credential %v, ca %q, base %q", resp.GetRepositoryUrl(), resp.GetReadCredential(), resp.GetRepositoryCa(), resp.GetBaseCommit())
	}
	// The harness writes no publish policy: the digest still names it.
	if got, want := resp.GetPolicyDigest(), (policy.Publish{}).Digest(); got != want || !policyDigest.MatchString(got) {
		t.Errorf("policy_digest = %q, want %q", got, want)
	}
}

func TestGetPublishSpecRefusals(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	publisher := h.client(publisherID)
	j := h.finishedPublishingTo("refused", "mirrored")
	req := &authorityv1.GetPublishSpecRequest{ApprovalId: j.GetApprovalId()}

	// Nobody but the publisher reads a spec, not even for an approval
	// they can see.
	for _, c := range []struct {
		name string
		c    authorityv1.AuthorityServiceClient
	}{
		{"the requesting client", h.client(devID)},
		{"an approver of the tenant", h.client(aliceID)},
		{"the executor", h.client(executorID)},
		{"a pipeline", h.withPipeline()},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.c.GetPublishSpec(ctx, req)
			wantStatus(t, err, codes.PermissionDenied)
		})
	}

	_, err := publisher.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: "no-such-approval"})
	wantStatus(t, err, codes.NotFound, "no-such-approval")
	_, err = publisher.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{})
	wantStatus(t, err, codes.InvalidArgument, "approval_id")
	_, err = publisher.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: strings.Repeat("a", 129)})
	wantStatus(t, err, codes.InvalidArgument, "approval_id")
	// The job's id is not its approval's.
	_, err = publisher.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: j.GetJobId()})
	wantStatus(t, err, codes.NotFound)

	// A change request is no publish request, even on a job that has a
	// publish target, and even once approved.
	dev := h.client(devID)
	s := spec()
	s.PublishTarget = &typesv1.PublishTarget{Repository: "mirrored", Branch: "main"}
	running := h.submit(dev, "change", s).GetJob()
	h.waitState(dev, running.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	ch, err := dev.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: running.GetJobId(), Limits: &typesv1.ResourceLimits{Pids: 700}})
	if err != nil || ch.GetApprovalId() == "" {
		t.Fatalf("widening: %v, %v; want a change approval", ch, err)
	}
	changeReq := &authorityv1.GetPublishSpecRequest{ApprovalId: ch.GetApprovalId()}
	_, err = publisher.GetPublishSpec(ctx, changeReq)
	wantStatus(t, err, codes.FailedPrecondition, "not a publish request")
	ga, err := h.client(aliceID).GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: ch.GetApprovalId()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client(aliceID).DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: ch.GetApprovalId(),
		BundleDigest: ga.GetApproval().GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE}); err != nil {
		t.Fatal(err)
	}
	_, err = publisher.GetPublishSpec(ctx, changeReq)
	wantStatus(t, err, codes.FailedPrecondition, "not a publish request")
	// Nor does an approved change open the job's target's source
	// credential: the job has no result, let alone an approved one.
	_, err = publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ,
		JobId: running.GetJobId(), Resource: "mirrored"})
	wantStatus(t, err, codes.FailedPrecondition, "no approval")

	// A repository the tenant no longer lists has no spec and no lease.
	if _, err := h.client(aliceID).DecideApproval(ctx, vote(j.GetApprovalId(), authorityv1.Decision_DECISION_APPROVE, "")); err != nil {
		t.Fatal(err)
	}
	h.reconfigure(func() { delete(h.tenants["dev"].Repositories, "mirrored") })
	publisher = h.client(publisherID)
	_, err = publisher.GetPublishSpec(ctx, req)
	wantStatus(t, err, codes.FailedPrecondition, `"mirrored"`)
	_, err = publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ,
		JobId: j.GetJobId(), Resource: "mirrored"})
	wantStatus(t, err, codes.FailedPrecondition, "no source credential")
}

func TestReadLease(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	publisher, alice, bob := h.client(publisherID), h.client(aliceID), h.client(bobID)
	j := h.finishedPublishingTo("read", "mirrored")
	aid := j.GetApprovalId()
	read := &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ, JobId: j.GetJobId(), Resource: "mirrored",
		Ttl: durationpb.New(time.Hour)}
	deploy := &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: j.GetJobId(), Resource: "mirrored"}

	// Pending: no read lease, nor a deploy one.
	_, err := publisher.LeaseCredential(ctx, read)
	wantStatus(t, err, codes.FailedPrecondition, "pending, not approved")
	_, err = publisher.LeaseCredential(ctx, deploy)
	wantStatus(t, err, codes.FailedPrecondition, "not consumed")

	if _, err := alice.DecideApproval(ctx, vote(aid, authorityv1.Decision_DECISION_APPROVE, "")); err != nil {
		t.Fatal(err)
	}
	// Only the publisher, only the purposes there are, only the job's
	// target.
	for name, c := range map[string]authorityv1.AuthorityServiceClient{"client": h.client(devID), "approver": bob, "executor": h.client(executorID)} {
		t.Run(name, func(t *testing.T) {
			_, err := c.LeaseCredential(ctx, read)
			wantStatus(t, err, codes.PermissionDenied)
		})
	}
	_, err = publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{JobId: j.GetJobId(), Resource: "mirrored"})
	wantStatus(t, err, codes.InvalidArgument, "purpose")
	_, err = publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: 7, JobId: j.GetJobId(), Resource: "mirrored"})
	wantStatus(t, err, codes.InvalidArgument, "purpose")
	_, err = publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ, JobId: j.GetJobId(), Resource: "demo"})
	wantStatus(t, err, codes.PermissionDenied, "resource:")

	lr, err := publisher.LeaseCredential(ctx, read)
	if err != nil {
		t.Fatalf("read lease of an approved result: %v", err)
	}
	l := lr.GetLease()
	if l.GetPurpose() != authorityv1.LeasePurpose_LEASE_PURPOSE_READ || l.GetHolder() != publisherID.String() || l.GetJobId() != j.GetJobId() ||
		l.GetResource() != "mirrored" || l.GetRevokedAt() != nil {
		t.Errorf("lease = %v", l)
	}
	if d := l.GetExpiresAt().AsTime().Sub(l.GetIssuedAt().AsTime()); d <= 0 || d > approvals.MaxLeaseTTL {
		t.Errorf("an hour's TTL gave a lease of %v, want at most %v", d, approvals.MaxLeaseTTL)
	}
	if bytes.Contains(lr.GetSealedCredential(), []byte(secret)) {
		t.Fatal("the source credential travels in the clear")
	}
	cert, key := h.publisherKey()
	got, err := seal.Open(cert, key, approvals.LeaseContext(l.GetLeaseId(), j.GetJobId(), "mirrored"), lr.GetSealedCredential())
	if err != nil || string(got) != secret {
		t.Fatalf("the publisher opens its read credential: %q, %v; want the repository's source credential", got, err)
	}
	if _, err := seal.Open(cert, key, approvals.LeaseContext(l.GetLeaseId(), j.GetJobId(), "demo"), lr.GetSealedCredential()); err == nil {
		t.Error("the sealed credential opened under another resource's context")
	}
	// Approved is not consumed: still no deploy lease.
	_, err = publisher.LeaseCredential(ctx, deploy)
	wantStatus(t, err, codes.FailedPrecondition, "approved, not consumed")

	// Once the publisher consumed it, reading still works; a deploy lease
	// wants the deploy credential, which mirrored has none of, and never
	// falls back to the source credential.
	if _, err := publisher.ConsumeApproval(ctx, &authorityv1.ConsumeApprovalRequest{ApprovalId: aid, JobId: j.GetJobId(), BundleDigest: digestA,
		Target: &typesv1.PublishTarget{Repository: "mirrored", Branch: "main"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := publisher.LeaseCredential(ctx, read); err != nil {
		t.Errorf("read lease after the publisher consumed: %v", err)
	}
	dr, err := publisher.LeaseCredential(ctx, deploy)
	wantStatus(t, err, codes.FailedPrecondition, "no deploy credential")
	if len(dr.GetSealedCredential()) != 0 {
		t.Error("a refused deploy lease carried a credential")
	}
	if strings.Contains(h.logs.String(), secret) {
		t.Error("the source credential reached the log")
	}

	// Denied: no read lease.
	j2 := h.finishedPublishingTo("denied", "mirrored")
	if _, err := bob.DecideApproval(ctx, vote(j2.GetApprovalId(), authorityv1.Decision_DECISION_DENY, "not this")); err != nil {
		t.Fatal(err)
	}
	_, err = publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ, JobId: j2.GetJobId(), Resource: "mirrored"})
	wantStatus(t, err, codes.FailedPrecondition, "denied, not approved")

	// A repository without a source credential has nothing to read with.
	j3 := h.finishedWithTarget("no-credential")
	if _, err := alice.DecideApproval(ctx, vote(j3.GetApprovalId(), authorityv1.Decision_DECISION_APPROVE, "")); err != nil {
		t.Fatal(err)
	}
	_, err = publisher.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ, JobId: j3.GetJobId(), Resource: "demo"})
	wantStatus(t, err, codes.FailedPrecondition, "no source credential")
	if strings.Contains(h.logs.String(), deploySecret) {
		t.Error("the deploy credential reached the log")
	}
}

// TestReadLeaseEndsWithTheApproval: a read lease never outlives the
// approval it was issued under, and none is issued once that expired.
func TestReadLeaseEndsWithTheApproval(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	h.reconfigure(func() { h.tenants["dev"].Approvals.TTL = 4 * time.Second })
	publisher := h.client(publisherID)
	j := h.finishedPublishingTo("expiring", "mirrored")
	dr, err := h.client(aliceID).DecideApproval(ctx, vote(j.GetApprovalId(), authorityv1.Decision_DECISION_APPROVE, ""))
	if err != nil {
		t.Fatal(err)
	}
	expires := dr.GetApproval().GetExpiresAt().AsTime()
	read := &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ, JobId: j.GetJobId(), Resource: "mirrored"}
	lr, err := publisher.LeaseCredential(ctx, read)
	if err != nil {
		t.Fatalf("read lease of an approved result: %v", err)
	}
	if got := lr.GetLease().GetExpiresAt().AsTime(); got.After(expires) {
		t.Errorf("read lease expires %v, after its approval's %v", got, expires)
	}
	time.Sleep(time.Until(expires) + 50*time.Millisecond)
	_, err = publisher.LeaseCredential(ctx, read)
	wantStatus(t, err, codes.FailedPrecondition, "expired, not approved")
	spec, err := publisher.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: j.GetApprovalId()})
	if err != nil || spec.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_EXPIRED {
		t.Errorf("spec of an expired approval: %v, %v; want state expired", spec.GetApproval(), err)
	}
}

func TestPublisherListsOnlyItsLeases(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	j := h.finishedPublishingTo("mine", "mirrored")
	if _, err := h.client(aliceID).DecideApproval(ctx, vote(j.GetApprovalId(), authorityv1.Decision_DECISION_APPROVE, "")); err != nil {
		t.Fatal(err)
	}
	lr, err := h.client(publisherID).LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_READ,
		JobId: j.GetJobId(), Resource: "mirrored"})
	if err != nil {
		t.Fatal(err)
	}
	mine := lr.GetLease().GetLeaseId()

	// A lease of the same job held by another principal: a publisher of
	// another trust domain, which the filter must tell apart by its full ID.
	h.auth.stop()
	st, err := sqlite.Open(ctx, filepath.Join(h.data, "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	foreign := "spiffe://other.test/service/publisher"
	now := time.Now()
	theirs, err := st.CreateLeaseAudited(ctx, store.Lease{ID: "foreign-lease", Purpose: approvals.PurposeDeploy, JobID: j.GetJobId(), Resource: "mirrored",
		Holder: foreign, IssuedAt: now, ExpiresAt: now.Add(10 * time.Minute)},
		audit.Event{Time: now, Kind: audit.KindLeaseIssued, Caller: foreign, Subject: "foreign-lease", Tenant: "dev", Outcome: "allowed"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	h.start()

	all, err := h.client(aliceID).ListLeases(ctx, &authorityv1.ListLeasesRequest{})
	if err != nil || len(all.GetLeases()) != 2 {
		t.Fatalf("the approver lists %v, %v; want both leases", all.GetLeases(), err)
	}
	for _, q := range []*authorityv1.ListLeasesRequest{{}, {IncludeInactive: true}, {JobId: j.GetJobId(), IncludeInactive: true}} {
		got, err := h.client(publisherID).ListLeases(ctx, q)
		if err != nil {
			t.Fatalf("the publisher lists (%v): %v", q, err)
		}
		var ids []string
		for _, l := range got.GetLeases() {
			ids = append(ids, l.GetLeaseId())
			if l.GetHolder() != publisherID.String() {
				t.Errorf("the publisher lists (%v) lease %s held by %s", q, l.GetLeaseId(), l.GetHolder())
			}
		}
		if !slices.Equal(ids, []string{mine}) {
			t.Errorf("the publisher lists (%v) %v; want only its own %s, not %s", q, ids, mine, theirs.ID)
		}
	}

	for name, c := range map[string]authorityv1.AuthorityServiceClient{"client": h.client(devID), "executor": h.client(executorID), "pipeline": h.withPipeline()} {
		t.Run(name, func(t *testing.T) {
			_, err := c.ListLeases(ctx, &authorityv1.ListLeasesRequest{})
			wantStatus(t, err, codes.PermissionDenied)
		})
	}
}
