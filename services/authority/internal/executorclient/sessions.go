package executorclient

import (
	"context"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/errgrpc"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
)

// The jobs.Sessions half of the executor: a session's state, execs and
// files, and the conversions of their messages both ways (the api
// package answers the authority's callers with the same types).

// relayed is an executor's status on a session call: the domain tests it
// with errors.Is against the sentinel of its code, and the authority's
// caller gets it back as the executor said it, code and message.
type relayed struct {
	st  *status.Status
	err error
}

func (e *relayed) Error() string              { return e.err.Error() }
func (e *relayed) Unwrap() error              { return e.err }
func (e *relayed) GRPCStatus() *status.Status { return e.st }

// relay wraps an executor's status error as relayed.
func relay(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &relayed{st: st, err: errgrpc.FromGRPC(err)}
}

// RunStatus implements jobs.Sessions.
func (c *Client) RunStatus(ctx context.Context, jobID string) (jobs.RunStatus, error) {
	resp, err := c.c.GetRun(ctx, &executorv1.GetRunRequest{JobId: jobID})
	if err != nil {
		return jobs.RunStatus{}, relay(err)
	}
	st := jobs.RunStatus{Suspended: resp.GetRun().GetSuspended(), SuspendReason: ReasonName(resp.GetRun().GetSuspendReason())}
	if t := resp.GetRun().GetSuspendedAt(); t != nil {
		st.SuspendedAt = t.AsTime()
	}
	return st, nil
}

// Finish implements jobs.Sessions.
func (c *Client) Finish(ctx context.Context, jobID string) error {
	_, err := c.c.FinishRun(ctx, &executorv1.FinishRunRequest{JobId: jobID})
	return relay(err)
}

// Suspend implements jobs.Sessions.
func (c *Client) Suspend(ctx context.Context, jobID string) error {
	_, err := c.c.SuspendRun(ctx, &executorv1.SuspendRunRequest{JobId: jobID})
	return relay(err)
}

// Resume implements jobs.Sessions.
func (c *Client) Resume(ctx context.Context, jobID string) error {
	_, err := c.c.ResumeRun(ctx, &executorv1.ResumeRunRequest{JobId: jobID})
	return relay(err)
}

// StartExec implements jobs.Sessions.
func (c *Client) StartExec(ctx context.Context, jobID string, spec jobs.ExecSpec, stdin []byte) (jobs.ExecSeen, bool, error) {
	resp, err := c.c.StartExec(ctx, &executorv1.StartExecRequest{JobId: jobID, Spec: ExecSpecToProto(spec, stdin)})
	if err != nil {
		return jobs.ExecSeen{}, false, relay(err)
	}
	return ExecFromProto(resp.GetExec()), resp.GetCreated(), nil
}

// GetExec implements jobs.Sessions.
func (c *Client) GetExec(ctx context.Context, jobID, execID string) (jobs.ExecSeen, error) {
	resp, err := c.c.GetExec(ctx, &executorv1.GetExecRequest{JobId: jobID, ExecId: execID})
	if err != nil {
		return jobs.ExecSeen{}, relay(err)
	}
	return ExecFromProto(resp.GetExec()), nil
}

// ListExecs implements jobs.Sessions.
func (c *Client) ListExecs(ctx context.Context, jobID string) (jobs.ExecList, error) {
	resp, err := c.c.ListExecs(ctx, &executorv1.ListExecsRequest{JobId: jobID})
	if err != nil {
		return jobs.ExecList{}, relay(err)
	}
	out := jobs.ExecList{Total: resp.GetTotal(), UploadsTotal: resp.GetFileWritesTotal()}
	for _, x := range resp.GetExecs() {
		if x != nil {
			out.Execs = append(out.Execs, ExecFromProto(x))
		}
	}
	for _, w := range resp.GetFileWrites() {
		out.Uploads = append(out.Uploads, jobs.Upload{
			Path: w.GetPath(), Size: w.GetSize(), SHA256: w.GetSha256(), At: w.GetWrittenAt().AsTime(),
			AfterExec: w.GetAfterExec(), Count: w.GetCount(), FirstAfterExec: w.GetFirstAfterExec(),
		})
	}
	return out, nil
}

// UploadToProto converts an upload record for the authority's API.
func UploadToProto(u jobs.Upload) *typesv1.FileWrite {
	return &typesv1.FileWrite{
		Path: u.Path, Size: u.Size, Sha256: u.SHA256, WrittenAt: timestamppb.New(u.At),
		AfterExec: u.AfterExec, Count: u.Count, FirstAfterExec: u.FirstAfterExec,
	}
}

// CancelExec implements jobs.Sessions.
func (c *Client) CancelExec(ctx context.Context, jobID, execID string) (jobs.ExecSeen, error) {
	resp, err := c.c.CancelExec(ctx, &executorv1.CancelExecRequest{JobId: jobID, ExecId: execID})
	if err != nil {
		return jobs.ExecSeen{}, relay(err)
	}
	return ExecFromProto(resp.GetExec()), nil
}

// WatchExec implements jobs.Sessions.
func (c *Client) WatchExec(ctx context.Context, jobID, execID string, from jobs.Offsets, fn func(jobs.ExecEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.c.WatchExec(ctx, &executorv1.WatchExecRequest{JobId: jobID, ExecId: execID, StdoutOffset: from.Stdout, StderrOffset: from.Stderr})
	if err != nil {
		return relay(err)
	}
	return recvAll(stream.Recv, fn, func(msg *executorv1.WatchExecResponse) (jobs.ExecEvent, bool) {
		switch ev := msg.GetEvent().(type) {
		case *executorv1.WatchExecResponse_Output:
			return jobs.ExecEvent{Output: outputFromProto(ev.Output)}, true
		case *executorv1.WatchExecResponse_Exec:
			return jobs.ExecEvent{Exec: execRef(ev.Exec)}, true
		}
		return jobs.ExecEvent{}, false
	})
}

// RunExec implements jobs.Sessions.
func (c *Client) RunExec(ctx context.Context, jobID string, start jobs.ExecStart, stdin func() (jobs.StdinPart, error), fn func(jobs.ExecEvent) error) error {
	// Ends the executor's call with this one: a caller that breaks off
	// breaks off there too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up, err := c.c.RunExec(ctx)
	if err != nil {
		return relay(err)
	}
	if err := up.Send(&executorv1.RunExecRequest{Msg: &executorv1.RunExecRequest_Start{Start: &executorv1.RunExecStart{
		JobId: jobID, Spec: ExecSpecToProto(start.Spec, start.Stdin), StdoutOffset: start.From.Stdout, StderrOffset: start.From.Stderr,
	}}}); err != nil && !errors.Is(err, io.EOF) {
		return relay(err)
	}
	// The caller's stdin goes up as fast as the executor takes it (each
	// Send waits on the executor's flow control, so nothing queues here);
	// the executor judges each message. Its call's end comes down through
	// Recv.
	go func() {
		for {
			p, err := stdin()
			if errors.Is(err, io.EOF) {
				_ = up.CloseSend()
				return
			}
			if err != nil {
				cancel()
				return
			}
			out := &executorv1.RunExecRequest{}
			switch p.Kind {
			case jobs.StdinData:
				out.Msg = &executorv1.RunExecRequest_Stdin{Stdin: p.Data}
			case jobs.StdinClose:
				out.Msg = &executorv1.RunExecRequest_CloseStdin{CloseStdin: p.Close}
			case jobs.StdinRestart:
				out.Msg = &executorv1.RunExecRequest_Start{Start: &executorv1.RunExecStart{}}
			}
			if err := up.Send(out); err != nil {
				return
			}
		}
	}()
	return recvAll(up.Recv, fn, func(msg *executorv1.RunExecResponse) (jobs.ExecEvent, bool) {
		switch ev := msg.GetEvent().(type) {
		case *executorv1.RunExecResponse_Started:
			return jobs.ExecEvent{Started: true, Created: ev.Started.GetCreated(), Exec: execRef(ev.Started.GetExec())}, true
		case *executorv1.RunExecResponse_Output:
			return jobs.ExecEvent{Output: outputFromProto(ev.Output)}, true
		case *executorv1.RunExecResponse_Exec:
			return jobs.ExecEvent{Exec: execRef(ev.Exec)}, true
		}
		return jobs.ExecEvent{}, false
	})
}

// ReadFile implements jobs.Sessions.
func (c *Client) ReadFile(ctx context.Context, jobID, path string, fn func(jobs.FilePart) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.c.ReadFile(ctx, &executorv1.ReadFileRequest{JobId: jobID, Path: path})
	if err != nil {
		return relay(err)
	}
	return recvAll(stream.Recv, fn, func(msg *executorv1.ReadFileResponse) (jobs.FilePart, bool) {
		switch p := msg.GetPart().(type) {
		case *executorv1.ReadFileResponse_Header:
			return jobs.FilePart{Header: true, Size: p.Header.GetSize()}, true
		case *executorv1.ReadFileResponse_Chunk:
			return jobs.FilePart{Chunk: p.Chunk}, true
		}
		return jobs.FilePart{}, false
	})
}

// WriteFile implements jobs.Sessions.
func (c *Client) WriteFile(ctx context.Context, jobID, path string, mode uint32, next func() ([]byte, error)) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // an upload broken off is aborted at the executor too
	up, err := c.c.WriteFile(ctx)
	if err != nil {
		return 0, relay(err)
	}
	if err := up.Send(&executorv1.WriteFileRequest{Part: &executorv1.WriteFileRequest_Header{Header: &executorv1.WriteFileHeader{
		JobId: jobID, Path: path, Mode: mode,
	}}}); err != nil && !errors.Is(err, io.EOF) {
		return 0, relay(err)
	}
	for {
		chunk, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		if err := up.Send(&executorv1.WriteFileRequest{Part: &executorv1.WriteFileRequest_Chunk{Chunk: chunk}}); err != nil {
			if errors.Is(err, io.EOF) {
				break // the executor refused: its status comes with CloseAndRecv
			}
			return 0, relay(err)
		}
	}
	resp, err := up.CloseAndRecv()
	if err != nil {
		return 0, relay(err)
	}
	return resp.GetSize(), nil
}

// ListFiles implements jobs.Sessions.
func (c *Client) ListFiles(ctx context.Context, jobID, path string, recursive bool) ([]jobs.FileEntry, bool, error) {
	resp, err := c.c.ListFiles(ctx, &executorv1.ListFilesRequest{JobId: jobID, Path: path, Recursive: recursive})
	if err != nil {
		return nil, false, relay(err)
	}
	out := make([]jobs.FileEntry, 0, len(resp.GetEntries()))
	for _, e := range resp.GetEntries() {
		f := jobs.FileEntry{Path: e.GetPath(), Type: e.GetType(), Size: e.GetSize(), Mode: e.GetMode(), Target: e.GetTarget(),
			RawPath: e.GetRawPath(), RawTarget: e.GetRawTarget()}
		if t := e.GetModifiedAt(); t != nil {
			f.ModifiedAt = t.AsTime()
		}
		out = append(out, f)
	}
	return out, resp.GetTruncated(), nil
}

// FileEntryToProto is a directory entry on the wire.
func FileEntryToProto(f jobs.FileEntry) *typesv1.FileEntry {
	out := &typesv1.FileEntry{Path: f.Path, Type: f.Type, Size: f.Size, Mode: f.Mode, Target: f.Target, RawPath: f.RawPath, RawTarget: f.RawTarget}
	if !f.ModifiedAt.IsZero() {
		out.ModifiedAt = timestamppb.New(f.ModifiedAt)
	}
	return out
}

// recvAll calls fn with each message of an executor's stream as convert
// makes it (false: skipped), until the stream ends (nil) or fails.
func recvAll[In, Out any](recv func() (*In, error), fn func(Out) error, convert func(*In) (Out, bool)) error {
	for {
		msg, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return relay(err)
		}
		if out, ok := convert(msg); ok {
			if err := fn(out); err != nil {
				return err
			}
		}
	}
}

// outputFromProto is a piece of output in the domain's terms.
func outputFromProto(o *typesv1.OutputChunk) *jobs.Output {
	stream := jobs.Stdout
	if o.GetStream() == typesv1.OutputStream_OUTPUT_STREAM_STDERR {
		stream = jobs.Stderr
	}
	return &jobs.Output{Stream: stream, Offset: o.GetOffset(), Data: o.GetData(), Truncated: o.GetTruncated()}
}

// OutputToProto is a piece of output on the wire.
func OutputToProto(o *jobs.Output) *typesv1.OutputChunk {
	stream := typesv1.OutputStream_OUTPUT_STREAM_STDOUT
	if o.Stream == jobs.Stderr {
		stream = typesv1.OutputStream_OUTPUT_STREAM_STDERR
	}
	return &typesv1.OutputChunk{Stream: stream, Offset: o.Offset, Data: o.Data, Truncated: o.Truncated}
}

// ExecSpecFromProto is an exec spec in the domain's terms (stdin apart).
func ExecSpecFromProto(x *typesv1.ExecSpec) jobs.ExecSpec {
	return jobs.ExecSpec{ID: x.GetExecId(), Argv: x.GetArgv(), Env: x.GetEnv(), Cwd: x.GetCwd(), Timeout: x.GetTimeout().AsDuration(), StdinStream: x.GetStdinStream()}
}

// ExecSpecToProto is an exec spec with stdin on the wire.
func ExecSpecToProto(x jobs.ExecSpec, stdin []byte) *typesv1.ExecSpec {
	out := &typesv1.ExecSpec{ExecId: x.ID, Argv: x.Argv, Env: x.Env, Cwd: x.Cwd, Stdin: stdin, StdinStream: x.StdinStream}
	if x.Timeout != 0 {
		out.Timeout = durationpb.New(x.Timeout)
	}
	return out
}

// execRef is ExecFromProto of x, nil for nil.
func execRef(x *typesv1.Exec) *jobs.ExecSeen {
	if x == nil {
		return nil
	}
	seen := ExecFromProto(x)
	return &seen
}

// ExecFromProto is an executor's exec record in the domain's terms.
func ExecFromProto(x *typesv1.Exec) jobs.ExecSeen {
	spec := ExecSpecFromProto(x.GetSpec())
	spec.StdinSize, spec.StdinSHA256 = x.GetStdinSize(), x.GetStdinSha256()
	seen := jobs.ExecSeen{
		Spec: spec, SpecCut: x.GetSpecCut(), Seq: x.GetSeq(), Ended: x.GetState() == typesv1.ExecState_EXEC_STATE_ENDED,
		Reason: ReasonName(x.GetReason()), ExitCode: x.GetExitCode(), Message: x.GetMessage(),
		StdoutSize: x.GetStdoutSize(), StderrSize: x.GetStderrSize(), StdoutTruncated: x.GetStdoutTruncated(), StderrTruncated: x.GetStderrTruncated(),
		StdoutSHA256: x.GetStdoutSha256(), StderrSHA256: x.GetStderrSha256(),
		SessionID: x.GetSessionId(), StdoutTail: x.GetStdoutTail(), StderrTail: x.GetStderrTail(),
	}
	if t := x.GetStartedAt(); t != nil {
		seen.StartedAt = t.AsTime()
	}
	if t := x.GetEndedAt(); t != nil {
		seen.EndedAt = t.AsTime()
	}
	if u := x.GetUsage(); u != nil {
		seen.Usage = &jobs.Usage{CPUTime: u.GetCpuTime().AsDuration(), WallTime: u.GetWallTime().AsDuration(),
			PeakMemoryBytes: u.GetPeakMemoryBytes(), DiskBytes: u.GetDiskBytes(), PeakPids: u.GetPeakPids()}
	}
	return seen
}

// ExecToProto is an executor's exec record, as the domain holds it, on
// the wire.
func ExecToProto(x jobs.ExecSeen) *typesv1.Exec {
	spec := ExecSpecToProto(x.Spec, nil)
	out := &typesv1.Exec{
		SessionId: x.SessionID, Spec: spec, Seq: x.Seq, State: typesv1.ExecState_EXEC_STATE_RUNNING,
		Reason: ReasonToProto(x.Reason), ExitCode: x.ExitCode, Message: x.Message,
		StdoutSize: x.StdoutSize, StderrSize: x.StderrSize, StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated,
		StdoutSha256: x.StdoutSHA256, StderrSha256: x.StderrSHA256, StdinSize: x.Spec.StdinSize, StdinSha256: x.Spec.StdinSHA256,
		StdoutTail: x.StdoutTail, StderrTail: x.StderrTail, SpecCut: x.SpecCut,
	}
	if x.Ended {
		out.State = typesv1.ExecState_EXEC_STATE_ENDED
	}
	if !x.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(x.StartedAt)
	}
	if !x.EndedAt.IsZero() {
		out.EndedAt = timestamppb.New(x.EndedAt)
	}
	if u := x.Usage; u != nil {
		out.Usage = &typesv1.ResourceUsage{CpuTime: durationpb.New(u.CPUTime), WallTime: durationpb.New(u.WallTime),
			PeakMemoryBytes: u.PeakMemoryBytes, DiskBytes: u.DiskBytes, PeakPids: u.PeakPids}
	}
	return out
}

// ReasonName is a termination reason as the domain names it
// ("exited", "timeout", ...; "" for none).
func ReasonName(r typesv1.TerminationReason) string {
	if r == typesv1.TerminationReason_TERMINATION_REASON_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(r.String(), "TERMINATION_REASON_"))
}

// ReasonToProto is ReasonName's inverse; an unknown name is unspecified.
func ReasonToProto(name string) typesv1.TerminationReason {
	if name == "" {
		return typesv1.TerminationReason_TERMINATION_REASON_UNSPECIFIED
	}
	return typesv1.TerminationReason(typesv1.TerminationReason_value["TERMINATION_REASON_"+strings.ToUpper(name)])
}
