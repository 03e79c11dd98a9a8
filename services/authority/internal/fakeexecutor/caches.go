package fakeexecutor

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// The fake keeps a cache (size 0) for each (tenant, repository, name) a
// started grant named, as the real executor makes one on first use.

// cachesLocked is every cache the fake's grants named, by tenant, in
// repository and name order. Called with e.mu held.
func (e *Executor) cachesLocked(tenant string) []*typesv1.CacheInfo {
	var out []*typesv1.CacheInfo
	seen := map[string]bool{}
	for _, gs := range e.grants {
		for _, g := range gs {
			for _, c := range g.GetCaches() {
				key := g.GetRepository() + "\x00" + c.GetName()
				if g.GetTenant() != tenant || seen[key] || e.cleared[tenant+"\x00"+key] {
					continue
				}
				seen[key] = true
				out = append(out, &typesv1.CacheInfo{Repository: g.GetRepository(), Name: c.GetName(), LastUsed: timestamppb.New(g.GetIssuedAt().AsTime())})
			}
		}
	}
	slices.SortFunc(out, func(a, b *typesv1.CacheInfo) int {
		return strings.Compare(a.GetRepository()+"\x00"+a.GetName(), b.GetRepository()+"\x00"+b.GetName())
	})
	return out
}

func (e *Executor) ListCaches(_ context.Context, req *executorv1.ListCachesRequest) (*executorv1.ListCachesResponse, error) {
	if req.GetTenant() == "" {
		return nil, status.Error(codes.InvalidArgument, "tenant is required")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return &executorv1.ListCachesResponse{Caches: e.cachesLocked(req.GetTenant())}, nil
}

func (e *Executor) ClearCaches(_ context.Context, req *executorv1.ClearCachesRequest) (*executorv1.ClearCachesResponse, error) {
	if req.GetTenant() == "" {
		return nil, status.Error(codes.InvalidArgument, "tenant is required")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*typesv1.CacheInfo
	for _, c := range e.cachesLocked(req.GetTenant()) {
		if (req.GetRepository() != "" && c.GetRepository() != req.GetRepository()) || (req.GetName() != "" && c.GetName() != req.GetName()) {
			continue
		}
		if e.cleared == nil {
			e.cleared = map[string]bool{}
		}
		e.cleared[req.GetTenant()+"\x00"+c.GetRepository()+"\x00"+c.GetName()] = true
		out = append(out, c)
	}
	return &executorv1.ClearCachesResponse{Cleared: out}, nil
}

// The fake pulls no images: its cache is always empty.

func (e *Executor) ListImages(_ context.Context, req *executorv1.ListImagesRequest) (*executorv1.ListImagesResponse, error) {
	if req.GetTenant() == "" {
		return nil, status.Error(codes.InvalidArgument, "tenant is required")
	}
	return &executorv1.ListImagesResponse{Cache: &typesv1.ImageCacheStats{}}, nil
}

func (e *Executor) PruneImages(_ context.Context, req *executorv1.PruneImagesRequest) (*executorv1.PruneImagesResponse, error) {
	if req.GetTenant() == "" {
		return nil, status.Error(codes.InvalidArgument, "tenant is required")
	}
	return &executorv1.PruneImagesResponse{}, nil
}
