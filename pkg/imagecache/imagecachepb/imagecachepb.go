// Package imagecachepb converts package imagecache's values to and from
// the API's messages, for the executor's API and the authority's client
// of it.
package imagecachepb

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/imagecache"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// ImagesFromProto reads cached images.
func ImagesFromProto(in []*typesv1.ImageInfo) []imagecache.Image {
	out := make([]imagecache.Image, 0, len(in))
	for _, i := range in {
		img := imagecache.Image{Reference: i.GetReference(), Digest: i.GetDigest(), Size: i.GetSizeBytes(), LastUsed: i.GetLastUsed().AsTime(),
			Jobs: i.GetJobs(), InUse: int(i.GetInUse()), Executor: i.GetExecutor()}
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
			Jobs: i.Jobs, InUse: int32(i.InUse), Executor: i.Executor}
		for _, l := range i.Layers {
			p.Layers = append(p.Layers, &typesv1.ImageLayerInfo{Digest: l.Digest, DiffId: l.DiffID, MediaType: l.MediaType,
				CompressedBytes: l.Compressed, UnpackedBytes: l.Unpacked})
		}
		out = append(out, p)
	}
	return out
}

// StatsFromProto reads a cache's stats.
func StatsFromProto(s *typesv1.ImageCacheStats) imagecache.Stats {
	return imagecache.Stats{Size: s.GetSizeBytes(), MaxSize: s.GetMaxBytes(), Layers: int(s.GetLayers()), Images: int(s.GetImages()),
		Pulls: s.GetPulls(), PulledBytes: s.GetPulledBytes(), Hits: s.GetHits(), Evictions: s.GetEvictions()}
}

// StatsToProto converts a cache's stats for an API.
func StatsToProto(s imagecache.Stats) *typesv1.ImageCacheStats {
	return &typesv1.ImageCacheStats{SizeBytes: s.Size, MaxBytes: s.MaxSize, Layers: int32(s.Layers), Images: int32(s.Images),
		Pulls: s.Pulls, PulledBytes: s.PulledBytes, Hits: s.Hits, Evictions: s.Evictions}
}
