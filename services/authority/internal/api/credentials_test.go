package api_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// domains is a domains network policy over names (ports 80 and 443).
func domains(names ...string) *typesv1.NetworkPolicy {
	return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: names}}}
}

// credSpec is a plain job asking for brokered credentials over a domains
// policy reaching names.
func credSpec(creds []string, names ...string) *authorityv1.JobSpec {
	s := spec()
	s.Credentials = creds
	s.NetworkPolicy = domains(names...)
	return s
}

// Brokered credentials a job asks for: names of the tenant's policy, each
// once, whose hosts the job's network policy reaches on 443, not under
// vm; refusals name the field and the credential, never a value.
func TestSubmitCredentialsRefused(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	many := make([]string, 17)
	for i := range many {
		many[i] = "goproxy"
	}
	vm := credSpec([]string{"goproxy"}, "proxy.golang.org")
	vm.RuntimeClass = typesv1.RuntimeClass_RUNTIME_CLASS_VM
	ports := credSpec([]string{"goproxy"}, "proxy.golang.org")
	ports.NetworkPolicy.GetDomains().Ports = []uint32{80}
	for _, tc := range []struct {
		name string
		spec *authorityv1.JobSpec
		want []string
	}{
		{"unknown name", credSpec([]string{"goproxy", "nosuch"}, "proxy.golang.org"), []string{"spec.credentials[1]", `"nosuch"`, "deploybot, goproxy, wild"}},
		{"listed twice", credSpec([]string{"goproxy", "goproxy"}, "proxy.golang.org"), []string{"spec.credentials[1]", "listed twice"}},
		{"too many", credSpec(many, "proxy.golang.org"), []string{"spec.credentials", "17 given, at most 16"}},
		{"host not in the job's policy", credSpec([]string{"goproxy", "deploybot"}, "proxy.golang.org"), []string{"spec.credentials[1]", `"deploybot"`, "api.example.com"}},
		{"deny-all job", credSpec([]string{"goproxy"}), []string{"spec.credentials[0]", "proxy.golang.org"}},
		{"not on 443", ports, []string{"spec.credentials[0]", "port 443"}},
		{"a wildcard host needs the wildcard", credSpec([]string{"wild"}, "api.example.com"), []string{"spec.credentials[0]", "*.example.com"}},
		{"vm", vm, []string{"spec.credentials: not supported under runtime vm yet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "deny-all job" {
				tc.spec.NetworkPolicy = nil
			}
			_, err := dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: tc.spec, IdempotencyKey: "refused-" + tc.name})
			wantStatus(t, err, codes.InvalidArgument, tc.want...)
			if err != nil && (strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), deploySecret)) {
				t.Errorf("the refusal holds a credential's value: %v", err)
			}
		})
	}
}

// A job asking for credentials none of which needs approval runs at once;
// its grant and its record carry the names, never a value, and the same
// key with other credentials is another spec.
func TestSubmitCredentialsGranted(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	s := credSpec([]string{"goproxy", "wild"}, "proxy.golang.org", "*.example.com")
	j := h.submit(dev, "creds", s).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	gs := h.fake.Grants(j.GetJobId())
	if len(gs) == 0 || !slices.Equal(gs[0].GetCredentials(), []string{"goproxy", "wild"}) {
		t.Fatalf("grants = %v, want the credentials' names", gs)
	}
	got, err := dev.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: j.GetJobId()})
	if err != nil || !slices.Equal(got.GetJob().GetSpec().GetCredentials(), []string{"goproxy", "wild"}) {
		t.Fatalf("GetJob = %v, %v; want the credentials in its spec", got, err)
	}
	again := credSpec([]string{"goproxy"}, "proxy.golang.org", "*.example.com")
	_, err = dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: again, IdempotencyKey: "creds"})
	wantStatus(t, err, codes.AlreadyExists, "different spec")
	if r := h.submit(dev, "creds", s); r.GetCreated() || r.GetJob().GetJobId() != j.GetJobId() {
		t.Fatalf("the same spec again = %v", r)
	}
}

// startApproval finds job id's start approval as approver c sees it.
func (h *harness) startApproval(c authorityv1.AuthorityServiceClient, id string) *authorityv1.GetApprovalResponse {
	h.t.Helper()
	list, err := c.ListApprovals(h.t.Context(), &authorityv1.ListApprovalsRequest{Tenant: "dev"})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, a := range list.GetApprovals() {
		if a.GetJobId() == id && a.GetKind() == authorityv1.ApprovalKind_APPROVAL_KIND_START {
			ga, err := c.GetApproval(h.t.Context(), &authorityv1.GetApprovalRequest{ApprovalId: a.GetApprovalId()})
			if err != nil {
				h.t.Fatal(err)
			}
			return ga
		}
	}
	h.t.Fatalf("job %s has no start approval among %v", id, list.GetApprovals())
	return nil
}

// A job asking for an approval: required credential waits, queued and
// never handed to an executor, for its start approval; its requester
// cannot approve it, another approver can, and then it runs.
func TestStartApprovalGate(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev, alice, devAppr := h.client(devID), h.client(aliceID), h.client(devApproverID)
	s := credSpec([]string{"goproxy", "deploybot"}, "proxy.golang.org", "api.example.com")
	j := h.submit(dev, "gated", s).GetJob()
	id := j.GetJobId()
	if j.GetState() != authorityv1.JobState_JOB_STATE_QUEUED {
		t.Fatalf("submitted job = %v", j)
	}
	ga := h.startApproval(alice, id)
	a := ga.GetApproval()
	want := []*authorityv1.StartCredential{
		{Name: "goproxy", Hosts: []string{"proxy.golang.org"}},
		{Name: "deploybot", Hosts: []string{"api.example.com"}, ApprovalRequired: true},
	}
	cs := a.GetStart().GetCredentials()
	if a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING || a.GetRequester() != devID.String() || a.GetTarget() != nil || len(cs) != 2 ||
		cs[0].GetName() != want[0].GetName() || !slices.Equal(cs[0].GetHosts(), want[0].GetHosts()) || cs[0].GetApprovalRequired() ||
		cs[1].GetName() != want[1].GetName() || !slices.Equal(cs[1].GetHosts(), want[1].GetHosts()) || !cs[1].GetApprovalRequired() {
		t.Fatalf("start approval = %v", a)
	}
	if rv := ga.GetReview(); !slices.Equal(rv.GetCommand(), []string{"make", "test"}) || rv.GetNetworkPolicy().GetDomains() == nil || rv.GetCommit() == "" {
		t.Fatalf("review = %v, want the job's command, policy and commit", rv)
	}
	eventually(t, "the job to say it waits for its approval", func() bool {
		got, err := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
		return err == nil && strings.Contains(got.GetJob().GetMessage(), "start approval")
	})
	if h.fake.Attempts(id) != 0 {
		t.Fatal("the executor got the job before its start approval")
	}

	approve := &authorityv1.DecideApprovalRequest{ApprovalId: a.GetApprovalId(), BundleDigest: a.GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE}
	_, err := devAppr.DecideApproval(ctx, approve)
	wantStatus(t, err, codes.PermissionDenied, "may not decide")
	if h.fake.Attempts(id) != 0 {
		t.Fatal("the executor got the job after its requester's vote")
	}
	if _, err := alice.DecideApproval(ctx, approve); err != nil {
		t.Fatalf("alice approves: %v", err)
	}
	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_RUNNING)
	eventually(t, "the start approval to be spent", func() bool {
		return h.startApproval(alice, id).GetApproval().GetState() == authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED
	})
}

// A denied start approval ends its job, cancelled, and it never runs.
func TestStartApprovalDenied(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev, bob := h.client(devID), h.client(bobID)
	j := h.submit(dev, "denied", credSpec([]string{"deploybot"}, "api.example.com")).GetJob()
	a := h.startApproval(bob, j.GetJobId()).GetApproval()
	if _, err := bob.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: a.GetApprovalId(), BundleDigest: a.GetBundleDigest(),
		Decision: authorityv1.Decision_DECISION_DENY, Comment: "not this week"}); err != nil {
		t.Fatal(err)
	}
	got := h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_CANCELLED)
	if !strings.Contains(got.GetMessage(), "start approval") || !strings.Contains(got.GetMessage(), "denied") {
		t.Fatalf("message = %q", got.GetMessage())
	}
	if h.fake.Attempts(j.GetJobId()) != 0 || h.fake.HasRun(j.GetJobId()) {
		t.Fatal("a denied job reached the executor")
	}
}

// A start approval that expires undecided ends its job, cancelled, and it
// never runs; the wait outlives the tenant's start deadline.
func TestStartApprovalExpired(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{approvalTTL: 2 * time.Second, startDeadline: time.Second, grantTTL: time.Second})
	dev := h.client(devID)
	j := h.submit(dev, "expires", credSpec([]string{"deploybot"}, "api.example.com")).GetJob()
	time.Sleep(1500 * time.Millisecond)
	if got, err := dev.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: j.GetJobId()}); err != nil || got.GetJob().GetState() != authorityv1.JobState_JOB_STATE_QUEUED {
		t.Fatalf("past its start deadline, waiting for its approval: %v, %v; want it queued", got, err)
	}
	got := h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_CANCELLED)
	if !strings.Contains(got.GetMessage(), "start approval") || !strings.Contains(got.GetMessage(), "expired") {
		t.Fatalf("message = %q", got.GetMessage())
	}
	if h.fake.Attempts(j.GetJobId()) != 0 {
		t.Fatal("an expired job reached the executor")
	}
}

// A job approved after its grant expired and past its start deadline
// from submission still runs: the deadline counts from the approval, and
// the same decision is granted again for the executor it is placed on.
func TestStartApprovalAfterDeadline(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{startDeadline: time.Second, grantTTL: time.Second})
	ctx := t.Context()
	dev, alice := h.client(devID), h.client(aliceID)
	j := h.submit(dev, "late", credSpec([]string{"deploybot"}, "api.example.com")).GetJob()
	a := h.startApproval(alice, j.GetJobId()).GetApproval()
	time.Sleep(2 * time.Second)
	if _, err := alice.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: a.GetApprovalId(), BundleDigest: a.GetBundleDigest(),
		Decision: authorityv1.Decision_DECISION_APPROVE}); err != nil {
		t.Fatal(err)
	}
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
}
