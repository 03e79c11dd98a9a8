package api

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
)

// RunExec checks the exec request as StartExec does, then hands the call
// to the domain both ways: the client's stdin up, as fast as the executor
// takes it, and the exec's output and record down.
func (s *Service) RunExec(stream grpc.BidiStreamingServer[authorityv1.RunExecRequest, authorityv1.RunExecResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "the first request must be start")
	}
	ctx := stream.Context()
	id, j, err := s.execSession(ctx, start.GetSessionId(), start.GetSpec())
	if err != nil {
		return err
	}
	req := jobs.ExecStart{
		Spec: executorclient.ExecSpecFromProto(start.GetSpec()), Stdin: start.GetSpec().GetStdin(),
		From: jobs.Offsets{Stdout: start.GetStdoutOffset(), Stderr: start.GetStderrOffset()},
	}
	err = s.cfg.Jobs.RunExec(ctx, id, j, req, func() (jobs.StdinPart, error) {
		msg, err := stream.Recv()
		if err != nil {
			return jobs.StdinPart{}, err
		}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.RunExecRequest_Stdin:
			return jobs.StdinPart{Kind: jobs.StdinData, Data: m.Stdin}, nil
		case *authorityv1.RunExecRequest_CloseStdin:
			return jobs.StdinPart{Kind: jobs.StdinClose, Close: m.CloseStdin}, nil
		case *authorityv1.RunExecRequest_Start:
			return jobs.StdinPart{Kind: jobs.StdinRestart}, nil // the executor refuses it
		}
		return jobs.StdinPart{}, nil
	}, func(ev jobs.ExecEvent) error {
		resp := &authorityv1.RunExecResponse{}
		switch {
		case ev.Started:
			resp.Event = &authorityv1.RunExecResponse_Started{Started: &authorityv1.StartExecResponse{Exec: execToProto(ev.Exec), Created: ev.Created}}
		case ev.Output != nil:
			resp.Event = &authorityv1.RunExecResponse_Output{Output: executorclient.OutputToProto(ev.Output)}
		default:
			resp.Event = &authorityv1.RunExecResponse_Exec{Exec: execToProto(ev.Exec)}
		}
		return stream.Send(resp)
	})
	return s.fail(ctx, err)
}
