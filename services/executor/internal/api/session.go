package api

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/chunkio"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

func (s *Service) StartExec(ctx context.Context, req *executorv1.StartExecRequest) (*executorv1.StartExecResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if req.GetSpec() == nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("%w: spec is required", errdefs.ErrInvalidArgument))
	}
	x, created, err := s.cfg.Runs.StartExec(ctx, req.GetJobId(), convert.ExecSpec(req.GetSpec()))
	if err != nil {
		return nil, s.fail(ctx, "StartExec", err)
	}
	return &executorv1.StartExecResponse{Exec: convert.Exec(x), Created: created}, nil
}

func (s *Service) GetExec(ctx context.Context, req *executorv1.GetExecRequest) (*executorv1.GetExecResponse, error) {
	if err := requiredExec(req.GetJobId(), req.GetExecId()); err != nil {
		return nil, err
	}
	x, err := s.cfg.Runs.GetExec(req.GetJobId(), req.GetExecId())
	if err != nil {
		return nil, s.fail(ctx, "GetExec", err)
	}
	return &executorv1.GetExecResponse{Exec: convert.Exec(x)}, nil
}

func (s *Service) ListExecs(ctx context.Context, req *executorv1.ListExecsRequest) (*executorv1.ListExecsResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	xs, writes, err := s.cfg.Runs.ListExecs(req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, "ListExecs", err)
	}
	out := &executorv1.ListExecsResponse{Total: int64(len(xs))}
	out.FileWrites, out.FileWritesTotal = convert.FileWrites(writes, convert.ListedWrites)
	for _, x := range xs[max(0, len(xs)-maxListedExecs):] {
		p := convert.Exec(x)
		p.StdoutTail, p.StderrTail = nil, nil
		convert.CutSpec(p, convert.ExecSpecCut)
		out.Execs = append(out.Execs, p)
	}
	return out, nil
}

func (s *Service) WatchExec(req *executorv1.WatchExecRequest, stream grpc.ServerStreamingServer[executorv1.WatchExecResponse]) error {
	if err := requiredExec(req.GetJobId(), req.GetExecId()); err != nil {
		return err
	}
	err := s.cfg.Runs.WatchExec(stream.Context(), req.GetJobId(), req.GetExecId(), req.GetStdoutOffset(), req.GetStderrOffset(), func(ev runs.ExecEvent) error {
		if ev.Exec != nil {
			return stream.Send(&executorv1.WatchExecResponse{Event: &executorv1.WatchExecResponse_Exec{Exec: convert.Exec(*ev.Exec)}})
		}
		return stream.Send(&executorv1.WatchExecResponse{Event: &executorv1.WatchExecResponse_Output{Output: outputChunk(ev.Stream, ev.Offset, ev.Data, ev.Cut)}})
	})
	if err != nil {
		return s.fail(stream.Context(), "WatchExec", err)
	}
	return nil
}

func (s *Service) CancelExec(ctx context.Context, req *executorv1.CancelExecRequest) (*executorv1.CancelExecResponse, error) {
	if err := requiredExec(req.GetJobId(), req.GetExecId()); err != nil {
		return nil, err
	}
	x, err := s.cfg.Runs.CancelExec(req.GetJobId(), req.GetExecId())
	if err != nil {
		return nil, s.fail(ctx, "CancelExec", err)
	}
	return &executorv1.CancelExecResponse{Exec: convert.Exec(x)}, nil
}

func (s *Service) FinishRun(ctx context.Context, req *executorv1.FinishRunRequest) (*executorv1.FinishRunResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	run, err := s.cfg.Runs.Finish(req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, "FinishRun", err)
	}
	return &executorv1.FinishRunResponse{Run: convert.Run(run)}, nil
}

// maxListedExecs bounds a listing: with argv and env cut and no tails,
// well inside one message.
const maxListedExecs = 1000

func requiredExec(jobID, execID string) error {
	if err := required("job_id", jobID); err != nil {
		return errgrpc.ToGRPC(err)
	}
	if err := required("exec_id", execID); err != nil {
		return errgrpc.ToGRPC(err)
	}
	return nil
}

// outputChunk is one output event on the wire.
func outputChunk(stream string, offset int64, data []byte, cut bool) *typesv1.OutputChunk {
	which := typesv1.OutputStream_OUTPUT_STREAM_STDOUT
	if stream == "stderr" {
		which = typesv1.OutputStream_OUTPUT_STREAM_STDERR
	}
	return &typesv1.OutputChunk{Stream: which, Offset: offset, Data: data, Truncated: cut}
}

func (s *Service) ReadFile(req *executorv1.ReadFileRequest, stream grpc.ServerStreamingServer[executorv1.ReadFileResponse]) error {
	if err := required("job_id", req.GetJobId()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	err := s.cfg.Runs.ReadFile(stream.Context(), req.GetJobId(), req.GetPath(),
		func(size int64) error {
			return stream.Send(&executorv1.ReadFileResponse{Part: &executorv1.ReadFileResponse_Header{Header: &typesv1.FileHeader{Size: size}}})
		},
		func(b []byte) error {
			return stream.Send(&executorv1.ReadFileResponse{Part: &executorv1.ReadFileResponse_Chunk{Chunk: b}})
		})
	if err != nil {
		return s.fail(stream.Context(), "ReadFile", err)
	}
	return nil
}

func (s *Service) WriteFile(stream grpc.ClientStreamingServer[executorv1.WriteFileRequest, executorv1.WriteFileResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return errgrpc.ToGRPC(fmt.Errorf("%w: the first message must be the header", errdefs.ErrInvalidArgument))
	}
	if err := required("job_id", h.GetJobId()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	n, err := s.cfg.Runs.WriteFile(stream.Context(), h.GetJobId(), h.GetPath(), fs.FileMode(h.GetMode()), chunkio.NewReader(func() ([]byte, error) {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if m.GetHeader() != nil {
			return nil, fmt.Errorf("%w: a second header", errdefs.ErrInvalidArgument)
		}
		return m.GetChunk(), nil
	}))
	if err != nil {
		return s.fail(stream.Context(), "WriteFile", err)
	}
	return stream.SendAndClose(&executorv1.WriteFileResponse{Size: n})
}

func (s *Service) ListFiles(ctx context.Context, req *executorv1.ListFilesRequest) (*executorv1.ListFilesResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	list, cut, err := s.cfg.Runs.ListFiles(ctx, req.GetJobId(), req.GetPath(), req.GetRecursive())
	if err != nil {
		return nil, s.fail(ctx, "ListFiles", err)
	}
	out := &executorv1.ListFilesResponse{Truncated: cut}
	for _, f := range list {
		e := &typesv1.FileEntry{Type: f.Type, Size: f.Size, Mode: uint32(f.Mode), ModifiedAt: timestamppb.New(f.ModTime)}
		e.Path, e.RawPath = wireName(f.Path)
		e.Target, e.RawTarget = wireName(f.Target)
		out.Entries = append(out.Entries, e)
	}
	return out, nil
}

func (s *Service) SuspendRun(ctx context.Context, req *executorv1.SuspendRunRequest) (*executorv1.SuspendRunResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	run, err := s.cfg.Runs.Suspend(req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, "SuspendRun", err)
	}
	return &executorv1.SuspendRunResponse{Run: convert.Run(run)}, nil
}

func (s *Service) ResumeRun(ctx context.Context, req *executorv1.ResumeRunRequest) (*executorv1.ResumeRunResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	run, err := s.cfg.Runs.Resume(ctx, req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, "ResumeRun", err)
	}
	return &executorv1.ResumeRunResponse{Run: convert.Run(run)}, nil
}

// wireName is a file name as a proto string: itself when it is UTF-8,
// else with each invalid byte written \xNN, and its bytes beside.
func wireName(name string) (string, []byte) {
	if utf8.ValidString(name) {
		return name, nil
	}
	var b strings.Builder
	for i := 0; i < len(name); {
		r, n := utf8.DecodeRuneInString(name[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, "\\x%02x", name[i])
		} else {
			b.WriteString(name[i : i+n])
		}
		i += n
	}
	return b.String(), []byte(name)
}
