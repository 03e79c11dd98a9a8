package api

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/imagecache/imagecachepb"
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

// checkImages checks an image request's tenant and digest, and that this
// executor keeps images.
func (s *Service) checkImages(tenant, d string) error {
	if err := required("tenant", tenant); err != nil {
		return err
	}
	if d != "" {
		if err := digest.Check(d); err != nil {
			return fmt.Errorf("%w: digest: %v", errdefs.ErrInvalidArgument, err)
		}
	}
	if s.cfg.Images == nil {
		return fmt.Errorf("%w: this executor runs no images", errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (s *Service) ListImages(ctx context.Context, req *executorv1.ListImagesRequest) (*executorv1.ListImagesResponse, error) {
	if err := s.checkImages(req.GetTenant(), req.GetDigest()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	l := s.cfg.Images.List(req.GetTenant(), req.GetDigest())
	return &executorv1.ListImagesResponse{Images: imagecachepb.ImagesToProto(l.Images), Cache: imagecachepb.StatsToProto(l.Stats)}, nil
}

func (s *Service) PruneImages(ctx context.Context, req *executorv1.PruneImagesRequest) (*executorv1.PruneImagesResponse, error) {
	if err := s.checkImages(req.GetTenant(), req.GetDigest()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	p, err := s.cfg.Images.Prune(req.GetTenant(), req.GetDigest())
	if err != nil {
		return nil, s.fail(ctx, "PruneImages", err)
	}
	s.cfg.Logger.InfoContext(ctx, "images pruned", "tenant", req.GetTenant(), "digest", req.GetDigest(), "pruned", len(p.Images), "in_use", len(p.InUse), "freed_bytes", p.Freed)
	return &executorv1.PruneImagesResponse{Pruned: imagecachepb.ImagesToProto(p.Images), FreedBytes: p.Freed, InUse: p.InUse}, nil
}
