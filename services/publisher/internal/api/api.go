// Package api is the publisher's thin gRPC adapter: it validates requests,
// calls the publisher's domain packages and maps their errors with
// pkg/errdefs. It is imported only by the publisher's composition root.
package api

import (
	"context"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/errdefs"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

// Config holds the publisher's domain services. It is empty until publishing
// exists.
type Config struct{}

// Service implements airlock.publisher.v1.PublisherService; the Unsafe
// embedding makes an unhandled new RPC a compile error.
type Service struct {
	publisherv1.UnsafePublisherServiceServer
	cfg Config
}

// New returns the service.
func New(cfg Config) *Service { return &Service{cfg: cfg} }

// Register registers the service on s.
func (s *Service) Register(r grpc.ServiceRegistrar) { publisherv1.RegisterPublisherServiceServer(r, s) }

const withPublish = "publishing approved results (validate, scan, consume approval, push)"

func (s *Service) Publish(context.Context, *publisherv1.PublishRequest) (*publisherv1.PublishResponse, error) {
	return nil, errdefs.NotImplemented(publisherv1.PublisherService_Publish_FullMethodName, withPublish)
}

func (s *Service) GetDeployment(context.Context, *publisherv1.GetDeploymentRequest) (*publisherv1.GetDeploymentResponse, error) {
	return nil, errdefs.NotImplemented(publisherv1.PublisherService_GetDeployment_FullMethodName, withPublish)
}

func (s *Service) ListDeployments(context.Context, *publisherv1.ListDeploymentsRequest) (*publisherv1.ListDeploymentsResponse, error) {
	return nil, errdefs.NotImplemented(publisherv1.PublisherService_ListDeployments_FullMethodName, withPublish)
}
