// Package api is the executor's thin gRPC adapter: it validates requests,
// calls the executor's domain packages and maps their errors with
// pkg/errdefs. It is imported only by the executor's composition root.
package api

import (
	"context"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/errdefs"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// Config holds the executor's domain services. It is empty until the sandbox
// runner exists.
type Config struct{}

// Service implements airlock.executor.v1.ExecutorService; the Unsafe
// embedding makes an unhandled new RPC a compile error.
type Service struct {
	executorv1.UnsafeExecutorServiceServer
	cfg Config
}

// New returns the service.
func New(cfg Config) *Service { return &Service{cfg: cfg} }

// Register registers the service on s.
func (s *Service) Register(r grpc.ServiceRegistrar) { executorv1.RegisterExecutorServiceServer(r, s) }

const (
	withJobs    = "job execution in the OCI sandbox"
	withNetwork = "per-job network policy enforcement"
)

func (s *Service) StartJob(context.Context, *executorv1.StartJobRequest) (*executorv1.StartJobResponse, error) {
	return nil, errdefs.NotImplemented(executorv1.ExecutorService_StartJob_FullMethodName, withJobs)
}

func (s *Service) GetRun(context.Context, *executorv1.GetRunRequest) (*executorv1.GetRunResponse, error) {
	return nil, errdefs.NotImplemented(executorv1.ExecutorService_GetRun_FullMethodName, withJobs)
}

func (s *Service) WatchRun(*executorv1.WatchRunRequest, grpc.ServerStreamingServer[executorv1.WatchRunResponse]) error {
	return errdefs.NotImplemented(executorv1.ExecutorService_WatchRun_FullMethodName, withJobs)
}

func (s *Service) CancelRun(context.Context, *executorv1.CancelRunRequest) (*executorv1.CancelRunResponse, error) {
	return nil, errdefs.NotImplemented(executorv1.ExecutorService_CancelRun_FullMethodName, withJobs)
}

func (s *Service) UpdateNetworkPolicy(context.Context, *executorv1.UpdateNetworkPolicyRequest) (*executorv1.UpdateNetworkPolicyResponse, error) {
	return nil, errdefs.NotImplemented(executorv1.ExecutorService_UpdateNetworkPolicy_FullMethodName, withNetwork)
}

func (s *Service) GetArtifact(*executorv1.GetArtifactRequest, grpc.ServerStreamingServer[executorv1.GetArtifactResponse]) error {
	return errdefs.NotImplemented(executorv1.ExecutorService_GetArtifact_FullMethodName, withJobs)
}
