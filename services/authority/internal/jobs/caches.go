package jobs

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
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
