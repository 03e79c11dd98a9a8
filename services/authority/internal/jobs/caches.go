package jobs

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/imagecache"
	"github.com/airlockhq/airlock/services/authority/internal/images"
)

// ListCaches lists tenant's named caches on its executor, for a client
// acting for it.
func (s *Service) ListCaches(ctx context.Context, caller identity.ID, tenant string) ([]CacheInfo, error) {
	if _, err := s.tenantFor(caller, tenant); err != nil {
		return nil, err
	}
	return s.cfg.Executor.ListCaches(ctx, tenant)
}

// ClearCaches wipes tenant's named caches of repository (every one if "")
// named name (every name if ""), for a client acting for it, and records
// what was wiped on the audit log.
func (s *Service) ClearCaches(ctx context.Context, caller identity.ID, tenant, repository, name string) ([]CacheInfo, error) {
	if _, err := s.tenantFor(caller, tenant); err != nil {
		return nil, err
	}
	// Any names: the tenant's caches only are wiped, and one of a
	// repository or cache since dropped from its policy may still be kept.
	for _, f := range []struct{ name, v string }{{"repository", repository}, {"name", name}} {
		if len(f.v) > maxNameBytes {
			return nil, fmt.Errorf("%w: %s: at most %d bytes", errdefs.ErrInvalidArgument, f.name, maxNameBytes)
		}
	}
	cleared, err := s.cfg.Executor.ClearCaches(ctx, tenant, repository, name)
	if err != nil {
		return nil, err
	}
	var size int64
	for _, c := range cleared {
		size += c.Size
	}
	what := "every cache"
	switch {
	case repository != "" && name != "":
		what = fmt.Sprintf("cache %s of repository %s", name, repository)
	case repository != "":
		what = "the caches of repository " + repository
	case name != "":
		what = "cache " + name + " of every repository"
	}
	if err := s.audit(ctx, audit.Event{Kind: audit.KindCachesCleared, Caller: caller.String(), Subject: tenant, Tenant: tenant, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("%s: %d cleared, %s", what, len(cleared), config.FormatByteSize(size))}); err != nil {
		return cleared, err
	}
	return cleared, nil
}

// ListImages lists the images tenant's jobs ran on that its executor
// holds, for a client acting for it.
func (s *Service) ListImages(ctx context.Context, caller identity.ID, tenant, digest string) (imagecache.List, error) {
	if _, err := s.tenantFor(caller, tenant); err != nil {
		return imagecache.List{}, err
	}
	if digest != "" {
		if err := images.CheckDigest(digest); err != nil {
			return imagecache.List{}, fmt.Errorf("%w: digest: %v", errdefs.ErrInvalidArgument, err)
		}
	}
	return s.cfg.Executor.ListImages(ctx, tenant, digest)
}

// PruneImages drops tenant's hold on its cached images (one when digest
// is set) for a client acting for it, and records it on the audit log.
func (s *Service) PruneImages(ctx context.Context, caller identity.ID, tenant, digest string) (imagecache.Pruned, error) {
	if _, err := s.tenantFor(caller, tenant); err != nil {
		return imagecache.Pruned{}, err
	}
	if digest != "" {
		if err := images.CheckDigest(digest); err != nil {
			return imagecache.Pruned{}, fmt.Errorf("%w: digest: %v", errdefs.ErrInvalidArgument, err)
		}
	}
	p, err := s.cfg.Executor.PruneImages(ctx, tenant, digest)
	if err != nil {
		return p, err
	}
	what := "every image"
	if digest != "" {
		what = "image " + digest
	}
	err = s.audit(ctx, audit.Event{Kind: audit.KindImagesPruned, Caller: caller.String(), Subject: tenant, Tenant: tenant, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("images: %s: %d pruned, %d kept in use, %s freed", what, len(p.Images), len(p.InUse), config.FormatByteSize(p.Freed))})
	return p, err
}
