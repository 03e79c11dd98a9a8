package api

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// RunExec checks and audits the exec request as StartExec does, then
// relays one call to the executor both ways: the client's stdin up, as
// fast as the executor takes it (each Send waits on the executor's flow
// control, so nothing queues here), and the exec's output and record down.
func (s *Service) RunExec(stream grpc.BidiStreamingServer[authorityv1.RunExecRequest, authorityv1.RunExecResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "the first request must be start")
	}
	j, err := s.execRequested(stream.Context(), start.GetSessionId(), start.GetSpec())
	if err != nil {
		return err
	}
	// Ends the executor's call with this one: a client that breaks off
	// breaks off there too.
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	up, err := s.cfg.Executor.RunExec(ctx)
	if err != nil {
		return err
	}
	if err := up.Send(&executorv1.RunExecRequest{Msg: &executorv1.RunExecRequest_Start{Start: &executorv1.RunExecStart{
		JobId: j.ID, Spec: start.GetSpec(), StdoutOffset: start.GetStdoutOffset(), StderrOffset: start.GetStderrOffset(),
	}}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	go relayStdin(stream, up, cancel)
	return relay(up.Recv, stream.Send, func(msg *executorv1.RunExecResponse) *authorityv1.RunExecResponse {
		switch ev := msg.GetEvent().(type) {
		case *executorv1.RunExecResponse_Started:
			s.observeExecs(ctx, j.ID, ev.Started.GetExec())
			return &authorityv1.RunExecResponse{Event: &authorityv1.RunExecResponse_Started{Started: &authorityv1.StartExecResponse{
				Exec: ev.Started.GetExec(), Created: ev.Started.GetCreated(),
			}}}
		case *executorv1.RunExecResponse_Output:
			return &authorityv1.RunExecResponse{Event: &authorityv1.RunExecResponse_Output{Output: ev.Output}}
		case *executorv1.RunExecResponse_Exec:
			s.observeExecs(ctx, j.ID, ev.Exec)
			return &authorityv1.RunExecResponse{Event: &authorityv1.RunExecResponse_Exec{Exec: ev.Exec}}
		}
		return nil
	})
}

// relayStdin passes the client's requests after start on to the executor,
// which judges them, until the client half-closes (passed on) or breaks
// off (the executor's call is cancelled), or the executor's call ends (its
// status comes down through relay).
func relayStdin(stream grpc.BidiStreamingServer[authorityv1.RunExecRequest, authorityv1.RunExecResponse],
	up grpc.BidiStreamingClient[executorv1.RunExecRequest, executorv1.RunExecResponse], cancel context.CancelFunc) {
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			_ = up.CloseSend()
			return
		}
		if err != nil {
			cancel()
			return
		}
		out := &executorv1.RunExecRequest{}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.RunExecRequest_Stdin:
			out.Msg = &executorv1.RunExecRequest_Stdin{Stdin: m.Stdin}
		case *authorityv1.RunExecRequest_CloseStdin:
			out.Msg = &executorv1.RunExecRequest_CloseStdin{CloseStdin: m.CloseStdin}
		case *authorityv1.RunExecRequest_Start:
			// A second start: the executor refuses it.
			out.Msg = &executorv1.RunExecRequest_Start{Start: &executorv1.RunExecStart{}}
		}
		if err := up.Send(out); err != nil {
			return
		}
	}
}
