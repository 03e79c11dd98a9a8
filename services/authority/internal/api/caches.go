package api

import (
	"context"

	"github.com/airlockhq/airlock/pkg/imagecache/imagecachepb"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
)

func (s *Service) ListCaches(ctx context.Context, req *authorityv1.ListCachesRequest) (*authorityv1.ListCachesResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	list, err := s.cfg.Jobs.ListCaches(ctx, id, req.GetTenant())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.ListCachesResponse{Caches: executorclient.CacheInfosToProto(list)}, nil
}

func (s *Service) ClearCaches(ctx context.Context, req *authorityv1.ClearCachesRequest) (*authorityv1.ClearCachesResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	cleared, err := s.cfg.Jobs.ClearCaches(ctx, id, req.GetTenant(), req.GetRepository(), req.GetName())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.ClearCachesResponse{Cleared: executorclient.CacheInfosToProto(cleared)}, nil
}

func (s *Service) ListImages(ctx context.Context, req *authorityv1.ListImagesRequest) (*authorityv1.ListImagesResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.cfg.Jobs.ListImages(ctx, id, req.GetTenant(), req.GetDigest())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.ListImagesResponse{Images: imagecachepb.ImagesToProto(l.Images), Cache: imagecachepb.StatsToProto(l.Stats)}, nil
}

func (s *Service) PruneImages(ctx context.Context, req *authorityv1.PruneImagesRequest) (*authorityv1.PruneImagesResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	p, err := s.cfg.Jobs.PruneImages(ctx, id, req.GetTenant(), req.GetDigest())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.PruneImagesResponse{Pruned: imagecachepb.ImagesToProto(p.Images), FreedBytes: p.Freed, InUse: p.InUse}, nil
}
