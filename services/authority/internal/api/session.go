package api

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/identity"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// A session is a job whose grant says so. Its calls are checked here as
// far as the wire goes and handed to the jobs domain, which records what
// it must and reaches the executor through jobs.Executor.

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
	sub, err := s.cfg.Jobs.Submit(ctx, id, jobs.SubmitRequest{
		Tenant: req.GetTenant(), IdempotencyKey: req.GetIdempotencyKey(), Spec: spec, SpecWire: wire,
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(sub.Job)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.CreateSessionResponse{Session: pj, Created: sub.Created, BudgetWarning: sub.BudgetWarning}, nil
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
	v, err := s.cfg.Jobs.SessionState(ctx, j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	resp := &authorityv1.GetSessionResponse{Session: pj, Suspended: v.Suspended, SuspendReason: executorclient.ReasonToProto(v.SuspendReason),
		ExecsTotal: v.Total, ExecsStale: v.Stale, SuspensionUnknown: v.SuspensionUnknown}
	if v.Suspended && !v.SuspendedAt.IsZero() {
		resp.SuspendedAt = timestamppb.New(v.SuspendedAt)
	}
	for _, x := range v.Execs {
		resp.Execs = append(resp.Execs, executorclient.ExecToProto(x))
	}
	for _, x := range v.Records {
		resp.Execs = append(resp.Execs, execRecordToProto(x))
	}
	// The result's record of the uploads once there is one; before, the
	// executor's.
	d, err := storedReview(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if d != nil {
		resp.FileWrites, resp.FileWritesTotal = d.GetFileWrites(), d.GetFileWritesTotal()
	} else {
		for _, u := range v.Uploads {
			resp.FileWrites = append(resp.FileWrites, executorclient.UploadToProto(u))
		}
		resp.FileWritesTotal = v.UploadsTotal
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
	for id, st := range s.cfg.Jobs.Suspensions(ctx, list) {
		x := &authorityv1.SessionSuspension{SessionId: id, SuspendReason: executorclient.ReasonToProto(st.SuspendReason)}
		if !st.SuspendedAt.IsZero() {
			x.SuspendedAt = timestamppb.New(st.SuspendedAt)
		}
		resp.Suspended = append(resp.Suspended, x)
	}
	slices.SortFunc(resp.Suspended, func(a, b *authorityv1.SessionSuspension) int {
		return strings.Compare(a.GetSessionId(), b.GetSessionId())
	})
	return resp, nil
}

func (s *Service) FinishSession(ctx context.Context, req *authorityv1.FinishSessionRequest) (*authorityv1.FinishSessionResponse, error) {
	j, err := s.sessionCall(ctx, req.GetSessionId(), s.cfg.Jobs.FinishSession)
	if err != nil {
		return nil, err
	}
	return &authorityv1.FinishSessionResponse{Session: j}, nil
}

func (s *Service) SuspendSession(ctx context.Context, req *authorityv1.SuspendSessionRequest) (*authorityv1.SuspendSessionResponse, error) {
	j, err := s.sessionCall(ctx, req.GetSessionId(), s.cfg.Jobs.SuspendSession)
	if err != nil {
		return nil, err
	}
	return &authorityv1.SuspendSessionResponse{Session: j}, nil
}

func (s *Service) ResumeSession(ctx context.Context, req *authorityv1.ResumeSessionRequest) (*authorityv1.ResumeSessionResponse, error) {
	j, err := s.sessionCall(ctx, req.GetSessionId(), s.cfg.Jobs.ResumeSession)
	if err != nil {
		return nil, err
	}
	return &authorityv1.ResumeSessionResponse{Session: j}, nil
}

// sessionCall calls fn (finish, suspend, resume) on the caller's session
// and returns the session as it was.
func (s *Service) sessionCall(ctx context.Context, sessionID string, fn func(context.Context, store.Job) error) (*authorityv1.Job, error) {
	_, j, err := s.session(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	if err := fn(ctx, j); err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return pj, nil
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
	id, j, err := s.execSession(ctx, req.GetSessionId(), req.GetSpec())
	if err != nil {
		return nil, err
	}
	x, created, err := s.cfg.Jobs.StartExec(ctx, id, j, executorclient.ExecSpecFromProto(req.GetSpec()), req.GetSpec().GetStdin())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.StartExecResponse{Exec: executorclient.ExecToProto(x), Created: created}, nil
}

// execSession checks a request to run spec in a session (StartExec,
// RunExec) as far as the wire goes; the domain checks the rest.
func (s *Service) execSession(ctx context.Context, sessionID string, spec *typesv1.ExecSpec) (identity.ID, store.Job, error) {
	id, j, err := s.session(ctx, sessionID)
	if err != nil {
		return id, j, err
	}
	if spec == nil {
		return id, j, status.Error(codes.InvalidArgument, "spec: required")
	}
	if d := spec.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil {
			return id, j, status.Errorf(codes.InvalidArgument, "spec.timeout: %v", err)
		}
	}
	return id, j, nil
}

func (s *Service) GetExec(ctx context.Context, req *authorityv1.GetExecRequest) (*authorityv1.GetExecResponse, error) {
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	v, err := s.cfg.Jobs.GetExec(ctx, j, req.GetExecId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if v.Stale {
		return &authorityv1.GetExecResponse{Exec: execRecordToProto(v.Record), Stale: true}, nil
	}
	return &authorityv1.GetExecResponse{Exec: executorclient.ExecToProto(v.Exec)}, nil
}

func (s *Service) WatchExec(req *authorityv1.WatchExecRequest, stream grpc.ServerStreamingServer[authorityv1.WatchExecResponse]) error {
	ctx := stream.Context()
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return err
	}
	from := jobs.Offsets{Stdout: req.GetStdoutOffset(), Stderr: req.GetStderrOffset()}
	err = s.cfg.Jobs.WatchExec(ctx, j, req.GetExecId(), from, func(ev jobs.ExecEvent) error {
		if ev.Output != nil {
			return stream.Send(&authorityv1.WatchExecResponse{Event: &authorityv1.WatchExecResponse_Output{Output: executorclient.OutputToProto(ev.Output)}})
		}
		return stream.Send(&authorityv1.WatchExecResponse{Event: &authorityv1.WatchExecResponse_Exec{Exec: execToProto(ev.Exec)}})
	})
	return s.fail(ctx, err)
}

func (s *Service) CancelExec(ctx context.Context, req *authorityv1.CancelExecRequest) (*authorityv1.CancelExecResponse, error) {
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	x, err := s.cfg.Jobs.CancelExec(ctx, j, req.GetExecId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.CancelExecResponse{Exec: executorclient.ExecToProto(x)}, nil
}

func (s *Service) ReadFile(req *authorityv1.ReadFileRequest, stream grpc.ServerStreamingServer[authorityv1.ReadFileResponse]) error {
	ctx := stream.Context()
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return err
	}
	err = s.cfg.Jobs.ReadFile(ctx, j, req.GetPath(), func(p jobs.FilePart) error {
		if p.Header {
			return stream.Send(&authorityv1.ReadFileResponse{Part: &authorityv1.ReadFileResponse_Header{Header: &typesv1.FileHeader{Size: p.Size}}})
		}
		return stream.Send(&authorityv1.ReadFileResponse{Part: &authorityv1.ReadFileResponse_Chunk{Chunk: p.Chunk}})
	})
	return s.fail(ctx, err)
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
	size, err := s.cfg.Jobs.WriteFile(ctx, id, j, h.GetPath(), h.GetMode(), func() ([]byte, error) {
		msg, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if msg.GetHeader() != nil {
			return nil, status.Error(codes.InvalidArgument, "a second header")
		}
		return msg.GetChunk(), nil
	})
	if err != nil {
		return s.fail(ctx, err)
	}
	return stream.SendAndClose(&authorityv1.WriteFileResponse{Size: size})
}

func (s *Service) ListFiles(ctx context.Context, req *authorityv1.ListFilesRequest) (*authorityv1.ListFilesResponse, error) {
	_, j, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	entries, truncated, err := s.cfg.Jobs.ListFiles(ctx, j, req.GetPath(), req.GetRecursive())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	resp := &authorityv1.ListFilesResponse{Truncated: truncated}
	for _, e := range entries {
		resp.Entries = append(resp.Entries, executorclient.FileEntryToProto(e))
	}
	return resp, nil
}
