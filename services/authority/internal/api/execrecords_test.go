package api_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestExecRecordsAtTheAuthority: the authority records every exec it is
// asked for before the executor sees it, refuses another spec under a used
// id without asking the executor (also when the executor is gone), and
// answers GetExec and GetSession from its own records, marked stale, once
// the executor is gone, across its own restart too.
func TestExecRecordsAtTheAuthority(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev := h.client(devID)
	sid := h.runningSession("execs", nil).GetJobId()
	build := &typesv1.ExecSpec{ExecId: "build", Argv: []string{"make", "build"}, Env: map[string]string{"V": "1"}, Stdin: []byte("in")}
	start := func(x *typesv1.ExecSpec) (*authorityv1.StartExecResponse, error) {
		return dev.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: sid, Spec: x})
	}

	resp, err := start(build)
	if err != nil || !resp.GetCreated() || resp.GetExec().GetState() != typesv1.ExecState_EXEC_STATE_ENDED {
		t.Fatalf("StartExec: %v, %v", resp, err)
	}
	if resp, err := start(build); err != nil || resp.GetCreated() || resp.GetExec().GetSeq() != 1 {
		t.Fatalf("a retry with the same spec: %v, %v", resp, err)
	}
	if n := h.fake.ExecAsks(sid); n != 2 {
		t.Fatalf("the executor was asked %d times, want 2 (the request and its retry)", n)
	}
	other := func(f func(x *typesv1.ExecSpec)) *typesv1.ExecSpec {
		x := &typesv1.ExecSpec{ExecId: build.ExecId, Argv: slices.Clone(build.Argv), Env: map[string]string{"V": "1"}, Stdin: build.Stdin}
		f(x)
		return x
	}
	differing := []struct {
		field string
		spec  *typesv1.ExecSpec
	}{
		{"spec.argv", other(func(x *typesv1.ExecSpec) { x.Argv = []string{"rm", "-rf", "/work"} })},
		{"spec.env", other(func(x *typesv1.ExecSpec) { x.Env = map[string]string{"V": "2"} })},
		{"spec.cwd", other(func(x *typesv1.ExecSpec) { x.Cwd = "/work/sub" })},
		{"spec.stdin", other(func(x *typesv1.ExecSpec) { x.Stdin = []byte("other") })},
	}
	for _, d := range differing {
		_, err := start(d.spec)
		wantStatus(t, err, codes.AlreadyExists, `spec.exec_id "build"`, d.field)
	}
	if n := h.fake.ExecAsks(sid); n != 2 {
		t.Fatalf("a changed spec under a used id reached the executor (%d asks)", n)
	}
	if got, err := dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "build"}); err != nil || got.GetStale() {
		t.Fatalf("GetExec with the executor up: %v, %v", got, err)
	}

	// The executor goes away.
	h.stopExec()
	_, err = start(&typesv1.ExecSpec{ExecId: "lost", Argv: []string{"make", "test"}})
	wantStatus(t, err, codes.Unavailable)
	for _, d := range differing {
		_, err := start(d.spec)
		wantStatus(t, err, codes.AlreadyExists, d.field)
	}
	check := func(when string) {
		t.Helper()
		got, err := dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "build"})
		x := got.GetExec()
		if err != nil || !got.GetStale() || x.GetState() != typesv1.ExecState_EXEC_STATE_ENDED || x.GetReason() != typesv1.TerminationReason_TERMINATION_REASON_EXITED ||
			x.GetExitCode() != 0 || x.GetSeq() != 1 || !slices.Equal(x.GetSpec().GetArgv(), build.Argv) || x.GetSpec().GetEnv()["V"] != "1" ||
			x.GetStdinSize() != 2 || x.GetStdoutSize() == 0 || x.GetStartedAt() == nil || x.GetEndedAt() == nil {
			t.Fatalf("%s: GetExec(build) = %v, %v; want the authority's record, stale", when, got, err)
		}
		lost, err := dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "lost"})
		if err != nil || !lost.GetStale() || lost.GetExec().GetState() != typesv1.ExecState_EXEC_STATE_REQUESTED {
			t.Fatalf("%s: GetExec(lost) = %v, %v; want requested, stale", when, lost, err)
		}
		_, err = dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "never"})
		wantStatus(t, err, codes.Unavailable)
		gs, err := dev.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: sid})
		if err != nil || !gs.GetExecsStale() || gs.GetExecsTotal() != 2 || len(gs.GetExecs()) != 2 ||
			gs.GetExecs()[0].GetSpec().GetExecId() != "build" || gs.GetExecs()[1].GetSpec().GetExecId() != "lost" {
			t.Fatalf("%s: GetSession = %v, %v; want both execs from the authority's records, stale", when, gs, err)
		}
	}
	check("executor gone")
	h.restart()
	dev = h.client(devID)
	check("executor gone, authority restarted")

	k := h.auditKinds(sid)
	if k["exec.requested/ALLOWED"] != 3 || k["exec.requested/DENIED"] == 0 {
		t.Errorf("audit of the exec requests: %v", k)
	}
}

// TestFinalReportFillsExecRecords: the session's final report, which
// carries every exec, brings the authority's records to their end,
// including an exec it never saw asked; one reported cut short is
// recorded without a spec digest, so a retry under its id is left to the
// executor rather than refused on a partial spec.
func TestFinalReportFillsExecRecords(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev := h.client(devID)
	sid := h.runningSession("report", nil).GetJobId()
	h.stopExec()
	late := &typesv1.ExecSpec{ExecId: "late", Argv: []string{"make", "test"}}
	_, err := dev.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: sid, Spec: late})
	wantStatus(t, err, codes.Unavailable)

	now := timestamppb.Now()
	detail := noFiles()
	detail.Execs = []*typesv1.Exec{
		{SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: "late", Argv: late.Argv}, Seq: 1, State: typesv1.ExecState_EXEC_STATE_ENDED,
			Reason: typesv1.TerminationReason_TERMINATION_REASON_EXITED, ExitCode: 3, StartedAt: now, EndedAt: now, StdoutSize: 7,
			StdinSha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: "unseen", Argv: []string{"echo", "cut"}}, Seq: 2, SpecCut: true, State: typesv1.ExecState_EXEC_STATE_ENDED,
			Reason: typesv1.TerminationReason_TERMINATION_REASON_CANCELLED, ExitCode: -1, StartedAt: now, EndedAt: now},
	}
	detail.ExecsTotal = 2
	if _, err := h.client(executorID).ReportResult(ctx, &authorityv1.ReportResultRequest{JobId: sid, Detail: detail,
		Result: &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_FINISHED, BundleDigest: digestA, RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_RUNC}}); err != nil {
		t.Fatalf("ReportResult: %v", err)
	}
	got, err := dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "late"})
	if err != nil || !got.GetStale() || got.GetExec().GetState() != typesv1.ExecState_EXEC_STATE_ENDED || got.GetExec().GetExitCode() != 3 || got.GetExec().GetSeq() != 1 {
		t.Fatalf("GetExec(late) after the report: %v, %v", got, err)
	}
	got, err = dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "unseen"})
	if err != nil || got.GetExec().GetReason() != typesv1.TerminationReason_TERMINATION_REASON_CANCELLED || !got.GetExec().GetSpecCut() || got.GetExec().GetSeq() != 2 {
		t.Fatalf("GetExec(unseen) after the report: %v, %v", got, err)
	}
	_, err = dev.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: "late", Argv: []string{"other"}}})
	wantStatus(t, err, codes.AlreadyExists, "spec.argv")
	_, err = dev.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: "unseen", Argv: []string{"other"}}})
	wantStatus(t, err, codes.Unavailable)
}

// TestExecRecordsWhenTheExecutorForgot: an executor that answers but has
// lost the session (its disk, say) is NotFound for it; the authority's
// records answer instead, marked stale.
func TestExecRecordsWhenTheExecutorForgot(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev := h.client(devID)
	sid := h.runningSession("forgot", nil).GetJobId()
	if _, err := dev.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: "a", Argv: []string{"true"}}}); err != nil {
		t.Fatal(err)
	}
	h.fake.Forget(sid)
	got, err := dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "a"})
	if err != nil || !got.GetStale() || got.GetExec().GetState() != typesv1.ExecState_EXEC_STATE_ENDED || got.GetExec().GetSeq() != 1 {
		t.Fatalf("GetExec from an executor that forgot the session: %v, %v", got, err)
	}
	gs, err := dev.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: sid})
	if err != nil || !gs.GetExecsStale() || len(gs.GetExecs()) != 1 {
		t.Fatalf("GetSession from an executor that forgot the session: %v, %v", gs, err)
	}
}
