package api

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// Placeholders until the fleet package is wired in.

func (s *Service) Heartbeat(context.Context, *authorityv1.HeartbeatRequest) (*authorityv1.HeartbeatResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no fleet yet")
}
func (s *Service) ListExecutors(context.Context, *authorityv1.ListExecutorsRequest) (*authorityv1.ListExecutorsResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no fleet yet")
}
func (s *Service) GetExecutor(context.Context, *authorityv1.GetExecutorRequest) (*authorityv1.GetExecutorResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no fleet yet")
}
func (s *Service) DrainExecutor(context.Context, *authorityv1.DrainExecutorRequest) (*authorityv1.DrainExecutorResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no fleet yet")
}
