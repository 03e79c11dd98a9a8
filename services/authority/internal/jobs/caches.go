package jobs

import (
	"context"
	"errors"
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
	var all []CacheInfo
	err := s.eachExecutor(ctx, false, func(name string, ex Executor) error {
		got, err := ex.ListCaches(ctx, tenant)
		for i := range got {
			got[i].Executor = name
		}
		all = append(all, got...)
		return err
	})
	return all, err
}

// eachExecutor calls fn with every executor of the fleet that is not lost,
// one after another, and returns the errors it met, each naming its
// executor: a tenant's caches and images are kept on each executor its
// jobs ran on. With change set, a lost executor is an error too: what it
// keeps was not changed, and the caller must hear so (clearing a cache may
// be a response to a leak).
func (s *Service) eachExecutor(ctx context.Context, change bool, fn func(name string, ex Executor) error) error {
	members, err := s.cfg.Fleet.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range members {
		if m.Lost {
			if change {
				errs = append(errs, fmt.Errorf("%w: executor %s is lost: what it keeps was not changed; do it again when it is back", errdefs.ErrUnavailable, m.Name))
			}
			continue
		}
		if err := fn(m.Name, s.cfg.Executors.For(m.ID)); err != nil {
			errs = append(errs, fmt.Errorf("executor %s: %w", m.Name, err))
		}
	}
	return errors.Join(errs...)
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
	var cleared []CacheInfo
	err := s.eachExecutor(ctx, true, func(executor string, ex Executor) error {
		got, err := ex.ClearCaches(ctx, tenant, repository, name)
		for i := range got {
			got[i].Executor = executor
		}
		cleared = append(cleared, got...)
		return err
	})
	if err != nil && len(cleared) == 0 {
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
	if aerr := s.audit(ctx, audit.Event{Kind: audit.KindCachesCleared, Caller: caller.String(), Subject: tenant, Tenant: tenant, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("%s: %d cleared, %s", what, len(cleared), config.FormatByteSize(size))}); aerr != nil {
		return cleared, aerr
	}
	return cleared, err
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
	var all imagecache.List
	err := s.eachExecutor(ctx, false, func(name string, ex Executor) error {
		got, err := ex.ListImages(ctx, tenant, digest)
		for i := range got.Images {
			got.Images[i].Executor = name
		}
		all.Images = append(all.Images, got.Images...)
		all.Stats = all.Stats.Add(got.Stats)
		return err
	})
	return all, err
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
	var p imagecache.Pruned
	err := s.eachExecutor(ctx, true, func(name string, ex Executor) error {
		got, err := ex.PruneImages(ctx, tenant, digest)
		for i := range got.Images {
			got.Images[i].Executor = name
		}
		p.Images, p.InUse, p.Freed = append(p.Images, got.Images...), append(p.InUse, got.InUse...), p.Freed+got.Freed
		return err
	})
	if err != nil && len(p.Images) == 0 {
		return p, err
	}
	what := "every image"
	if digest != "" {
		what = "image " + digest
	}
	if aerr := s.audit(ctx, audit.Event{Kind: audit.KindImagesPruned, Caller: caller.String(), Subject: tenant, Tenant: tenant, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("images: %s: %d pruned, %d kept in use, %s freed", what, len(p.Images), len(p.InUse), config.FormatByteSize(p.Freed))}); aerr != nil {
		return p, aerr
	}
	return p, err
}
