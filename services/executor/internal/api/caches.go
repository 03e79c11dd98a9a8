package api

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
)

// checkCaches checks a cache request's tenant, and that this executor
// keeps caches.
func (s *Service) checkCaches(tenant string) error {
	if err := required("tenant", tenant); err != nil {
		return err
	}
	if s.cfg.Caches == nil {
		return fmt.Errorf("%w: this executor keeps no caches", errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (s *Service) ListCaches(ctx context.Context, req *executorv1.ListCachesRequest) (*executorv1.ListCachesResponse, error) {
	if err := s.checkCaches(req.GetTenant()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	list, err := s.cfg.Caches.List(req.GetTenant())
	if err != nil {
		return nil, s.fail(ctx, "ListCaches", err)
	}
	return &executorv1.ListCachesResponse{Caches: convert.CacheInfos(list)}, nil
}

func (s *Service) ClearCaches(ctx context.Context, req *executorv1.ClearCachesRequest) (*executorv1.ClearCachesResponse, error) {
	if err := s.checkCaches(req.GetTenant()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	cleared, err := s.cfg.Caches.Clear(req.GetTenant(), req.GetRepository(), req.GetName())
	if err != nil {
		return nil, s.fail(ctx, "ClearCaches", err)
	}
	s.cfg.Logger.InfoContext(ctx, "caches cleared", "tenant", req.GetTenant(), "repository", req.GetRepository(), "name", req.GetName(), "count", len(cleared))
	return &executorv1.ClearCachesResponse{Cleared: convert.CacheInfos(cleared)}, nil
}
