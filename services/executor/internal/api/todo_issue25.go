package api

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// Placeholder while issue 25's port forward is built.
func (s *Service) ForwardPort(grpc.BidiStreamingServer[executorv1.ForwardPortRequest, executorv1.ForwardPortResponse]) error {
	return status.Error(codes.Unimplemented, "ForwardPort is not built yet")
}
