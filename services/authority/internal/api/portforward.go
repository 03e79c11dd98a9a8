package api

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/tunnel"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/portforward"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// maxForwardChunk bounds one data message of a forwarded connection.
const maxForwardChunk = 64 << 10

var forwardStateToProto = map[store.ForwardState]authorityv1.PortForwardState{
	store.ForwardPending: authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING,
	store.ForwardOpen:    authorityv1.PortForwardState_PORT_FORWARD_STATE_OPEN,
	store.ForwardClosed:  authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED,
}

// forwardToProto is the API's view of a stored forward.
func forwardToProto(f store.PortForward) *authorityv1.PortForward {
	return &authorityv1.PortForward{
		ForwardId: f.ID, SessionId: f.SessionID, Tenant: f.Tenant, Requester: f.Requester, Port: f.Port,
		State: forwardStateToProto[f.State], CreatedAt: timestamppb.New(f.CreatedAt), ExpiresAt: optTime(f.ExpiresAt),
		ClosedAt: optTime(f.ClosedAt), CloseReason: f.CloseReason, ApprovalId: f.ApprovalID,
		Connections: f.Connections, BytesIn: f.BytesIn, BytesOut: f.BytesOut,
	}
}

// forwardRequestToProto is what a port forward approval is about.
func forwardRequestToProto(a store.Approval) *authorityv1.PortForward {
	r, err := portforward.DecodeRequest(a.Change)
	if err != nil {
		return nil
	}
	// Not an expiry: once approved it opens for ttl from then.
	return &authorityv1.PortForward{ForwardId: r.ForwardID, SessionId: r.SessionID, Tenant: a.Tenant, Requester: r.Requester,
		Port: r.Port, ApprovalId: a.ID, Ttl: durationpb.New(r.TTL)}
}

// forwards is the caller and the port forward domain, for each of its
// calls.
func (s *Service) forwards(ctx context.Context) (identity.ID, *portforward.Service, error) {
	id, err := caller(ctx)
	if err != nil {
		return id, nil, err
	}
	if s.cfg.Forwards == nil {
		return id, nil, status.Error(codes.Unimplemented, "port forwards are not served by this authority")
	}
	return id, s.cfg.Forwards, nil
}

func (s *Service) OpenPortForward(ctx context.Context, req *authorityv1.OpenPortForwardRequest) (*authorityv1.OpenPortForwardResponse, error) {
	id, fw, err := s.forwards(ctx)
	if err != nil {
		return nil, err
	}
	if d := req.GetTtl(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "ttl: %v", err)
		}
	}
	f, err := fw.Open(ctx, id, portforward.OpenRequest{SessionID: req.GetSessionId(), Port: req.GetPort(), TTL: req.GetTtl().AsDuration()})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.OpenPortForwardResponse{Forward: forwardToProto(f)}, nil
}

func (s *Service) ForwardPort(stream grpc.BidiStreamingServer[authorityv1.ForwardPortRequest, authorityv1.ForwardPortResponse]) error {
	ctx := stream.Context()
	id, fw, err := s.forwards(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	fid := first.GetForwardId()
	if fid == "" {
		return status.Error(codes.InvalidArgument, "forward_id: required in the first message")
	}
	client := tunnel.Funcs{
		RecvFunc: func() ([]byte, error) {
			m, err := stream.Recv()
			if err != nil {
				return nil, err
			}
			if m.GetForwardId() != "" {
				return nil, status.Error(codes.InvalidArgument, "forward_id: only in the first message")
			}
			if len(m.GetData()) > maxForwardChunk {
				return nil, status.Errorf(codes.InvalidArgument, "data: at most %d bytes a message", maxForwardChunk)
			}
			return m.GetData(), nil
		},
		SendFunc: func(b []byte) error {
			return stream.Send(&authorityv1.ForwardPortResponse{Msg: &authorityv1.ForwardPortResponse_Data{Data: b}})
		},
	}
	err = fw.Carry(ctx, id, fid, func() error {
		return stream.Send(&authorityv1.ForwardPortResponse{Msg: &authorityv1.ForwardPortResponse_Connected{Connected: true}})
	}, client)
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return s.fail(ctx, err)
}

func (s *Service) ClosePortForward(ctx context.Context, req *authorityv1.ClosePortForwardRequest) (*authorityv1.ClosePortForwardResponse, error) {
	id, fw, err := s.forwards(ctx)
	if err != nil {
		return nil, err
	}
	f, err := fw.Close(ctx, id, req.GetForwardId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.ClosePortForwardResponse{Forward: forwardToProto(f)}, nil
}

func (s *Service) ListPortForwards(ctx context.Context, req *authorityv1.ListPortForwardsRequest) (*authorityv1.ListPortForwardsResponse, error) {
	id, fw, err := s.forwards(ctx)
	if err != nil {
		return nil, err
	}
	list, err := fw.List(ctx, id, portforward.ListRequest{SessionID: req.GetSessionId(), Tenant: req.GetTenant(), OpenOnly: req.GetOpenOnly()})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.ListPortForwardsResponse{}
	for _, f := range list {
		out.Forwards = append(out.Forwards, forwardToProto(f))
	}
	return out, nil
}
