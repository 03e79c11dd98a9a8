package api

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

// RunExec starts (or attaches to) an exec, feeds its streamed stdin from
// the call's later requests while its output goes back, and ends with its
// record: StartExec, stdin and WatchExec in one call.
func (s *Service) RunExec(stream grpc.BidiStreamingServer[executorv1.RunExecRequest, executorv1.RunExecResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return errgrpc.ToGRPC(fmt.Errorf("%w: the first request must be start", errdefs.ErrInvalidArgument))
	}
	if err := required("start.job_id", start.GetJobId()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	if start.GetSpec() == nil {
		return errgrpc.ToGRPC(fmt.Errorf("%w: start.spec is required", errdefs.ErrInvalidArgument))
	}
	x, created, stdin, err := s.cfg.Runs.RunExec(stream.Context(), start.GetJobId(), convert.ExecSpec(start.GetSpec()))
	if err != nil {
		return s.fail(stream.Context(), "RunExec", err)
	}
	if err := stream.Send(&executorv1.RunExecResponse{Event: &executorv1.RunExecResponse_Started{
		Started: &executorv1.StartExecResponse{Exec: convert.Exec(x), Created: created},
	}}); err != nil {
		if stdin != nil {
			stdin.Abort("the call that started it broke off before its stdin was closed")
		}
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	refused := make(chan error, 1)
	go func() {
		if err := feedStdin(stream, x, stdin); err != nil {
			refused <- err
			cancel()
		}
	}()
	err = s.cfg.Runs.WatchExec(ctx, start.GetJobId(), x.Spec.ID, start.GetStdoutOffset(), start.GetStderrOffset(), func(ev runs.ExecEvent) error {
		if ev.Exec != nil {
			return stream.Send(&executorv1.RunExecResponse{Event: &executorv1.RunExecResponse_Exec{Exec: convert.Exec(*ev.Exec)}})
		}
		return stream.Send(&executorv1.RunExecResponse{Event: &executorv1.RunExecResponse_Output{Output: outputChunk(ev.Stream, ev.Offset, ev.Data, ev.Cut)}})
	})
	if err != nil {
		select {
		case r := <-refused:
			err = r
		default:
		}
		return s.fail(stream.Context(), "RunExec", err)
	}
	return nil
}

// feedStdin takes the call's requests after start: stdin chunks for the
// exec the call started with a streamed stdin, until close_stdin or the
// half-close. A refusal ends the call; a call that breaks off with stdin
// open cancels the exec (ExecStdin.Abort). It returns once stdin is
// closed, or the call is over.
func feedStdin(stream grpc.BidiStreamingServer[executorv1.RunExecRequest, executorv1.RunExecResponse], x runs.Exec, stdin *runs.ExecStdin) (err error) {
	defer func() {
		// A refused request ends the call, and the exec with it: nothing
		// else may feed its stdin, and a command left reading it would
		// hold a slot of the session (and its idle watcher) until its
		// timeout, or for ever without one.
		if err != nil && stdin != nil {
			stdin.Abort("the call that started it was refused: " + status.Convert(err).Message())
		}
	}()
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if stdin != nil {
				stdin.Close()
			}
			return nil
		}
		if err != nil {
			if stdin != nil {
				stdin.Abort("the call that started it broke off before its stdin was closed")
			}
			return nil
		}
		switch m := msg.GetMsg().(type) {
		case *executorv1.RunExecRequest_Stdin:
			if stdin == nil {
				return errgrpc.ToGRPC(noStdin(x))
			}
			if err := stdin.Write(m.Stdin); err != nil {
				return errgrpc.ToGRPC(err)
			}
		case *executorv1.RunExecRequest_CloseStdin:
			if stdin != nil {
				stdin.Close()
			}
		default:
			return errgrpc.ToGRPC(fmt.Errorf("%w: after start, a request is stdin or close_stdin", errdefs.ErrInvalidArgument))
		}
	}
}

// noStdin says why an exec takes no stdin from this call.
func noStdin(x runs.Exec) error {
	if x.Spec.StdinStream {
		return fmt.Errorf("%w: exec %q takes no stdin from this call: it was started before, and only the call that started it feeds its stdin",
			errdefs.ErrFailedPrecondition, x.Spec.ID)
	}
	return fmt.Errorf("%w: exec %q takes no stdin from this call: its spec.stdin_stream is not set", errdefs.ErrFailedPrecondition, x.Spec.ID)
}
