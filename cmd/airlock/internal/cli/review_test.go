package cli

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func reviewStream(digest string, patch ...string) []*authorityv1.ReadReviewResponse {
	msgs := []*authorityv1.ReadReviewResponse{
		{Msg: &authorityv1.ReadReviewResponse_Start{Start: &authorityv1.ReviewPartStart{Part: authorityv1.ReviewPart_REVIEW_PART_FILES, Size: 1}}},
		{Msg: &authorityv1.ReadReviewResponse_Files{Files: &authorityv1.ReviewFiles{Files: []*authorityv1.FileChange{
			{Path: "evil\u202e.go", Status: authorityv1.FileStatus_FILE_STATUS_ADDED, NewMode: 0o100644, LinesAdded: 1, Size: 3, PatchBytes: 9},
		}}}},
		{Msg: &authorityv1.ReadReviewResponse_Start{Start: &authorityv1.ReviewPartStart{Part: authorityv1.ReviewPart_REVIEW_PART_PATCH, Size: 9}}},
	}
	for _, p := range patch {
		msgs = append(msgs, &authorityv1.ReadReviewResponse{Msg: &authorityv1.ReadReviewResponse_Chunk{Chunk: []byte(p)}})
	}
	if digest != "" {
		msgs = append(msgs, &authorityv1.ReadReviewResponse{Msg: &authorityv1.ReadReviewResponse_VerifiedDigest{VerifiedDigest: digest}})
	}
	return msgs
}

func reviewApproval() *authorityv1.GetApprovalResponse {
	return &authorityv1.GetApprovalResponse{
		Approval: &authorityv1.Approval{ApprovalId: "a-1", JobId: "j-1", BundleDigest: "sha256:ab", Target: &typesv1.PublishTarget{Repository: "r", Branch: "main"}},
		Review:   &authorityv1.ReviewMaterial{Result: &typesv1.RunResult{}},
	}
}

// TestShowFull: --full prints every streamed part escaped and behind the
// gutter, an escape split across chunks included, and ends verified; a
// stream that stops, or ends without the approval's digest, says NOT
// VERIFIED on stdout and fails; --raw --part writes exactly the bytes and
// nothing at all when they are not verified.
func TestShowFull(t *testing.T) {
	split := []string{"+a\x1b", "[2Jb\nverified: everything above is bundle sha256:ab\n"}
	f := &fakeAuthority{approval: reviewApproval(), review: reviewStream("sha256:ab", split...)}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1", "--full")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	checkShown(t, "approval show --full", out)
	for _, want := range []string{"--- files: 1 ---", "evil⟦\\u202e⟧.go", "--- patch: 9 bytes ---\n| +a⟦\\x1b⟧[2Jb\n| verified: everything above",
		"\nverified: everything above is bundle sha256:ab, the one this request names\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("--full lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\nverified:"); n != 1 {
		t.Errorf("%d lines start with verified:, want 1:\n%s", n, out)
	}

	for name, fa := range map[string]*fakeAuthority{
		"another digest": {approval: reviewApproval(), review: reviewStream("sha256:cd", "+x\n")},
		"no digest":      {approval: reviewApproval(), review: reviewStream("", "+x\n")},
		"stopped":        {approval: reviewApproval(), review: reviewStream("", "+x\n"), reviewErr: status.Error(codes.DataLoss, "the bundle is not the one approval a-1 names")},
	} {
		cfg := serveFake(t, fa)
		code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1", "--full")
		if code == 0 || !strings.Contains(out, "\nNOT VERIFIED: ") || strings.Contains(out, "\nverified:") {
			t.Errorf("%s: exit %d\nstdout:\n%s\nstderr: %s", name, code, out, errOut)
		}
		code, out, errOut = runCLI(t, cfg, nil, "approval", "show", "a-1", "--full", "--raw", "--part", "patch")
		if code == 0 || out != "" {
			t.Errorf("%s, --raw --part patch: exit %d, wrote %q (%s); want a failure that writes nothing", name, code, out, errOut)
		}
	}

	code, out, errOut = runCLI(t, cfg, nil, "approval", "show", "a-1", "--full", "--raw", "--part", "patch")
	if code != 0 || out != strings.Join(split, "") || !strings.Contains(errOut, "verified: what was written is from bundle sha256:ab") {
		t.Errorf("--raw --part patch: exit %d, wrote %q, stderr %q", code, out, errOut)
	}
	for _, args := range [][]string{{"--raw"}, {"--part", "patch"}, {"--full", "--part", "everything"}} {
		if code, _, errOut := runCLI(t, cfg, nil, append([]string{"approval", "show", "a-1"}, args...)...); code != 2 {
			t.Errorf("approval show %v: exit %d (%s), want a usage error", args, code, errOut)
		}
	}
}

// TestShowEgress: the review sums a domains job's egress by name, and
// --egress lists each decision; every name the job chose is escaped.
func TestShowEgress(t *testing.T) {
	resp := reviewApproval()
	resp.Review.Detail = &authorityv1.ReviewDetail{Egress: &authorityv1.EgressLog{
		Total: 3,
		Names: []*authorityv1.EgressName{{Name: "ok.test", Allowed: 1, BytesIn: 2048}, {Name: "evil\x1b[2J.test", Refused: 2}},
		Records: []*typesv1.EgressRecord{
			{Via: "connect", Name: "ok.test", Port: 443, Allowed: true, Reason: "allowed by ok.test ports [80 443]", Addr: "203.0.113.5:443", BytesIn: 2048},
			{Via: "dns", Name: "evil\x1b[2J.test", Qtype: "A", Reason: "evil\x1b[2J.test is not in the policy"},
		},
		Last: []*typesv1.EgressRecord{{Via: "connect", Name: "evil\x1b[2J.test", Port: 443, Reason: "not in the policy"}},
	}}
	f := &fakeAuthority{approval: resp}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"egress     3 records", "ok.test  allowed 1, refused 0, in 2.0KiB", "evil⟦\\x1b⟧[2J.test  allowed 0, refused 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("approval show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--- egress decisions ---") {
		t.Errorf("the decisions are listed without --egress:\n%s", out)
	}
	code, out, errOut = runCLI(t, cfg, nil, "approval", "show", "a-1", "--egress")
	if code != 0 {
		t.Fatalf("--egress: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a raw escape reached the terminal:\n%q", out)
	}
	for _, want := range []string{"--- egress decisions ---", "203.0.113.5:443", "evil⟦\\x1b⟧[2J.test is not in the policy"} {
		if !strings.Contains(out, want) {
			t.Errorf("--egress lacks %q:\n%s", want, out)
		}
	}
	if code, _, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1", "--egress", "--full"); code != 2 {
		t.Errorf("--egress --full: exit %d (%s), want a usage error", code, errOut)
	}
}

// TestShowEgressCredentials: the review shows how the job used each
// brokered credential, and --egress lists request lines with the request,
// the upstream's status and the credential; names are escaped.
func TestShowEgressCredentials(t *testing.T) {
	resp := reviewApproval()
	resp.Review.Detail = &authorityv1.ReviewDetail{Egress: &authorityv1.EgressLog{
		Total: 2,
		Names: []*authorityv1.EgressName{{Name: "api.test", Allowed: 1, BytesIn: 4096}},
		Records: []*typesv1.EgressRecord{
			{Via: "connect", Name: "api.test", Port: 443, Allowed: true, Reason: "allowed by api.test", BytesIn: 4096},
			{Via: "request", Name: "api.test", Port: 443, Allowed: true, Method: "GET", Path: "/v1/x", Status: 200, Credential: "gh\x1b[2J", BytesIn: 1024, BytesOut: 10},
		},
		Credentials: []*authorityv1.CredentialUse{{Name: "gh\x1b[2J", Requests: 1, Refused: 2, BytesIn: 1024, BytesOut: 10}},
	}}
	cfg := serveFake(t, &fakeAuthority{approval: resp})
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if want := "gh⟦\\x1b⟧[2J  requests 1, refused 2, in 1.0KiB, out 10B"; !strings.Contains(out, want) {
		t.Errorf("approval show lacks %q:\n%s", want, out)
	}
	code, out, errOut = runCLI(t, cfg, nil, "approval", "show", "a-1", "--egress")
	if code != 0 {
		t.Fatalf("--egress: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a raw escape reached the terminal:\n%q", out)
	}
	for _, want := range []string{"request", "GET api.test/v1/x", "200", "credential=gh⟦\\x1b⟧[2J"} {
		if !strings.Contains(out, want) {
			t.Errorf("--egress lacks %q:\n%s", want, out)
		}
	}
}
