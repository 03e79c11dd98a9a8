package executorclient

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/imagecache"
	"github.com/airlockhq/airlock/pkg/imagecache/imagecachepb"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
)

// ListCaches implements jobs.Caches.
func (c *Client) ListCaches(ctx context.Context, tenant string) ([]jobs.CacheInfo, error) {
	resp, err := c.c.ListCaches(ctx, &executorv1.ListCachesRequest{Tenant: tenant})
	if err != nil {
		return nil, fromStatus(err)
	}
	return cacheInfos(resp.GetCaches()), nil
}

// ClearCaches implements jobs.Caches.
func (c *Client) ClearCaches(ctx context.Context, tenant, repository, name string) ([]jobs.CacheInfo, error) {
	resp, err := c.c.ClearCaches(ctx, &executorv1.ClearCachesRequest{Tenant: tenant, Repository: repository, Name: name})
	if err != nil {
		return nil, fromStatus(err)
	}
	return cacheInfos(resp.GetCleared()), nil
}

func cacheInfos(in []*typesv1.CacheInfo) []jobs.CacheInfo {
	out := make([]jobs.CacheInfo, 0, len(in))
	for _, c := range in {
		out = append(out, jobs.CacheInfo{Repository: c.GetRepository(), Name: c.GetName(), Size: c.GetSizeBytes(), LastUsed: c.GetLastUsed().AsTime(), Executor: c.GetExecutor()})
	}
	return out
}

// CacheInfosToProto converts a tenant's caches for the authority's API.
func CacheInfosToProto(in []jobs.CacheInfo) []*typesv1.CacheInfo {
	out := make([]*typesv1.CacheInfo, 0, len(in))
	for _, c := range in {
		out = append(out, &typesv1.CacheInfo{Repository: c.Repository, Name: c.Name, SizeBytes: c.Size, LastUsed: timestamppb.New(c.LastUsed), Executor: c.Executor})
	}
	return out
}

// ListImages implements jobs.ImageCache.
func (c *Client) ListImages(ctx context.Context, tenant, digest string) (imagecache.List, error) {
	resp, err := c.c.ListImages(ctx, &executorv1.ListImagesRequest{Tenant: tenant, Digest: digest})
	if err != nil {
		return imagecache.List{}, fromStatus(err)
	}
	return imagecache.List{Images: imagecachepb.ImagesFromProto(resp.GetImages()), Stats: imagecachepb.StatsFromProto(resp.GetCache())}, nil
}

// PruneImages implements jobs.ImageCache.
func (c *Client) PruneImages(ctx context.Context, tenant, digest string) (imagecache.Pruned, error) {
	resp, err := c.c.PruneImages(ctx, &executorv1.PruneImagesRequest{Tenant: tenant, Digest: digest})
	if err != nil {
		return imagecache.Pruned{}, fromStatus(err)
	}
	return imagecache.Pruned{Images: imagecachepb.ImagesFromProto(resp.GetPruned()), Freed: resp.GetFreedBytes(), InUse: resp.GetInUse()}, nil
}
