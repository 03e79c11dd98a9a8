// Package sqlite is the authority's embedded store: one SQLite file in the
// data directory (pure Go, modernc.org/sqlite), in WAL mode with a busy
// timeout and foreign keys on, its schema versioned in a migrations table.
// Its SQL keeps to what PostgreSQL also speaks, apart from the '?'
// placeholders and the column types of the migrations. Only the authority's
// composition root and tests import it; everything else sees store.Store.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	// The pure-Go driver, registered as "sqlite".
	_ "modernc.org/sqlite"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// migrations are applied in order, each once; the index plus one is the
// schema version. Never edit one that has shipped: append a new one.
var migrations = []string{
	`CREATE TABLE jobs (
		id               TEXT    NOT NULL PRIMARY KEY,
		tenant           TEXT    NOT NULL,
		requester        TEXT    NOT NULL,
		idempotency_key  TEXT    NOT NULL,
		repository       TEXT    NOT NULL,
		spec             BLOB    NOT NULL,
		spec_digest      TEXT    NOT NULL,
		commit_sha       TEXT    NOT NULL,
		tree_hash        TEXT    NOT NULL,
		state            TEXT    NOT NULL,
		message          TEXT    NOT NULL,
		network_state    TEXT    NOT NULL,
		signed_grant     BLOB,
		grant_expires_at BIGINT  NOT NULL,
		dispatched_at    BIGINT  NOT NULL,
		result           BLOB,
		bundle_digest    TEXT    NOT NULL,
		patch            BLOB,
		output_tail      BLOB,
		provenance       BLOB,
		created_at       BIGINT  NOT NULL,
		updated_at       BIGINT  NOT NULL,
		version          BIGINT  NOT NULL,
		UNIQUE (tenant, idempotency_key)
	);
	CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at, id);
	CREATE INDEX jobs_by_state ON jobs (state, created_at);`,
}

// Store is the SQLite implementation of store.Store.
type Store struct {
	db *sql.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file at path and brings its
// schema up to date. A schema newer than this build knows is refused rather
// than guessed at.
func Open(ctx context.Context, path string) (*Store, error) {
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("store: database path %q must not contain '?' or '#'", path)
	}
	// _txlock=immediate takes the write lock when a transaction begins, so
	// two read-modify-write transactions queue on busy_timeout instead of
	// one failing when it upgrades its read lock.
	dsn := path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(8)
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		applied_at BIGINT  NOT NULL
	)`); err != nil {
		return fmt.Errorf("migrations table: %w", err)
	}
	var current int
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if current > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this build knows (%d); run a newer authority", current, len(migrations))
	}
	for v := current + 1; v <= len(migrations); v++ {
		err := s.tx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, migrations[v-1]); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, v, time.Now().UnixMicro())
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %d: %w", v, err)
		}
	}
	return nil
}

// SchemaVersion returns the applied schema version, for tests and status.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

const columns = `id, tenant, requester, idempotency_key, repository, spec, spec_digest, commit_sha, tree_hash,
	state, message, network_state, signed_grant, grant_expires_at, dispatched_at,
	result, bundle_digest, patch, output_tail, provenance, created_at, updated_at, version`

type scanner interface{ Scan(dest ...any) error }

func scanJob(row scanner) (store.Job, error) {
	var (
		j                                        store.Job
		state                                    string
		expires, dispatched, created, updated    int64
		spec, grant, result, patch, tail, proven []byte
	)
	err := row.Scan(&j.ID, &j.Tenant, &j.Requester, &j.IdempotencyKey, &j.Repository, &spec, &j.SpecDigest, &j.Commit, &j.TreeHash,
		&state, &j.Message, &j.NetworkState, &grant, &expires, &dispatched,
		&result, &j.BundleDigest, &patch, &tail, &proven, &created, &updated, &j.Version)
	if err != nil {
		return store.Job{}, err
	}
	j.State = store.State(state)
	j.Spec, j.Grant, j.Result, j.Patch, j.OutputTail, j.Provenance = spec, grant, result, patch, tail, proven
	j.GrantExpiresAt, j.DispatchedAt = fromMicros(expires), fromMicros(dispatched)
	j.CreatedAt, j.UpdatedAt = fromMicros(created), fromMicros(updated)
	return j, nil
}

// Times are stored as microseconds since the epoch, UTC: the precision
// PostgreSQL keeps, so both stores round alike. Zero means unset.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// CreateJob implements store.Store.
func (s *Store) CreateJob(ctx context.Context, j store.Job) (store.Job, bool, error) {
	if j.ID == "" || j.Tenant == "" || j.IdempotencyKey == "" || !j.State.Valid() {
		return store.Job{}, false, fmt.Errorf("store: create job: id, tenant, idempotency key and a valid state are required")
	}
	var (
		out     store.Job
		created bool
	)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		existing, err := scanJob(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM jobs WHERE tenant = ? AND idempotency_key = ?`, j.Tenant, j.IdempotencyKey))
		if err == nil {
			out = existing
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		j.Version = 1
		_, err = tx.ExecContext(ctx, `INSERT INTO jobs (`+columns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			j.ID, j.Tenant, j.Requester, j.IdempotencyKey, j.Repository, nonNil(j.Spec), j.SpecDigest, j.Commit, j.TreeHash,
			string(j.State), j.Message, j.NetworkState, j.Grant, micros(j.GrantExpiresAt), micros(j.DispatchedAt),
			j.Result, j.BundleDigest, j.Patch, j.OutputTail, j.Provenance, micros(j.CreatedAt), micros(j.UpdatedAt), j.Version)
		if err != nil {
			return err
		}
		out, err = scanJob(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM jobs WHERE id = ?`, j.ID))
		created = err == nil
		return err
	})
	if err != nil {
		return store.Job{}, false, fmt.Errorf("store: create job: %w", err)
	}
	return out, created, nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// GetJob implements store.Store.
func (s *Store) GetJob(ctx context.Context, id string) (store.Job, error) {
	j, err := scanJob(s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, fmt.Errorf("%w: job %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return store.Job{}, fmt.Errorf("store: get job: %w", err)
	}
	return j, nil
}

// JobByIdempotencyKey implements store.Store.
func (s *Store) JobByIdempotencyKey(ctx context.Context, tenant, key string) (store.Job, error) {
	j, err := scanJob(s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM jobs WHERE tenant = ? AND idempotency_key = ?`, tenant, key))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, fmt.Errorf("%w: no job with that idempotency key", errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Job{}, fmt.Errorf("store: job by idempotency key: %w", err)
	}
	return j, nil
}

// ListJobs implements store.Store.
func (s *Store) ListJobs(ctx context.Context, opts store.ListOptions) ([]store.Job, string, error) {
	if opts.Limit <= 0 {
		return nil, "", fmt.Errorf("store: list jobs: limit must be positive")
	}
	where := []string{"tenant = ?"}
	args := []any{opts.Tenant}
	if len(opts.States) > 0 {
		where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(opts.States)), ", ")+")")
		for _, st := range opts.States {
			args = append(args, string(st))
		}
	}
	if opts.PageToken != "" {
		at, id, err := decodeToken(opts.PageToken)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, at, at, id)
	}
	// One more than asked tells whether another page exists.
	args = append(args, opts.Limit+1)
	rows, err := s.db.QueryContext(ctx, `SELECT `+columns+` FROM jobs WHERE `+strings.Join(where, " AND ")+
		` ORDER BY created_at DESC, id DESC LIMIT ?`, args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list jobs: %w", err)
	}
	defer rows.Close()
	var jobs []store.Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, "", fmt.Errorf("store: list jobs: %w", err)
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("store: list jobs: %w", err)
	}
	var next string
	if len(jobs) > opts.Limit {
		jobs = jobs[:opts.Limit]
		last := jobs[len(jobs)-1]
		next = encodeToken(micros(last.CreatedAt), last.ID)
	}
	return jobs, next, nil
}

// A page token is the position of the last job of the page: its creation
// time and id, which order jobs totally.
func encodeToken(at int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at, 10) + ":" + id))
}

func decodeToken(tok string) (int64, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err == nil {
		if at, id, ok := strings.Cut(string(raw), ":"); ok {
			if n, err := strconv.ParseInt(at, 10, 64); err == nil && id != "" {
				return n, id, nil
			}
		}
	}
	return 0, "", fmt.Errorf("%w: page_token: not a token this server issued", errdefs.ErrInvalidArgument)
}

// JobsInStates implements store.Store.
func (s *Store) JobsInStates(ctx context.Context, states ...store.State) ([]store.Job, error) {
	if len(states) == 0 {
		return nil, nil
	}
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = string(st)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+columns+` FROM jobs WHERE state IN (`+
		strings.TrimSuffix(strings.Repeat("?, ", len(states)), ", ")+`) ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: jobs in states: %w", err)
	}
	defer rows.Close()
	var jobs []store.Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("store: jobs in states: %w", err)
		}
		jobs = append(jobs, j)
	}
	return jobs, rows.Err()
}

// UpdateJob implements store.Store.
func (s *Store) UpdateJob(ctx context.Context, id string, update func(*store.Job) error) (store.Job, error) {
	var out store.Job
	var userErr error
	err := s.tx(ctx, func(tx *sql.Tx) error {
		j, err := scanJob(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM jobs WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			userErr = fmt.Errorf("%w: job %q", errdefs.ErrNotFound, id)
			return userErr
		}
		if err != nil {
			return err
		}
		if err := update(&j); err != nil {
			userErr = err
			return err
		}
		if !j.State.Valid() {
			return fmt.Errorf("invalid state %q", j.State)
		}
		j.Version++
		res, err := tx.ExecContext(ctx, `UPDATE jobs SET commit_sha = ?, tree_hash = ?, state = ?, message = ?, network_state = ?,
			signed_grant = ?, grant_expires_at = ?, dispatched_at = ?, result = ?, bundle_digest = ?, patch = ?, output_tail = ?,
			provenance = ?, updated_at = ?, version = ? WHERE id = ? AND version = ?`,
			j.Commit, j.TreeHash, string(j.State), j.Message, j.NetworkState,
			j.Grant, micros(j.GrantExpiresAt), micros(j.DispatchedAt), j.Result, j.BundleDigest, j.Patch, j.OutputTail,
			j.Provenance, micros(j.UpdatedAt), j.Version, id, j.Version-1)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("job %q changed underneath the update (rows=%d, err=%v)", id, n, err)
		}
		out, err = scanJob(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM jobs WHERE id = ?`, id))
		return err
	})
	if userErr != nil {
		return store.Job{}, userErr
	}
	if err != nil {
		return store.Job{}, fmt.Errorf("store: update job %q: %w", id, err)
	}
	return out, nil
}
