package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The fleet is two things: the executors table, one row per executor
// written only by UpdateExecutorAudited, and the claim columns of jobs
// (claimed_by, claim_expires_at), through which replicas share out the
// unfinished jobs. A claim is not a change of the job: taking, renewing
// and releasing one leaves Version and UpdatedAt alone, so watchers of a
// job see no change when replicas pass it between them.

// unfinished selects jobs that have not ended. The claim indexes of
// migration 9 carry the same predicate, word for word, so that SQLite's
// planner (which matches a partial index's predicate by its terms) uses
// them.
const unfinished = `state IN ('queued', 'staging', 'running')`

var unfinishedStates = []store.State{store.StateQueued, store.StateStaging, store.StateRunning}

const executorColumns = `name, id, address, report, state, draining, drained_by, drained_at, drain_reason,
	joined_at, last_seen, version`

func scanExecutor(row scanner) (store.Executor, error) {
	var (
		e                     store.Executor
		state                 string
		draining              int64
		drained, joined, seen int64
		report                []byte
	)
	err := row.Scan(&e.Name, &e.ID, &e.Address, &report, &state, &draining, &e.DrainedBy, &drained, &e.DrainReason,
		&joined, &seen, &e.Version)
	if err != nil {
		return store.Executor{}, err
	}
	e.Report, e.State, e.Draining = report, store.ExecutorState(state), draining != 0
	e.DrainedAt, e.JoinedAt, e.LastSeen = fromMicros(drained), fromMicros(joined), fromMicros(seen)
	return e, nil
}

// executorValues are e's columns in executorColumns order.
func executorValues(e store.Executor) []any {
	return []any{e.Name, e.ID, e.Address, nonNil(e.Report), string(e.State), flag(e.Draining), e.DrainedBy, micros(e.DrainedAt), e.DrainReason,
		micros(e.JoinedAt), micros(e.LastSeen), e.Version}
}

const selectExecutor = `SELECT ` + executorColumns + ` FROM executors WHERE name = ?`

// UpdateExecutorAudited implements store.Store.
func (s *DB) UpdateExecutorAudited(ctx context.Context, name string, update func(*store.Executor, bool) (*audit.Event, error)) (store.Executor, error) {
	if name == "" {
		return store.Executor{}, fmt.Errorf("%w: store: update executor: a name is required", errdefs.ErrInvalidArgument)
	}
	var (
		out     store.Executor
		userErr error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		// Writers of one name take turns on its key before they look, so
		// two first heartbeats at once cannot both find no row and insert.
		// (SQLite's write transactions already exclude each other.)
		if s.D.KeyLock != "" {
			if _, err := tx.ExecContext(ctx, s.Q(s.D.KeyLock), "executor:"+name); err != nil {
				return err
			}
		}
		e, err := scanExecutor(tx.QueryRowContext(ctx, s.Q(selectExecutor+s.D.ForUpdate), name))
		found := err == nil
		switch {
		case errors.Is(err, sql.ErrNoRows):
			e = store.Executor{Name: name}
		case err != nil:
			return err
		}
		version := e.Version
		ev, err := update(&e, found)
		if err != nil {
			userErr = err
			return err
		}
		e.Name, e.Version = name, version+1
		if e.ID == "" || (e.State != store.ExecutorUp && e.State != store.ExecutorLost) {
			return fmt.Errorf("%w: an executor needs an id and the state %q or %q", errdefs.ErrInvalidArgument, store.ExecutorUp, store.ExecutorLost)
		}
		if ev != nil {
			if err := ev.Validate(); err != nil {
				return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
			}
		}
		var holder string
		err = tx.QueryRowContext(ctx, s.Q(`SELECT name FROM executors WHERE id = ? AND name <> ?`), e.ID, name).Scan(&holder)
		switch {
		case err == nil:
			return fmt.Errorf("%w: id %q is executor %q's", errdefs.ErrAlreadyExists, e.ID, holder)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		v := executorValues(e)
		if found {
			_, err = tx.ExecContext(ctx, s.Q(`UPDATE executors SET id = ?, address = ?, report = ?, state = ?, draining = ?, drained_by = ?,
				drained_at = ?, drain_reason = ?, joined_at = ?, last_seen = ?, version = ? WHERE name = ?`), append(slices.Clone(v[1:]), name)...)
		} else {
			_, err = tx.ExecContext(ctx, s.Q(`INSERT INTO executors (`+executorColumns+`) VALUES (`+placeholders(len(v))+`)`), v...)
		}
		if err != nil {
			return err
		}
		if ev != nil {
			if _, err := s.appendAudit(ctx, tx, *ev); err != nil {
				return err
			}
		}
		// Read back, so the caller gets the times as stored (microseconds).
		out, err = scanExecutor(tx.QueryRowContext(ctx, s.Q(selectExecutor), name))
		return err
	})
	if userErr != nil {
		return store.Executor{}, userErr
	}
	if err != nil {
		return store.Executor{}, fmt.Errorf("store: update executor %q: %w", name, err)
	}
	return out, nil
}

// GetExecutor implements store.Store.
func (s *DB) GetExecutor(ctx context.Context, name string) (store.Executor, error) {
	e, err := scanExecutor(s.SQL.QueryRowContext(ctx, s.Q(selectExecutor), name))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Executor{}, fmt.Errorf("%w: executor %q", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return store.Executor{}, fmt.Errorf("store: get executor: %w", err)
	}
	return e, nil
}

// ListExecutors implements store.Store.
func (s *DB) ListExecutors(ctx context.Context) ([]store.Executor, error) {
	list, err := queryAll(ctx, s, s.SQL, scanExecutor, `SELECT `+executorColumns+` FROM executors ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list executors: %w", err)
	}
	return list, nil
}

// Placements implements store.Store.
func (s *DB) Placements(ctx context.Context) ([]store.Placement, error) {
	scan := func(r scanner) (store.Placement, error) {
		var p store.Placement
		return p, r.Scan(&p.Executor, &p.Tenant, &p.Jobs)
	}
	list, err := queryAll(ctx, s, s.SQL, scan, `SELECT executor, tenant, COUNT(*) FROM jobs WHERE `+unfinished+` AND executor <> ''
		GROUP BY executor, tenant ORDER BY executor, tenant`)
	if err != nil {
		return nil, fmt.Errorf("store: placements: %w", err)
	}
	return list, nil
}

// JobsOnExecutor implements store.Store.
func (s *DB) JobsOnExecutor(ctx context.Context, executor string, limit int, states ...store.State) ([]store.Job, error) {
	if executor == "" || limit <= 0 {
		return nil, fmt.Errorf("%w: store: jobs on executor: an executor and a positive limit are required", errdefs.ErrInvalidArgument)
	}
	if len(states) == 0 {
		states = unfinishedStates
	}
	args := []any{executor}
	for _, st := range states {
		args = append(args, string(st))
	}
	jobs, err := queryAll(ctx, s, s.SQL, scanJob, `SELECT `+jobColumns+` FROM jobs WHERE executor = ? AND state IN (`+placeholders(len(states))+`)
		ORDER BY created_at, id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("store: jobs on executor: %w", err)
	}
	return jobs, nil
}

// queryAll runs query (placeholders rebound) through q and scans every row.
func queryAll[T any](ctx context.Context, s *DB, q querier, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, s.Q(query), args...)
	if err != nil {
		return nil, err
	}
	return collect(rows, scan)
}

// ClaimJobs implements store.Store.
func (s *DB) ClaimJobs(ctx context.Context, owner string, now, until time.Time, limit int) ([]store.Job, error) {
	if owner == "" || limit <= 0 || !until.After(now) {
		return nil, fmt.Errorf("%w: store: claim jobs: an owner, a positive limit and an expiry after now are required", errdefs.ErrInvalidArgument)
	}
	// One statement picks and takes the jobs. In PostgreSQL a job another
	// claimer holds locked is skipped, not waited for, and one it claimed
	// meanwhile no longer matches when its row is locked; SQLite runs one
	// write transaction at a time.
	skip := ""
	if s.D.ForUpdate != "" {
		skip = s.D.ForUpdate + " SKIP LOCKED"
	}
	var jobs []store.Job
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		var err error
		jobs, err = queryAll(ctx, s, tx, scanJob, `UPDATE jobs SET claimed_by = ?, claim_expires_at = ? WHERE id IN (
			SELECT id FROM jobs WHERE `+unfinished+` AND claim_expires_at <= ? ORDER BY created_at, id LIMIT ?`+skip+`)
			RETURNING `+jobColumns, owner, micros(until), micros(now), limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: claim jobs: %w", err)
	}
	// RETURNING keeps no order.
	slices.SortFunc(jobs, func(a, b store.Job) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return jobs, nil
}

// RenewClaims implements store.Store.
func (s *DB) RenewClaims(ctx context.Context, owner string, until time.Time) ([]string, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: store: renew claims: an owner is required", errdefs.ErrInvalidArgument)
	}
	var ids []string
	scan := func(r scanner) (string, error) {
		var id string
		return id, r.Scan(&id)
	}
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		var err error
		ids, err = queryAll(ctx, s, tx, scan, `UPDATE jobs SET claim_expires_at = ? WHERE claimed_by = ? AND `+unfinished+` RETURNING id`,
			micros(until), owner)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: renew claims: %w", err)
	}
	slices.Sort(ids)
	return ids, nil
}

// ReleaseClaims implements store.Store. A released job is claimed by no
// one (claimed_by is cleared too), so a late RenewClaims of the releasing
// replica cannot take it back.
func (s *DB) ReleaseClaims(ctx context.Context, owner string) error {
	if owner == "" {
		return fmt.Errorf("%w: store: release claims: an owner is required", errdefs.ErrInvalidArgument)
	}
	if _, err := s.SQL.ExecContext(ctx, s.Q(`UPDATE jobs SET claimed_by = '', claim_expires_at = 0 WHERE claimed_by = ? AND `+unfinished), owner); err != nil {
		return fmt.Errorf("store: release claims: %w", err)
	}
	return nil
}
