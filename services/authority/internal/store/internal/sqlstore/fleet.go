package sqlstore

import (
	"context"
	"errors"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Placeholders until the fleet tables land (being written on another branch).

func (s *DB) UpdateExecutorAudited(ctx context.Context, name string, update func(e *store.Executor, found bool) (*audit.Event, error)) (store.Executor, error) {
	return store.Executor{}, errors.ErrUnsupported
}
func (s *DB) GetExecutor(ctx context.Context, name string) (store.Executor, error) {
	return store.Executor{}, errors.ErrUnsupported
}
func (s *DB) ListExecutors(ctx context.Context) ([]store.Executor, error) {
	return nil, errors.ErrUnsupported
}
func (s *DB) Placements(ctx context.Context) ([]store.Placement, error) {
	return nil, errors.ErrUnsupported
}
func (s *DB) JobsOnExecutor(ctx context.Context, executor string, limit int, states ...store.State) ([]store.Job, error) {
	return nil, errors.ErrUnsupported
}
func (s *DB) ClaimJobs(ctx context.Context, owner string, now, until time.Time, limit int) ([]store.Job, error) {
	return nil, errors.ErrUnsupported
}
func (s *DB) RenewClaims(ctx context.Context, owner string, until time.Time) ([]string, error) {
	return nil, errors.ErrUnsupported
}
func (s *DB) ReleaseClaims(ctx context.Context, owner string) error { return errors.ErrUnsupported }
