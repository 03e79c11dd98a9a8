package api

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The authority's own exec records (jobs.RequestExec, ObserveExec) in the
// API's terms, and when a call answers from them.

// execSpecFromProto is an exec spec in the domain's terms (stdin apart).
func execSpecFromProto(x *typesv1.ExecSpec) jobs.ExecSpec {
	return jobs.ExecSpec{ID: x.GetExecId(), Argv: x.GetArgv(), Env: x.GetEnv(), Cwd: x.GetCwd(), Timeout: x.GetTimeout().AsDuration(), StdinStream: x.GetStdinStream()}
}

// execSeenFromProto is an executor's exec record in the domain's terms.
func execSeenFromProto(x *typesv1.Exec) jobs.ExecSeen {
	spec := execSpecFromProto(x.GetSpec())
	spec.StdinSize, spec.StdinSHA256 = x.GetStdinSize(), x.GetStdinSha256()
	seen := jobs.ExecSeen{
		Spec: spec, SpecCut: x.GetSpecCut(), Seq: x.GetSeq(), Ended: x.GetState() == typesv1.ExecState_EXEC_STATE_ENDED,
		ExitCode: x.GetExitCode(), Message: x.GetMessage(),
		StdoutSize: x.GetStdoutSize(), StderrSize: x.GetStderrSize(), StdoutTruncated: x.GetStdoutTruncated(), StderrTruncated: x.GetStderrTruncated(),
		StdoutSHA256: x.GetStdoutSha256(), StderrSHA256: x.GetStderrSha256(),
	}
	if r := x.GetReason(); r != typesv1.TerminationReason_TERMINATION_REASON_UNSPECIFIED {
		seen.Reason = strings.ToLower(strings.TrimPrefix(r.String(), "TERMINATION_REASON_"))
	}
	if t := x.GetStartedAt(); t != nil {
		seen.StartedAt = t.AsTime()
	}
	if t := x.GetEndedAt(); t != nil {
		seen.EndedAt = t.AsTime()
	}
	return seen
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
	}
	if spec.Timeout > 0 {
		out.Spec.Timeout = durationpb.New(spec.Timeout)
	}
	if x.Reason != "" {
		out.Reason = typesv1.TerminationReason(typesv1.TerminationReason_value["TERMINATION_REASON_"+strings.ToUpper(x.Reason)])
	}
	if !x.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(x.StartedAt)
	}
	if !x.EndedAt.IsZero() {
		out.EndedAt = timestamppb.New(x.EndedAt)
	}
	return out
}

// observeExecs records what the executor said of a session's execs. The
// caller's answer does not wait on it: a record that could not be brought
// up to date is brought up to date by the next answer.
func (s *Service) observeExecs(ctx context.Context, sessionID string, execs ...*typesv1.Exec) {
	seen := make([]jobs.ExecSeen, 0, len(execs))
	for _, x := range execs {
		if x != nil {
			seen = append(seen, execSeenFromProto(x))
		}
	}
	var err error
	if len(seen) == 1 {
		err = s.cfg.Jobs.ObserveExec(ctx, sessionID, seen[0])
	} else {
		err = s.cfg.Jobs.ObserveExecs(ctx, sessionID, seen)
	}
	if err != nil {
		s.cfg.Logger.ErrorContext(ctx, "record what the executor said of execs", "session", sessionID, "error", err)
	}
}

// executorLost reports whether err from the executor means it cannot
// answer for a session (unreachable, or it no longer has the run): the
// authority's own records answer then.
func executorLost(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.NotFound:
		return true
	}
	return false
}
