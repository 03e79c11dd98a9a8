package executorclient

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestExecRoundTrip: an exec record as the executor sends it comes back
// the same after the domain's terms, so the authority relays what the
// executor said, field for field.
func TestExecRoundTrip(t *testing.T) {
	now := time.Now()
	ended := &typesv1.Exec{
		SessionId: "s1", Seq: 3, State: typesv1.ExecState_EXEC_STATE_ENDED, Reason: typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT,
		ExitCode: 137, Message: "killed",
		Spec: &typesv1.ExecSpec{ExecId: "e3", Argv: []string{"make", "…"}, Env: map[string]string{"A": "1"}, Cwd: "/work/sub",
			Timeout: durationpb.New(time.Minute), StdinStream: true},
		StartedAt: timestamppb.New(now.Add(-time.Minute)), EndedAt: timestamppb.New(now),
		Usage:      &typesv1.ResourceUsage{CpuTime: durationpb.New(time.Second), WallTime: durationpb.New(time.Minute), PeakMemoryBytes: 5, DiskBytes: 6, PeakPids: 7},
		StdoutSize: 10, StderrSize: 11, StdoutTruncated: true, StdoutSha256: "aa", StderrSha256: "bb", StdinSize: 4, StdinSha256: "cc",
		StdoutTail: []byte("out"), StderrTail: []byte("err"), SpecCut: true,
	}
	running := &typesv1.Exec{
		SessionId: "s1", Seq: 1, State: typesv1.ExecState_EXEC_STATE_RUNNING, ExitCode: -1,
		Spec:      &typesv1.ExecSpec{ExecId: "e1", Argv: []string{"true"}},
		StartedAt: timestamppb.New(now),
	}
	for _, x := range []*typesv1.Exec{ended, running} {
		if got := ExecToProto(ExecFromProto(x)); !proto.Equal(got, x) {
			t.Errorf("round trip:\n got %v\nwant %v", got, x)
		}
	}
	if r := ReasonToProto(ReasonName(typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_RESTARTED)); r != typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_RESTARTED {
		t.Errorf("suspend reason round trip: %v", r)
	}
}
