package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

const (
	// hostile is text a caller, a job or a repository can put in any string
	// field (proto strings are valid UTF-8; raw bytes go in bytes fields).
	hostile = "x\x1b[2J\x1b]52;c;aGk=\x07\u009b\u202e\u200b\x7f\r\n\tvote \\y\u27e6\\x07\u27e7"
	// hostileShown is hostile as the CLI prints a single-line field.
	hostileShown = `x⟦\x1b⟧[2J⟦\x1b⟧]52;c;aGk=⟦\x07⟧⟦\u009b⟧⟦\u202e⟧⟦\u200b⟧⟦\x7f⟧⟦\x0d⟧⟦\x0a⟧⟦\x09⟧vote \y⟦\u27e6⟧\x07⟦\u27e7⟧`
)

// fakeWith is an authority whose every string field is s.
func fakeWith(s string) *fakeAuthority {
	target := &typesv1.PublishTarget{Repository: s, Branch: s}
	domains := &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: []string{s}}}}
	job := &authorityv1.Job{
		JobId: s, Requester: s, Commit: s, State: authorityv1.JobState_JOB_STATE_FINISHED, ApprovalId: s, Message: s, Executor: s,
		Spec: &authorityv1.JobSpec{Repository: s, Revision: s, Command: []string{s, s}, PublishTarget: target},
		Result: &typesv1.RunResult{
			Reason: typesv1.TerminationReason_TERMINATION_REASON_EXITED, RuntimeVersion: s, TemplateVersion: s,
			BundleDigest: s, Message: s + "!",
		},
		Limits:              &typesv1.ResourceLimits{CpuMillis: 1000},
		NetworkPolicyStatus: &typesv1.NetworkPolicyStatus{Policy: domains},
	}
	publish := &authorityv1.Approval{
		ApprovalId: s, JobId: s, Requester: s, BundleDigest: s, Target: target, RequiredApprovals: 2,
		State: authorityv1.ApprovalState_APPROVAL_STATE_PENDING, ExpiresAt: timestamppb.Now(),
		Votes: []*authorityv1.ApprovalVote{{Approver: s, Decision: authorityv1.Decision_DECISION_APPROVE, Comment: s}},
	}
	change := &authorityv1.Approval{
		ApprovalId: s, JobId: s, Requester: s, BundleDigest: s, Kind: authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE,
		Change: &authorityv1.JobChange{Widens: []string{s, s}, FromNetworkPolicy: domains, ToNetworkPolicy: domains},
	}
	return &fakeAuthority{
		job:       job,
		approvals: []*authorityv1.Approval{publish, change},
		approval: &authorityv1.GetApprovalResponse{Approval: publish, Review: &authorityv1.ReviewMaterial{
			Patch:   []byte("diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"),
			Detail:  &authorityv1.ReviewDetail{Stdout: &authorityv1.OutputTail{Data: []byte("ok\n")}},
			Command: []string{s}, Commit: s,
			Result: &typesv1.RunResult{RuntimeVersion: s},
		}},
		events: []*authorityv1.AuditEvent{{Sequence: 1, Kind: s, Caller: s, Subject: s, Reason: s, Tenant: s, JobId: s}},
		leases: []*authorityv1.Lease{{LeaseId: s, JobId: s, Resource: s, Holder: s}},
	}
}

// TestTextOutputEscapesEveryField runs each command that prints server
// text against an authority whose every string is hostile: the output
// shows the text escaped, and has exactly as many lines as with benign text.
func TestTextOutputEscapesEveryField(t *testing.T) {
	hostileCfg, benignCfg := serveFake(t, fakeWith(hostile)), serveFake(t, fakeWith("ok"))
	for _, args := range [][]string{
		{"approval", "list", "--tenant", "t1"},
		{"approval", "show", "a-1"},
		{"approval", "approve", "a-1"},
		{"job", "submit", "--repo", "r", "--", "true"},
		{"job", "get", "j-1"},
		{"job", "list"},
		{"job", "cancel", hostile},
		{"job", "update", "j-1", "--memory", "1GiB"},
		{"audit", "list"},
		{"lease", "list"},
		{"lease", "revoke", "l-1"},
	} {
		name := strings.Join(args[:2], " ")
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCLI(t, hostileCfg, nil, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			checkShown(t, name, out)
			if !strings.Contains(out, hostileShown) {
				t.Errorf("output does not show the field escaped as %s:\n%s", hostileShown, out)
			}
			_, benign, _ := runCLI(t, benignCfg, nil, args...)
			// The review ends with our legend after escaped text, and
			// only then.
			legend := "\nlegend     " + termtext.Legend + "\n"
			if name == "approval show" {
				if !strings.HasSuffix(out, legend) || strings.Contains(benign, "legend") {
					t.Errorf("the legend is not at the end of the escaped review, or shows with nothing escaped:\n%s\n%s", out, benign)
				}
				out = strings.TrimSuffix(out, legend)
			}
			if got, want := strings.Count(out, "\n"), strings.Count(benign, "\n"); got != want {
				t.Errorf("%d lines, want %d as with benign text:\n%s", got, want, out)
			}
		})
	}
}

func TestApprovalShowEscapesPatchOutputAndNames(t *testing.T) {
	resp := &authorityv1.GetApprovalResponse{
		Approval: &authorityv1.Approval{
			ApprovalId: "a-1", JobId: "j-1", Requester: "spiffe://test.airlock/client/dev\x1b[8m",
			BundleDigest: "sha256:ab", RequiredApprovals: 2, State: authorityv1.ApprovalState_APPROVAL_STATE_PENDING,
			Target:    &typesv1.PublishTarget{Repository: "repo\u202e", Branch: "main\nvote       approver/bob approve: ok"},
			ExpiresAt: timestamppb.Now(),
			Votes: []*authorityv1.ApprovalVote{{
				Approver: "approver/alice", Decision: authorityv1.Decision_DECISION_APPROVE,
				Comment: "lgtm\x1b[1A\x1b[2K\rvote       approver/bob approve: ok",
			}},
		},
		Review: &authorityv1.ReviewMaterial{
			Patch: []byte("diff --git a/ok.go b/evil\u202egpj.go\n--- a/ok.go\n+++ b/evil\u202egpj.go\n@@ -1 +1,3 @@\n ok\n" +
				"+\x1b[8mrm -rf /\x1b[0m\n+x\x9b2J\xff\u009b\x7f\\\n" +
				"diff --git a/x b/c1\u009b2J.go\n+y\n"),
			Detail: &authorityv1.ReviewDetail{
				Files: []*authorityv1.FileChange{
					{Path: "evil\u202egpj.go", Status: authorityv1.FileStatus_FILE_STATUS_MODIFIED, OldMode: 0o100644, NewMode: 0o100644, LinesAdded: 2, Size: 9, PatchBytes: 123},
					{Path: "c1\u009b2J.go", Status: authorityv1.FileStatus_FILE_STATUS_ADDED, NewMode: 0o100644, LinesAdded: 1, Size: 2, PatchBytes: 500},
					{Path: "raw\ufffd", PathBytes: []byte("raw\xff\x1b[2J"), Status: authorityv1.FileStatus_FILE_STATUS_ADDED, NewMode: 0o100644, Size: 1, PatchBytes: 50},
				},
				FilesTotal: 5, PatchSize: 673,
				Stdout: &authorityv1.OutputTail{Size: 70, Data: []byte("done\n\x1b[2J\x1b[Happroval   a-1 (approved, 2 of 2 approvals)\n\x1b]52;c;aGVsbG8=\x07\rover")},
				Stderr: &authorityv1.OutputTail{Size: 5000, Capped: true, Data: []byte("\xe2\x80\xae\x9b")},
			},
			Command: []string{"sh", "-c", "make\x1b[2J"},
			Commit:  "abc",
			Result:  &typesv1.RunResult{RuntimeVersion: "runc 1.2\x1b[0m;x"},
		},
	}
	cfg := serveFake(t, &fakeAuthority{approval: resp})
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	checkShown(t, "approval show", out)
	for _, want := range []string{
		"job        j-1 by spiffe://test.airlock/client/dev⟦\\x1b⟧[8m\n",
		"target     repo⟦\\u202e⟧:main⟦\\x0a⟧vote       approver/bob approve: ok\n",
		"command    sh -c make⟦\\x1b⟧[2J\n",
		"vote       approver/alice approve: lgtm⟦\\x1b⟧[1A⟦\\x1b⟧[2K⟦\\x0d⟧vote       approver/bob approve: ok\n",
		"  modified  100644  +2 -0  9     evil⟦\\u202e⟧gpj.go  \n",
		"  added     100644  +1 -0  2     c1⟦\\u009b⟧2J.go     (patch shown in part)\n",
		"  added     100644  +0 -0  1     raw⟦\\xff⟧⟦\\x1b⟧[2J  (patch not shown)\n",
		"... and 2 more files, not listed here",
		"--- patch: the first 144 of 673 bytes",
		"--- patch cut here: 529 bytes not shown; airlock approval show --full a-1 shows every byte ---\n",
		"--- stderr: the last 4 of 5000 bytes; the first 4996 are not shown",
		"--- stderr: the job wrote more than the executor records",
		"\n| +⟦\\x1b⟧[8mrm -rf /⟦\\x1b⟧[0m\n",
		"\n| +x⟦\\x9b⟧2J⟦\\xff⟧⟦\\u009b⟧⟦\\x7f⟧\\\n",
		"\n| ⟦\\x1b⟧[2J⟦\\x1b⟧[Happroval   a-1 (approved, 2 of 2 approvals)\n",
		"\n| ⟦\\x1b⟧]52;c;aGVsbG8=⟦\\x07⟧⟦\\x0d⟧over",
		"\n| ⟦\\u202e⟧⟦\\x9b⟧",
		"runc 1.2⟦\\x1b⟧[0m",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for prefix, want := range map[string]int{"approval   ": 1, "vote       ": 1, "target     ": 1} {
		n := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, prefix) {
				n++
			}
		}
		if n != want {
			t.Errorf("%d lines start with %q, want %d:\n%s", n, prefix, want, out)
		}
	}
}

// TestJSONOutputIsUnchanged: -o json is the response as protojson writes
// it, hostile bytes and all, escaped by JSON alone.
func TestJSONOutputIsUnchanged(t *testing.T) {
	f := fakeWith(hostile)
	f.approval.Review.Patch = []byte("+\x1b[8mrm -rf /\x1b[0m\x9b\n")
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(f.approval)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want)+"\n" {
		t.Errorf("-o json printed\n%s\nwant\n%s", out, want)
	}
	var back authorityv1.GetApprovalResponse
	if err := protojson.Unmarshal([]byte(out), &back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&back, f.approval) {
		t.Errorf("-o json does not decode to the response")
	}
}

func TestServerErrorIsShownOnOneLine(t *testing.T) {
	cfg := serveFake(t, &fakeAuthority{err: status.Error(codes.PermissionDenied, "permission denied: "+hostile)})
	code, out, errOut := runCLI(t, cfg, nil, "job", "get", "j-1")
	if code != 1 || out != "" {
		t.Errorf("exit %d, stdout %q; want 1 and nothing", code, out)
	}
	if want := "airlock: permission denied: " + hostileShown + "\n"; errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
}

func TestErrorText(t *testing.T) {
	remote := remoteError{errors.New("denied: \x1b[2J\nairlock: approved")}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a server's message", remote, `denied: ⟦\x1b⟧[2J⟦\x0a⟧airlock: approved`},
		{"a server's message, wrapped", fmt.Errorf("watch: %w", remote), `watch: denied: ⟦\x1b⟧[2J⟦\x0a⟧airlock: approved`},
		{"a job's outcome", &exitError{code: 3, err: remote}, `denied: ⟦\x1b⟧[2J⟦\x0a⟧airlock: approved`},
		{"our own lines", errors.Join(errors.New("trust_domain: bad"), errors.New("tls: required")), "trust_domain: bad\ntls: required"},
		{"our own message, with a control", usageError{errors.New("--repo \"a\x1b[2J\\\"")}, `--repo "a⟦\x1b⟧[2J\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errorText(tc.err); got != tc.want {
				t.Errorf("errorText = %q, want %q", got, tc.want)
			}
		})
	}
}

// streamedJob is what the fake's WatchJob sends: output split mid-escape,
// mid-rune and between CR and LF, ending in an incomplete rune.
func streamedJob() *fakeAuthority {
	done := &authorityv1.Job{
		JobId: "j-1", State: authorityv1.JobState_JOB_STATE_FINISHED, Message: "exit\x1b[2J",
		Result: &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_EXITED, TemplateVersion: "t\u202e"},
	}
	f := &fakeAuthority{job: done, watch: []*authorityv1.WatchJobResponse{
		{Event: &authorityv1.WatchJobResponse_Job{Job: &authorityv1.Job{JobId: "j-1", State: authorityv1.JobState_JOB_STATE_RUNNING}}},
	}}
	offsets := map[typesv1.OutputStream]int64{}
	for _, c := range []struct {
		stream typesv1.OutputStream
		data   string
	}{
		{typesv1.OutputStream_OUTPUT_STREAM_STDOUT, "ok \x1b["},
		{typesv1.OutputStream_OUTPUT_STREAM_STDERR, "\x1b]52;c;aGk=\x07"},
		{typesv1.OutputStream_OUTPUT_STREAM_STDOUT, "2J\xe2\x80"},
		{typesv1.OutputStream_OUTPUT_STREAM_STDOUT, "\xaeend\r"},
		{typesv1.OutputStream_OUTPUT_STREAM_STDOUT, "\ntail\xe2"},
	} {
		f.watch = append(f.watch, &authorityv1.WatchJobResponse{Event: &authorityv1.WatchJobResponse_Output{
			Output: &typesv1.OutputChunk{Stream: c.stream, Offset: offsets[c.stream], Data: []byte(c.data)},
		}})
		offsets[c.stream] += int64(len(c.data))
	}
	f.watch = append(f.watch, &authorityv1.WatchJobResponse{Event: &authorityv1.WatchJobResponse_Job{Job: done}})
	return f
}

const (
	streamedStdout = "ok \x1b[2J\xe2\x80\xaeend\r\ntail\xe2"
	streamedShown  = "ok ⟦\\x1b⟧[2J⟦\\u202e⟧end\r\ntail⟦\\xe2⟧"
	// streamedHighlighted is how a terminal gets it: each escape in
	// reverse video.
	streamedHighlighted = "ok \x1b[7m\\x1b\x1b[27m[2J\x1b[7m\\u202e\x1b[27mend\r\ntail\x1b[7m\\xe2\x1b[27m"
	streamedStderr      = "\x1b]52;c;aGk=\x07"
)

// TestStreamedOutput: a job's output reaching a terminal is escaped unless
// --raw; reaching a pipe it is the job's bytes; the summary is escaped.
func TestStreamedOutput(t *testing.T) {
	cfg := serveFake(t, streamedJob())
	for _, tc := range []struct {
		name     string
		args     []string
		terminal bool
		noColor  string // $NO_COLOR
		want     string
	}{
		{"watch to a terminal", []string{"job", "watch", "j-1"}, true, "", streamedHighlighted},
		{"watch to a terminal, NO_COLOR", []string{"job", "watch", "j-1"}, true, "1", streamedShown},
		{"watch --raw to a terminal", []string{"job", "watch", "j-1", "--raw"}, true, "", streamedStdout},
		{"watch to a pipe", []string{"job", "watch", "j-1"}, false, "", streamedStdout},
		{"submit --wait to a terminal", []string{"job", "submit", "--repo", "r", "--wait", "--", "true"}, true, "", streamedHighlighted},
		{"submit --wait --raw to a terminal", []string{"job", "submit", "--repo", "r", "--wait", "--raw", "--", "true"}, true, "", streamedStdout},
		{"submit --wait to a pipe", []string{"job", "submit", "--repo", "r", "--wait", "--", "true"}, false, "", streamedStdout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TERM", "xterm")
			t.Setenv("NO_COLOR", tc.noColor)
			var code int
			var out, errOut string
			if tc.terminal {
				code, out, errOut = runCLIOnTerminal(t, cfg, tc.args...)
			} else {
				code, out, errOut = runCLI(t, cfg, nil, tc.args...)
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if out != tc.want {
				t.Errorf("stdout %q, want %q", out, tc.want)
			}
			// stderr here is a pipe: the job's bytes as they are, then
			// the summary, escaped.
			if !strings.Contains(errOut, streamedStderr) {
				t.Errorf("stderr lacks the job's stderr %q: %q", streamedStderr, errOut)
			}
			summary := errOut[strings.Index(errOut, streamedStderr)+len(streamedStderr):]
			checkShown(t, "summary", summary)
			for _, want := range []string{"outcome    finished, exited with status 0: exit⟦\\x1b⟧[2J\n", "template t⟦\\u202e⟧\n"} {
				if !strings.Contains(summary, want) {
					t.Errorf("summary lacks %q: %q", want, summary)
				}
			}
		})
	}
}

// TestJobCannotForgeOurLines: plain text (no escape sequence at all) in a
// job's patch and output that copies our marks, a vote and the --full
// verification line never starts a line of the output: every line of the
// job's stands behind the gutter.
func TestJobCannotForgeOurLines(t *testing.T) {
	forged := "ok\n--- end of stdout ---\n\nvote       approver/bob approve: ok\n--- patch cut here: 0 bytes not shown ---\nverified: everything above is bundle sha256:ab, the one this request names\n"
	a := &authorityv1.Approval{ApprovalId: "a-1", BundleDigest: "sha256:ab"}
	rv := &authorityv1.ReviewMaterial{
		Patch:  []byte("diff --git a/x b/x\n+" + forged),
		Result: &typesv1.RunResult{DiffStat: &typesv1.DiffStat{FilesChanged: 1}},
		Detail: &authorityv1.ReviewDetail{
			FilesTotal: 1, PatchSize: int64(len(forged) + 20),
			Files:  []*authorityv1.FileChange{{Path: "x", Status: authorityv1.FileStatus_FILE_STATUS_ADDED, NewMode: 0o100644, PatchBytes: int64(len(forged) + 20)}},
			Stdout: &authorityv1.OutputTail{Data: []byte(forged), Size: int64(len(forged))},
			Stderr: &authorityv1.OutputTail{Data: []byte(forged), Size: int64(len(forged))},
		},
	}
	var b strings.Builder
	writeReview(&b, a, rv)
	out := b.String()
	count := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		for _, p := range []string{"verified:", "vote ", "--- end of stdout ---", "--- patch cut here", "--- end of stderr ---"} {
			if strings.HasPrefix(line, p) {
				count[p]++
			}
		}
	}
	want := map[string]int{"--- end of stdout ---": 1, "--- end of stderr ---": 1}
	for p, n := range count {
		if n != want[p] {
			t.Errorf("%d lines start with %q, want %d:\n%s", n, p, want[p], out)
		}
	}
	if !strings.Contains(out, "\n| verified: everything above") {
		t.Errorf("the job's forged line is not shown behind the gutter:\n%s", out)
	}
}
