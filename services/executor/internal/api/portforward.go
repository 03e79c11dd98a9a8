package api

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/tunnel"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// ForwardPort carries one connection to a port inside a running session:
// the first message names it, then bytes both ways (package tunnel). The
// stream ends when the session's side closes, or with an error.
func (s *Service) ForwardPort(stream grpc.BidiStreamingServer[executorv1.ForwardPortRequest, executorv1.ForwardPortResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return errgrpc.ToGRPC(fmt.Errorf("%w: the first message must be open", errdefs.ErrInvalidArgument))
	}
	if err := required("open.job_id", open.GetJobId()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	if p := open.GetPort(); p < 1 || p > 65535 {
		return errgrpc.ToGRPC(fmt.Errorf("%w: open.port: %d is not between 1 and 65535", errdefs.ErrInvalidArgument, p))
	}
	log := s.cfg.Logger.With("job_id", open.GetJobId(), "forward_id", open.GetForwardId(), "port", open.GetPort())
	err = s.cfg.Runs.ForwardPort(stream.Context(), open.GetJobId(), int(open.GetPort()), func(_ context.Context, c net.Conn) error {
		if err := stream.Send(&executorv1.ForwardPortResponse{Msg: &executorv1.ForwardPortResponse_Connected{Connected: true}}); err != nil {
			return err
		}
		log.Info("forwarded connection opened")
		client := tunnel.Funcs{
			RecvFunc: func() ([]byte, error) {
				m, err := stream.Recv()
				if err != nil {
					return nil, err
				}
				if m.GetOpen() != nil {
					return nil, fmt.Errorf("%w: a second open", errdefs.ErrInvalidArgument)
				}
				return m.GetData(), nil
			},
			SendFunc: func(b []byte) error {
				return stream.Send(&executorv1.ForwardPortResponse{Msg: &executorv1.ForwardPortResponse_Data{Data: b}})
			},
		}
		err := tunnel.Join(client, tunnel.Conn(c), nil, nil, func() { c.Close() })
		log.Info("forwarded connection closed", "error", err)
		return err
	})
	if err != nil {
		return s.fail(stream.Context(), "ForwardPort", err)
	}
	return nil
}
