package executorclient

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/tunnel"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// ForwardPort implements jobs.Sessions.
func (c *Client) ForwardPort(ctx context.Context, jobID string, port uint32, forwardID string) (tunnel.End, error) {
	stream, err := c.c.ForwardPort(ctx)
	if err != nil {
		return nil, relay(err)
	}
	if err := stream.Send(&executorv1.ForwardPortRequest{Msg: &executorv1.ForwardPortRequest_Open{Open: &executorv1.ForwardPortOpen{
		JobId: jobID, Port: port, ForwardId: forwardID,
	}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, relay(err)
	}
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the executor ended the forwarded connection before it was made", errdefs.ErrUnavailable)
		}
		return nil, relay(err)
	}
	if !first.GetConnected() {
		return nil, fmt.Errorf("%w: the executor's first answer to a forwarded connection was not connected", errdefs.ErrUnavailable)
	}
	return tunnel.Funcs{
		RecvFunc: func() ([]byte, error) {
			m, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return nil, io.EOF
				}
				return nil, relay(err)
			}
			return m.GetData(), nil
		},
		SendFunc: func(b []byte) error {
			return stream.Send(&executorv1.ForwardPortRequest{Msg: &executorv1.ForwardPortRequest_Data{Data: b}})
		},
		CloseSendFunc: stream.CloseSend,
	}, nil
}
