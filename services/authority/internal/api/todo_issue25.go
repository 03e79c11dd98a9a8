package api

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// Placeholders while issue 25's RPCs are built; each helper replaces its own.

func (s *Service) OpenPortForward(context.Context, *authorityv1.OpenPortForwardRequest) (*authorityv1.OpenPortForwardResponse, error) {
	return nil, status.Error(codes.Unimplemented, "OpenPortForward is not built yet")
}

func (s *Service) ForwardPort(grpc.BidiStreamingServer[authorityv1.ForwardPortRequest, authorityv1.ForwardPortResponse]) error {
	return status.Error(codes.Unimplemented, "ForwardPort is not built yet")
}

func (s *Service) ClosePortForward(context.Context, *authorityv1.ClosePortForwardRequest) (*authorityv1.ClosePortForwardResponse, error) {
	return nil, status.Error(codes.Unimplemented, "ClosePortForward is not built yet")
}

func (s *Service) ListPortForwards(context.Context, *authorityv1.ListPortForwardsRequest) (*authorityv1.ListPortForwardsResponse, error) {
	return nil, status.Error(codes.Unimplemented, "ListPortForwards is not built yet")
}
