package api

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// Placeholders while issue 25's RPCs are built; each helper replaces its own.

func (s *Service) GetUsage(context.Context, *authorityv1.GetUsageRequest) (*authorityv1.GetUsageResponse, error) {
	return nil, status.Error(codes.Unimplemented, "GetUsage is not built yet")
}
