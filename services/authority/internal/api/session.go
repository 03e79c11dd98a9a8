package api

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// A session is a job whose grant says so; its execs are forwarded to the
// executor once the caller's access to the session is checked here.

func (s *Service) CreateSession(ctx context.Context, req *authorityv1.CreateSessionRequest) (*authorityv1.CreateSessionResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetSpec() == nil {
		return nil, status.Error(codes.InvalidArgument, "spec: required")
	}
	p := proto.Clone(req.GetSpec()).(*authorityv1.JobSpec)
	if p.Session == nil {
		p.Session = &typesv1.SessionSpec{}
	}
	spec, err := specFromProto(p)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	j, created, err := s.cfg.Jobs.Submit(ctx, id, jobs.SubmitRequest{
		Tenant: req.GetTenant(), IdempotencyKey: req.GetIdempotencyKey(), Spec: spec, SpecWire: wire,
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.CreateSessionResponse{Session: pj, Created: created}, nil
}

// session checks caller's access to a session and returns it.
func (s *Service) session(ctx context.Context, sessionID string) (identity.ID, store.Job, error) {
	id, err := caller(ctx)
	if err != nil {
		return id, store.Job{}, err
	}
	if sessionID == "" {
		return id, store.Job{}, status.Error(codes.InvalidArgument, "session_id: required")
	}
	j, err := s.cfg.Jobs.Session(ctx, id, sessionID)
	if err != nil {
		return id, store.Job{}, s.fail(ctx, err)
	}
	if s.cfg.Executor == nil {
		return id, store.Job{}, status.Error(codes.Unavailable, "this authority has no executor for sessions")
	}
	return id, j, nil
}

func (s *Service) GetSession(ctx context.Context, req *authorityv1.GetSessionRequest) (*authorityv1.GetSessionResponse, error) {
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	pj, err := s.jobView(ctx, j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	resp := &authorityv1.GetSessionResponse{Session: pj}
	if j.DispatchedAt.IsZero() {
		return resp, nil
	}
	if !j.State.Terminal() {
		if run, err := s.cfg.Executor.GetRun(ctx, &executorv1.GetRunRequest{JobId: j.ID}); err == nil {
			resp.Suspended, resp.SuspendReason = run.GetRun().GetSuspended(), run.GetRun().GetSuspendReason()
		}
	}
	list, err := s.cfg.Executor.ListExecs(ctx, &executorv1.ListExecsRequest{JobId: j.ID})
	switch {
	case executorLost(err):
		// The executor cannot say: the authority's own records do, maybe
		// behind it.
		own, total, oerr := s.cfg.Jobs.Execs(ctx, j, 1000)
		if oerr != nil {
			return nil, s.fail(ctx, oerr)
		}
		for _, x := range own {
			resp.Execs = append(resp.Execs, execRecordToProto(x))
		}
		resp.ExecsTotal, resp.ExecsStale = total, total > 0
	case err != nil:
		return nil, err
	default:
		resp.Execs, resp.ExecsTotal = list.GetExecs(), list.GetTotal()
		s.observeExecs(ctx, j.ID, list.GetExecs()...)
	}
	return resp, nil
}

func (s *Service) ListSessions(ctx context.Context, req *authorityv1.ListSessionsRequest) (*authorityv1.ListSessionsResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	states, err := statesFromProto(req.GetStates())
	if err != nil {
		return nil, err
	}
	list, next, err := s.cfg.Jobs.ListSessions(ctx, id, jobs.ListRequest{
		Tenant: req.GetTenant(), States: states, PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken(),
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	resp := &authorityv1.ListSessionsResponse{NextPageToken: next}
	for _, j := range list {
		pj, err := s.jobView(ctx, j)
		if err != nil {
			return nil, s.fail(ctx, err)
		}
		resp.Sessions = append(resp.Sessions, pj)
	}
	return resp, nil
}

func (s *Service) FinishSession(ctx context.Context, req *authorityv1.FinishSessionRequest) (*authorityv1.FinishSessionResponse, error) {
	_, j, err := s.runningSession(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	if _, err := s.cfg.Executor.FinishRun(ctx, &executorv1.FinishRunRequest{JobId: j.ID}); err != nil {
		return nil, err
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.FinishSessionResponse{Session: pj}, nil
}

func (s *Service) CancelSession(ctx context.Context, req *authorityv1.CancelSessionRequest) (*authorityv1.CancelSessionResponse, error) {
	id, _, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	j, err := s.cfg.Jobs.Cancel(ctx, id, req.GetSessionId(), req.GetReason())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.CancelSessionResponse{Session: pj}, nil
}

func (s *Service) StartExec(ctx context.Context, req *authorityv1.StartExecRequest) (*authorityv1.StartExecResponse, error) {
	j, err := s.execRequested(ctx, req.GetSessionId(), req.GetSpec())
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Executor.StartExec(ctx, &executorv1.StartExecRequest{JobId: j.ID, Spec: req.GetSpec()})
	if err != nil {
		return nil, err
	}
	s.observeExecs(ctx, j.ID, resp.GetExec())
	return &authorityv1.StartExecResponse{Exec: resp.GetExec(), Created: resp.GetCreated()}, nil
}

// execRequested checks a request to run spec in a session (StartExec,
// RunExec) and records it in the audit log.
func (s *Service) execRequested(ctx context.Context, sessionID string, spec *typesv1.ExecSpec) (store.Job, error) {
	id, j, err := s.session(ctx, sessionID)
	if err != nil {
		return j, err
	}
	if spec == nil {
		return j, status.Error(codes.InvalidArgument, "spec: required")
	}
	if d := spec.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil {
			return j, status.Errorf(codes.InvalidArgument, "spec.timeout: %v", err)
		}
	}
	if err := s.cfg.Jobs.CheckExecEnv(ctx, spec.GetEnv()); err != nil {
		return j, s.fail(ctx, err)
	}
	if j.DispatchedAt.IsZero() {
		return j, s.fail(ctx, fmt.Errorf("%w: session %q is %s: it takes execs only once it runs", errdefs.ErrFailedPrecondition, j.ID, j.State))
	}
	// Every request is recorded (with its audit entry) before it can
	// reach the sandbox; one that cannot be recorded, or that reuses an id
	// with another spec, is refused here. Whether it starts a new exec or
	// names one already started (a retry, even after the session ended)
	// the executor decides.
	if _, _, err := s.cfg.Jobs.RequestExec(ctx, id, j, execSpecFromProto(spec), spec.GetStdin()); err != nil {
		return j, s.fail(ctx, err)
	}
	return j, nil
}

func (s *Service) GetExec(ctx context.Context, req *authorityv1.GetExecRequest) (*authorityv1.GetExecResponse, error) {
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Executor.GetExec(ctx, &executorv1.GetExecRequest{JobId: j.ID, ExecId: req.GetExecId()})
	if executorLost(err) {
		// The authority's own record answers, marked as maybe behind.
		x, oerr := s.cfg.Jobs.Exec(ctx, j, req.GetExecId())
		if oerr == nil {
			return &authorityv1.GetExecResponse{Exec: execRecordToProto(x), Stale: true}, nil
		}
	}
	if err != nil {
		return nil, err
	}
	s.observeExecs(ctx, j.ID, resp.GetExec())
	return &authorityv1.GetExecResponse{Exec: resp.GetExec()}, nil
}

func (s *Service) WatchExec(req *authorityv1.WatchExecRequest, stream grpc.ServerStreamingServer[authorityv1.WatchExecResponse]) error {
	ctx := stream.Context()
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return err
	}
	up, err := s.cfg.Executor.WatchExec(ctx, &executorv1.WatchExecRequest{
		JobId: j.ID, ExecId: req.GetExecId(), StdoutOffset: req.GetStdoutOffset(), StderrOffset: req.GetStderrOffset(),
	})
	if err != nil {
		return err
	}
	return relay(up.Recv, stream.Send, func(msg *executorv1.WatchExecResponse) *authorityv1.WatchExecResponse {
		switch ev := msg.GetEvent().(type) {
		case *executorv1.WatchExecResponse_Output:
			return &authorityv1.WatchExecResponse{Event: &authorityv1.WatchExecResponse_Output{Output: ev.Output}}
		case *executorv1.WatchExecResponse_Exec:
			s.observeExecs(ctx, j.ID, ev.Exec)
			return &authorityv1.WatchExecResponse{Event: &authorityv1.WatchExecResponse_Exec{Exec: ev.Exec}}
		}
		return nil
	})
}

// relay passes an executor stream on to the caller, each message as
// convert makes it (nil: skipped), until the executor's stream ends.
func relay[In, Out any](recv func() (*In, error), send func(*Out) error, convert func(*In) *Out) error {
	for {
		msg, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if out := convert(msg); out != nil {
			if err := send(out); err != nil {
				return err
			}
		}
	}
}

func (s *Service) CancelExec(ctx context.Context, req *authorityv1.CancelExecRequest) (*authorityv1.CancelExecResponse, error) {
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Executor.CancelExec(ctx, &executorv1.CancelExecRequest{JobId: j.ID, ExecId: req.GetExecId()})
	if err != nil {
		return nil, err
	}
	s.observeExecs(ctx, j.ID, resp.GetExec())
	return &authorityv1.CancelExecResponse{Exec: resp.GetExec()}, nil
}

func (s *Service) ReadFile(req *authorityv1.ReadFileRequest, stream grpc.ServerStreamingServer[authorityv1.ReadFileResponse]) error {
	ctx := stream.Context()
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return err
	}
	up, err := s.cfg.Executor.ReadFile(ctx, &executorv1.ReadFileRequest{JobId: j.ID, Path: req.GetPath()})
	if err != nil {
		return err
	}
	return relay(up.Recv, stream.Send, func(msg *executorv1.ReadFileResponse) *authorityv1.ReadFileResponse {
		switch p := msg.GetPart().(type) {
		case *executorv1.ReadFileResponse_Header:
			return &authorityv1.ReadFileResponse{Part: &authorityv1.ReadFileResponse_Header{Header: p.Header}}
		case *executorv1.ReadFileResponse_Chunk:
			return &authorityv1.ReadFileResponse{Part: &authorityv1.ReadFileResponse_Chunk{Chunk: p.Chunk}}
		}
		return nil
	})
}

func (s *Service) WriteFile(stream grpc.ClientStreamingServer[authorityv1.WriteFileRequest, authorityv1.WriteFileResponse]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "the first message must be the header")
	}
	id, j, err := s.session(ctx, h.GetSessionId())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // an upload the client breaks off is aborted at the executor too
	up, err := s.cfg.Executor.WriteFile(ctx)
	if err != nil {
		return err
	}
	if err := up.Send(&executorv1.WriteFileRequest{Part: &executorv1.WriteFileRequest_Header{Header: &executorv1.WriteFileHeader{
		JobId: j.ID, Path: h.GetPath(), Mode: h.GetMode(),
	}}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
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
		if err := up.Send(&executorv1.WriteFileRequest{Part: &executorv1.WriteFileRequest_Chunk{Chunk: msg.GetChunk()}}); err != nil {
			if errors.Is(err, io.EOF) {
				break // the executor refused: its status comes with CloseAndRecv
			}
			return err
		}
	}
	resp, err := up.CloseAndRecv()
	if err != nil {
		return err
	}
	if err := s.cfg.Jobs.RecordWrite(ctx, id, j, h.GetPath(), resp.GetSize()); err != nil {
		// The file is written; the bundle records it too.
		s.cfg.Logger.ErrorContext(ctx, "audit an upload", "session", j.ID, "error", err)
	}
	return stream.SendAndClose(&authorityv1.WriteFileResponse{Size: resp.GetSize()})
}

func (s *Service) ListFiles(ctx context.Context, req *authorityv1.ListFilesRequest) (*authorityv1.ListFilesResponse, error) {
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Executor.ListFiles(ctx, &executorv1.ListFilesRequest{JobId: j.ID, Path: req.GetPath(), Recursive: req.GetRecursive()})
	if err != nil {
		return nil, err
	}
	return &authorityv1.ListFilesResponse{Entries: resp.GetEntries(), Truncated: resp.GetTruncated()}, nil
}

func (s *Service) SuspendSession(ctx context.Context, req *authorityv1.SuspendSessionRequest) (*authorityv1.SuspendSessionResponse, error) {
	_, j, err := s.runningSession(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	if _, err := s.cfg.Executor.SuspendRun(ctx, &executorv1.SuspendRunRequest{JobId: j.ID}); err != nil {
		return nil, err
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.SuspendSessionResponse{Session: pj}, nil
}

func (s *Service) ResumeSession(ctx context.Context, req *authorityv1.ResumeSessionRequest) (*authorityv1.ResumeSessionResponse, error) {
	_, j, err := s.runningSession(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	if _, err := s.cfg.Executor.ResumeRun(ctx, &executorv1.ResumeRunRequest{JobId: j.ID}); err != nil {
		return nil, err
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.ResumeSessionResponse{Session: pj}, nil
}

// runningSession is session for a call that needs it at an executor, not
// ended.
func (s *Service) runningSession(ctx context.Context, sessionID string) (identity.ID, store.Job, error) {
	id, j, err := s.session(ctx, sessionID)
	if err != nil {
		return id, j, err
	}
	if j.State.Terminal() {
		return id, j, s.fail(ctx, fmt.Errorf("%w: session %q already ended (%s)", errdefs.ErrFailedPrecondition, j.ID, j.State))
	}
	if j.DispatchedAt.IsZero() {
		return id, j, s.fail(ctx, fmt.Errorf("%w: session %q has not reached an executor yet", errdefs.ErrFailedPrecondition, j.ID))
	}
	return id, j, nil
}
