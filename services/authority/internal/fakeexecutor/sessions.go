package fakeexecutor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// A session's calls: execs that end at once having written Stdout, files
// kept in memory, suspension as a flag. Required fields and unknown runs
// are refused as the real executor refuses them (test/executorcontract).

// required refuses an empty field as the real executor does.
func required(field, value string) error {
	if value == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	return nil
}

// sessionRun returns job's run, or the real executor's refusal.
func (e *Executor) sessionRun(job string) (*run, error) {
	if err := required("job_id", job); err != nil {
		return nil, err
	}
	r := e.runs[job]
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "run %q", job)
	}
	return r, nil
}

// exec returns exec id of session job.
func (e *Executor) exec(job, id string) (*typesv1.Exec, error) {
	if err := required("job_id", job); err != nil {
		return nil, err
	}
	if err := required("exec_id", id); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.sessionRun(job); err != nil {
		return nil, err
	}
	for _, x := range e.execs[job] {
		if x.GetSpec().GetExecId() == id {
			return x, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "exec %q", id)
}

// StartExec runs an exec of a session at once: it ends, exited 0, having
// written Stdout. The same id again returns it (created false); with
// another argv it is AlreadyExists, as the real executor answers.
func (e *Executor) StartExec(_ context.Context, req *executorv1.StartExecRequest) (*executorv1.StartExecResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, err
	}
	if req.GetSpec() == nil {
		return nil, status.Error(codes.InvalidArgument, "spec is required")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.startExecLocked(req.GetJobId(), req.GetSpec())
}

func (e *Executor) startExecLocked(job string, reqSpec *typesv1.ExecSpec) (*executorv1.StartExecResponse, error) {
	e.execAsks[job]++
	if e.runs[job] == nil {
		return nil, status.Errorf(codes.NotFound, "run %q", job)
	}
	spec := proto.Clone(reqSpec).(*typesv1.ExecSpec)
	stdin := spec.GetStdin()
	spec.Stdin = nil
	for _, x := range e.execs[job] {
		if x.GetSpec().GetExecId() == spec.GetExecId() {
			if !slices.Equal(x.GetSpec().GetArgv(), spec.GetArgv()) {
				return nil, status.Errorf(codes.AlreadyExists, "spec.exec_id %q: an exec of this id was started with a different spec.argv", spec.GetExecId())
			}
			return &executorv1.StartExecResponse{Exec: x}, nil
		}
	}
	now := timestamppb.Now()
	sum := sha256.Sum256(stdin)
	var size int64
	for _, b := range Stdout {
		size += int64(len(b))
	}
	x := &typesv1.Exec{
		SessionId: job, Spec: spec, Seq: int64(len(e.execs[job])) + 1, State: typesv1.ExecState_EXEC_STATE_ENDED,
		Reason: typesv1.TerminationReason_TERMINATION_REASON_EXITED, Message: "exited with status 0", StartedAt: now, EndedAt: now,
		StdoutSize: size, StdinSize: int64(len(stdin)), StdinSha256: hex.EncodeToString(sum[:]),
	}
	e.execs[job] = append(e.execs[job], x)
	return &executorv1.StartExecResponse{Exec: x, Created: true}, nil
}

// GetExec returns an exec of a session.
func (e *Executor) GetExec(_ context.Context, req *executorv1.GetExecRequest) (*executorv1.GetExecResponse, error) {
	x, err := e.exec(req.GetJobId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	return &executorv1.GetExecResponse{Exec: x}, nil
}

// ListExecs lists a session's execs, first to last.
func (e *Executor) ListExecs(_ context.Context, req *executorv1.ListExecsRequest) (*executorv1.ListExecsResponse, error) {
	job := req.GetJobId()
	if err := required("job_id", job); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.runs[job] == nil {
		return nil, status.Errorf(codes.NotFound, "run %q", job)
	}
	list := e.execs[job]
	ups := e.runs[job].uploads
	return &executorv1.ListExecsResponse{Execs: list, Total: int64(len(list)), FileWrites: ups, FileWritesTotal: int64(len(ups))}, nil
}

// CancelExec returns the exec: every exec of the fake has already ended.
func (e *Executor) CancelExec(_ context.Context, req *executorv1.CancelExecRequest) (*executorv1.CancelExecResponse, error) {
	x, err := e.exec(req.GetJobId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	return &executorv1.CancelExecResponse{Exec: x}, nil
}

// WatchExec sends the exec's output from the offsets asked, then its
// record.
func (e *Executor) WatchExec(req *executorv1.WatchExecRequest, stream grpc.ServerStreamingServer[executorv1.WatchExecResponse]) error {
	x, err := e.exec(req.GetJobId(), req.GetExecId())
	if err != nil {
		return err
	}
	for _, o := range output(req.GetStdoutOffset()) {
		if err := stream.Send(&executorv1.WatchExecResponse{Event: &executorv1.WatchExecResponse_Output{Output: o}}); err != nil {
			return err
		}
	}
	return stream.Send(&executorv1.WatchExecResponse{Event: &executorv1.WatchExecResponse_Exec{Exec: x}})
}

// RunExec starts the exec as StartExec does, reads stdin until the
// client closes it, and sends the exec's start, output and record.
func (e *Executor) RunExec(stream grpc.BidiStreamingServer[executorv1.RunExecRequest, executorv1.RunExecResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "the first message must be start")
	}
	if err := required("job_id", start.GetJobId()); err != nil {
		return err
	}
	if start.GetSpec() == nil {
		return status.Error(codes.InvalidArgument, "spec is required")
	}
	e.mu.Lock()
	resp, err := e.startExecLocked(start.GetJobId(), start.GetSpec())
	e.mu.Unlock()
	if err != nil {
		return err
	}
	if err := stream.Send(&executorv1.RunExecResponse{Event: &executorv1.RunExecResponse_Started{Started: resp}}); err != nil {
		return err
	}
	for start.GetSpec().GetStdinStream() {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) || msg.GetCloseStdin() {
			break
		}
		if err != nil {
			return err
		}
		if msg.GetStart() != nil {
			return status.Error(codes.InvalidArgument, "a second start")
		}
	}
	for _, o := range output(start.GetStdoutOffset()) {
		if err := stream.Send(&executorv1.RunExecResponse{Event: &executorv1.RunExecResponse_Output{Output: o}}); err != nil {
			return err
		}
	}
	return stream.Send(&executorv1.RunExecResponse{Event: &executorv1.RunExecResponse_Exec{Exec: resp.GetExec()}})
}

// output is Stdout from offset on, a chunk each.
func output(from int64) []*typesv1.OutputChunk {
	var out []*typesv1.OutputChunk
	var off int64
	for _, b := range Stdout {
		if off+int64(len(b)) > from {
			skip := max(0, from-off)
			out = append(out, &typesv1.OutputChunk{Stream: typesv1.OutputStream_OUTPUT_STREAM_STDOUT, Offset: off + skip, Data: b[skip:]})
		}
		off += int64(len(b))
	}
	return out
}

// FinishRun returns the run; the test ends it (End) and reports.
func (e *Executor) FinishRun(_ context.Context, req *executorv1.FinishRunRequest) (*executorv1.FinishRunResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, err := e.sessionRun(req.GetJobId())
	if err != nil {
		return nil, err
	}
	return &executorv1.FinishRunResponse{Run: e.runView(req.GetJobId(), r)}, nil
}

// SuspendRun marks the run suspended.
func (e *Executor) SuspendRun(_ context.Context, req *executorv1.SuspendRunRequest) (*executorv1.SuspendRunResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, err := e.sessionRun(req.GetJobId())
	if err != nil {
		return nil, err
	}
	if !r.suspended {
		r.suspended, r.suspendedAt = true, time.Now()
	}
	return &executorv1.SuspendRunResponse{Run: e.runView(req.GetJobId(), r)}, nil
}

// ResumeRun marks the run running again.
func (e *Executor) ResumeRun(_ context.Context, req *executorv1.ResumeRunRequest) (*executorv1.ResumeRunResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, err := e.sessionRun(req.GetJobId())
	if err != nil {
		return nil, err
	}
	r.suspended = false
	return &executorv1.ResumeRunResponse{Run: e.runView(req.GetJobId(), r)}, nil
}

// file returns the bytes WriteFile wrote at path in job's session.
func (e *Executor) file(job, path string) ([]byte, error) {
	if err := required("path", path); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r, err := e.sessionRun(job)
	if err != nil {
		return nil, err
	}
	b, ok := r.files[path]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "path %q: no such file", path)
	}
	return b, nil
}

// ReadFile sends a file WriteFile wrote: its header, then one chunk.
func (e *Executor) ReadFile(req *executorv1.ReadFileRequest, stream grpc.ServerStreamingServer[executorv1.ReadFileResponse]) error {
	b, err := e.file(req.GetJobId(), req.GetPath())
	if err != nil {
		return err
	}
	if err := stream.Send(&executorv1.ReadFileResponse{Part: &executorv1.ReadFileResponse_Header{Header: &typesv1.FileHeader{Size: int64(len(b))}}}); err != nil {
		return err
	}
	return stream.Send(&executorv1.ReadFileResponse{Part: &executorv1.ReadFileResponse_Chunk{Chunk: b}})
}

// WriteFile keeps the upload in memory.
func (e *Executor) WriteFile(stream grpc.ClientStreamingServer[executorv1.WriteFileRequest, executorv1.WriteFileResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "the first message must be the header")
	}
	if err := required("path", h.GetPath()); err != nil {
		return err
	}
	e.mu.Lock()
	_, err = e.sessionRun(h.GetJobId())
	e.mu.Unlock()
	if err != nil {
		return err
	}
	var data []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if msg.GetHeader() != nil {
			return status.Error(codes.InvalidArgument, "a second header")
		}
		data = append(data, msg.GetChunk()...)
	}
	e.mu.Lock()
	r, err := e.sessionRun(h.GetJobId())
	if err == nil {
		if r.files == nil {
			r.files = map[string][]byte{}
		}
		r.files[h.GetPath()] = data
		sum := sha256.Sum256(data)
		r.uploads = append(r.uploads, &typesv1.FileWrite{Path: h.GetPath(), Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:]),
			WrittenAt: timestamppb.Now(), AfterExec: int64(len(e.execs[h.GetJobId()]))})
	}
	e.mu.Unlock()
	if err != nil {
		return err
	}
	return stream.SendAndClose(&executorv1.WriteFileResponse{Size: int64(len(data))})
}

// ListFiles lists the files WriteFile wrote under path (all of them when
// recursive, else those directly in it).
func (e *Executor) ListFiles(_ context.Context, req *executorv1.ListFilesRequest) (*executorv1.ListFilesResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, err := e.sessionRun(req.GetJobId())
	if err != nil {
		return nil, err
	}
	dir := strings.TrimSuffix(req.GetPath(), "/") + "/"
	var entries []*typesv1.FileEntry
	for p, b := range r.files {
		rest, ok := strings.CutPrefix(p, dir)
		if !ok || (!req.GetRecursive() && strings.Contains(rest, "/")) {
			continue
		}
		entries = append(entries, &typesv1.FileEntry{Path: p, Type: "file", Size: int64(len(b)), Mode: 0o644, ModifiedAt: timestamppb.Now()})
	}
	sort.Slice(entries, func(i, k int) bool { return entries[i].GetPath() < entries[k].GetPath() })
	return &executorv1.ListFilesResponse{Entries: entries}, nil
}
