package cli

import (
	"slices"
	"strings"
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestSubmitCredentials: --credential NAME (repeatable, shared by job
// submit and session create) reaches the spec by name, in order; job get
// and session get print the names.
func TestSubmitCredentials(t *testing.T) {
	f := &fakeAuthority{job: &authorityv1.Job{JobId: "j1"}}
	cfg := serveFake(t, f)
	for _, args := range [][]string{
		{"job", "submit", "--repo", "demo", "--allow-domain", "api.github.com", "--credential", "github", "--credential", "npm", "--", "gh", "pr", "list"},
		{"session", "create", "--repo", "demo", "--allow-domain", "api.github.com", "--credential", "github", "--credential", "npm", "--no-wait"},
	} {
		n := len(f.specs)
		if code, _, errOut := runCLI(t, cfg, nil, args...); code != 0 {
			t.Fatalf("%q: %d %s", args, code, errOut)
		}
		if got := f.specs[n].GetCredentials(); !slices.Equal(got, []string{"github", "npm"}) {
			t.Errorf("%q: spec credentials %q, want [github npm]", args, got)
		}
	}

	job := &authorityv1.Job{JobId: "j1", State: authorityv1.JobState_JOB_STATE_RUNNING, Spec: &authorityv1.JobSpec{Credentials: []string{"github", "npm"}}}
	g := &fakeAuthority{job: job, session: &authorityv1.GetSessionResponse{Session: job}}
	cfg = serveFake(t, g)
	for _, args := range [][]string{{"job", "get", "j1"}, {"session", "get", "j1"}} {
		code, out, errOut := runCLI(t, cfg, nil, args...)
		if code != 0 || !strings.Contains(out, "credentials github, npm (brokered") {
			t.Errorf("%q: %d %q %s; want the credentials' names", args, code, out, errOut)
		}
	}
}

// TestShowStartApproval: approval show of a start request says what it is
// about: the queued job, its command and network policy, and each
// credential with its hosts; approval list says it is a start.
func TestShowStartApproval(t *testing.T) {
	a := &authorityv1.Approval{ApprovalId: "a1", JobId: "j1", Requester: "spiffe://airlock.test/client/dev", BundleDigest: "sha256:abcd",
		Kind: authorityv1.ApprovalKind_APPROVAL_KIND_START, State: authorityv1.ApprovalState_APPROVAL_STATE_PENDING, RequiredApprovals: 1,
		Start: &authorityv1.StartRequest{Credentials: []*authorityv1.StartCredential{
			{Name: "github", Hosts: []string{"api.github.com"}, ApprovalRequired: true},
			{Name: "npm", Hosts: []string{"*.npmjs.org"}},
		}}}
	rv := &authorityv1.ReviewMaterial{Command: []string{"gh", "pr", "list"}, Commit: "0123456789abcdef",
		NetworkPolicy: &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: []string{"api.github.com"}}}}}
	f := &fakeAuthority{approval: &authorityv1.GetApprovalResponse{Approval: a, Review: rv}, approvals: []*authorityv1.Approval{a}}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a1")
	for _, want := range []string{"start of   queued job j1", "command    gh pr list", "api.github.com",
		"credential github for api.github.com, approval required", "credential npm for *.npmjs.org\n"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("approval show: %d %s; output %q lacks %q", code, errOut, out, want)
		}
	}
	code, out, errOut = runCLI(t, cfg, nil, "approval", "list")
	if code != 0 || !strings.Contains(out, "start with credentials github (approval required), npm") {
		t.Errorf("approval list: %d %s %q", code, errOut, out)
	}
	if code, _, errOut := runCLI(t, cfg, nil, "approval", "show", "a1", "--full"); code != 2 || !strings.Contains(errOut, "no result bundle") {
		t.Errorf("approval show --full of a start: %d %q", code, errOut)
	}
}
