package executorclient

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/imagecache"
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
		out = append(out, jobs.CacheInfo{Repository: c.GetRepository(), Name: c.GetName(), Size: c.GetSizeBytes(), LastUsed: c.GetLastUsed().AsTime()})
	}
	return out
}

// CacheInfosToProto converts a tenant's caches for the authority's API.
func CacheInfosToProto(in []jobs.CacheInfo) []*typesv1.CacheInfo {
	out := make([]*typesv1.CacheInfo, 0, len(in))
	for _, c := range in {
		out = append(out, &typesv1.CacheInfo{Repository: c.Repository, Name: c.Name, SizeBytes: c.Size, LastUsed: timestamppb.New(c.LastUsed)})
	}
	return out
}

// ListImages implements jobs.ImageCache.
func (c *Client) ListImages(ctx context.Context, tenant, digest string) (imagecache.List, error) {
	resp, err := c.c.ListImages(ctx, &executorv1.ListImagesRequest{Tenant: tenant, Digest: digest})
	if err != nil {
		return imagecache.List{}, fromStatus(err)
	}
	return imagecache.List{Images: ImagesFromProto(resp.GetImages()), Stats: ImageStatsFromProto(resp.GetCache())}, nil
}

// PruneImages implements jobs.ImageCache.
func (c *Client) PruneImages(ctx context.Context, tenant, digest string) (imagecache.Pruned, error) {
	resp, err := c.c.PruneImages(ctx, &executorv1.PruneImagesRequest{Tenant: tenant, Digest: digest})
	if err != nil {
		return imagecache.Pruned{}, fromStatus(err)
	}
	return imagecache.Pruned{Images: ImagesFromProto(resp.GetPruned()), Freed: resp.GetFreedBytes(), InUse: resp.GetInUse()}, nil
}

// ImagesFromProto reads cached images.
func ImagesFromProto(in []*typesv1.ImageInfo) []imagecache.Image {
	out := make([]imagecache.Image, 0, len(in))
	for _, i := range in {
		img := imagecache.Image{Reference: i.GetReference(), Digest: i.GetDigest(), Size: i.GetSizeBytes(), LastUsed: i.GetLastUsed().AsTime(),
			Jobs: i.GetJobs(), InUse: int(i.GetInUse())}
		for _, l := range i.GetLayers() {
			img.Layers = append(img.Layers, imagecache.Layer{Digest: l.GetDigest(), DiffID: l.GetDiffId(), MediaType: l.GetMediaType(),
				Compressed: l.GetCompressedBytes(), Unpacked: l.GetUnpackedBytes()})
		}
		out = append(out, img)
	}
	return out
}

// ImagesToProto converts cached images for an API.
func ImagesToProto(in []imagecache.Image) []*typesv1.ImageInfo {
	out := make([]*typesv1.ImageInfo, 0, len(in))
	for _, i := range in {
		p := &typesv1.ImageInfo{Reference: i.Reference, Digest: i.Digest, SizeBytes: i.Size, LastUsed: timestamppb.New(i.LastUsed),
			Jobs: i.Jobs, InUse: int32(i.InUse)}
		for _, l := range i.Layers {
			p.Layers = append(p.Layers, &typesv1.ImageLayerInfo{Digest: l.Digest, DiffId: l.DiffID, MediaType: l.MediaType,
				CompressedBytes: l.Compressed, UnpackedBytes: l.Unpacked})
		}
		out = append(out, p)
	}
	return out
}

// ImageStatsFromProto reads a cache's stats.
func ImageStatsFromProto(s *typesv1.ImageCacheStats) imagecache.Stats {
	return imagecache.Stats{Size: s.GetSizeBytes(), MaxSize: s.GetMaxBytes(), Layers: int(s.GetLayers()), Images: int(s.GetImages()),
		Pulls: s.GetPulls(), PulledBytes: s.GetPulledBytes(), Hits: s.GetHits(), Evictions: s.GetEvictions()}
}

// ImageStatsToProto converts a cache's stats for an API.
func ImageStatsToProto(s imagecache.Stats) *typesv1.ImageCacheStats {
	return &typesv1.ImageCacheStats{SizeBytes: s.Size, MaxBytes: s.MaxSize, Layers: int32(s.Layers), Images: int32(s.Images),
		Pulls: s.Pulls, PulledBytes: s.PulledBytes, Hits: s.Hits, Evictions: s.Evictions}
}
