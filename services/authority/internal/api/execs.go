package api

import (
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Execs on the wire: as the executor reports them (executorclient's
// conversions), and as the authority records them (jobs.RequestExec,
// ObserveExec), which answer when the executor cannot.

// execToProto is an exec event's record on the wire (nil for none).
func execToProto(x *jobs.ExecSeen) *typesv1.Exec {
	if x == nil {
		return nil
	}
	return executorclient.ExecToProto(*x)
}

var execStateToProto = map[store.ExecState]typesv1.ExecState{
	store.ExecRequested: typesv1.ExecState_EXEC_STATE_REQUESTED,
	store.ExecRunning:   typesv1.ExecState_EXEC_STATE_RUNNING,
	store.ExecEnded:     typesv1.ExecState_EXEC_STATE_ENDED,
}

// execRecordToProto is the authority's record of an exec on the wire: no
// output tails, and spec_cut where the record keeps argv or env cut short.
func execRecordToProto(x store.Exec) *typesv1.Exec {
	spec, cut := jobs.ExecRecordSpec(x)
	out := &typesv1.Exec{
		SessionId: x.SessionID, Seq: x.Seq, State: execStateToProto[x.State], ExitCode: x.ExitCode, Message: x.Message,
		Spec:       &typesv1.ExecSpec{ExecId: x.ExecID, Argv: spec.Argv, Env: spec.Env, Cwd: spec.Cwd, StdinStream: spec.StdinStream},
		StdoutSize: x.StdoutSize, StderrSize: x.StderrSize, StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated,
		StdoutSha256: x.StdoutSHA256, StderrSha256: x.StderrSHA256, StdinSize: spec.StdinSize, StdinSha256: spec.StdinSHA256, SpecCut: cut,
		Reason: executorclient.ReasonToProto(x.Reason),
	}
	if spec.Timeout > 0 {
		out.Spec.Timeout = durationpb.New(spec.Timeout)
	}
	if !x.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(x.StartedAt)
	}
	if !x.EndedAt.IsZero() {
		out.EndedAt = timestamppb.New(x.EndedAt)
	}
	return out
}
