// Package sqlstore is the one implementation of store.Store that both SQL
// backends share: the schema (schema.go), queries, row mapping, page
// tokens and the audit chain, written once in the SQL that SQLite and
// PostgreSQL both speak, so the two cannot drift apart. pkg/sqldb opens
// the database, runs the migrations and supplies the Dialect for what
// differs (placeholders, row locks). Only store/sqlite and store/postgres
// import it.
package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// DB is a store.Store over a database sqldb opened.
type DB struct {
	*sqldb.DB
}

var _ store.Store = (*DB)(nil)

// Wrap returns the store over db, whose schema is the authority's.
func Wrap(db *sqldb.DB) *DB { return &DB{DB: db} }

const jobColumns = `id, tenant, requester, idempotency_key, repository, spec, spec_digest, commit_sha, tree_hash,
	state, message, network_state, signed_grant, grant_expires_at, dispatched_at,
	result, bundle_digest, patch, review, provenance, created_at, updated_at, version, executor,
	claimed_by, claim_expires_at, started_at, ended_at`

type scanner interface{ Scan(dest ...any) error }

func scanJob(row scanner) (store.Job, error) {
	var (
		j                                          store.Job
		state                                      string
		expires, dispatched, created, updated      int64
		claimExpires, started, ended               int64
		spec, grant, result, patch, review, proven []byte
	)
	err := row.Scan(&j.ID, &j.Tenant, &j.Requester, &j.IdempotencyKey, &j.Repository, &spec, &j.SpecDigest, &j.Commit, &j.TreeHash,
		&state, &j.Message, &j.NetworkState, &grant, &expires, &dispatched,
		&result, &j.BundleDigest, &patch, &review, &proven, &created, &updated, &j.Version, &j.Executor,
		&j.ClaimedBy, &claimExpires, &started, &ended)
	if err != nil {
		return store.Job{}, err
	}
	j.State = store.State(state)
	j.Spec, j.Grant, j.Result, j.Patch, j.Review, j.Provenance = spec, grant, result, patch, review, proven
	j.GrantExpiresAt, j.DispatchedAt = fromMicros(expires), fromMicros(dispatched)
	j.CreatedAt, j.UpdatedAt = fromMicros(created), fromMicros(updated)
	j.ClaimExpiresAt = fromMicros(claimExpires)
	j.StartedAt, j.EndedAt = fromMicros(started), fromMicros(ended)
	return j, nil
}

// stamp sets a job's StartedAt and EndedAt, the span metering clips and
// splits by day. StartedAt is set when the job is first written staging
// or running: when its run began, not when it was first dispatched (a
// start the executor refuses for room leaves it waiting, queued). A job
// that ends with a result having been seen in neither takes its dispatch
// as its start, the best this store knows. EndedAt is set when the job is
// first written in an end state, and moved to now when a result arrives
// for a job that had ended without one (cancelled while its executor was
// lost, say): a late result is a change metering must read again, and
// its end is when the run's record was complete. hadResult says the
// stored job had a result before this write.
func stamp(j *store.Job, hadResult bool) {
	at := j.UpdatedAt
	if at.IsZero() {
		at = j.CreatedAt
	}
	if j.StartedAt.IsZero() {
		switch {
		case j.State == store.StateStaging || j.State == store.StateRunning:
			j.StartedAt = at
		case j.State.Terminal() && len(j.Result) > 0:
			j.StartedAt = cmp.Or(j.DispatchedAt, at)
		}
	}
	if j.State.Terminal() && (j.EndedAt.IsZero() || (!hadResult && len(j.Result) > 0)) && at.After(j.EndedAt) {
		j.EndedAt = at
	}
}

// Job times are stored as microseconds since the epoch, UTC: the precision
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

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// CreateJob implements store.Store.
func (s *DB) CreateJob(ctx context.Context, j store.Job) (store.Job, bool, error) {
	return s.createJob(ctx, j, nil)
}

// CreateJobAudited implements store.Store.
func (s *DB) CreateJobAudited(ctx context.Context, j store.Job, e audit.Event) (store.Job, bool, error) {
	return s.createJob(ctx, j, &e)
}

func (s *DB) createJob(ctx context.Context, j store.Job, e *audit.Event) (store.Job, bool, error) {
	if j.ID == "" || j.Tenant == "" || j.IdempotencyKey == "" || !j.State.Valid() {
		return store.Job{}, false, fmt.Errorf("store: create job: id, tenant, idempotency key and a valid state are required")
	}
	if e != nil {
		if e.JobID == "" {
			e.JobID = j.ID
		}
		if e.Tenant == "" {
			e.Tenant = j.Tenant
		}
		if err := e.Validate(); err != nil {
			return store.Job{}, false, fmt.Errorf("store: create job: %w: %v", errdefs.ErrInvalidArgument, err)
		}
	}
	var (
		out     store.Job
		created bool
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		// A concurrent insert of the same key makes this one wait for it and
		// then do nothing, in both databases; the key's job is then read.
		j.Version = 1
		j.StartedAt, j.EndedAt = time.Time{}, time.Time{}
		stamp(&j, false)
		res, err := tx.ExecContext(ctx, s.Q(`INSERT INTO jobs (`+jobColumns+`) VALUES (`+placeholders(28)+`)
			ON CONFLICT (tenant, idempotency_key) DO NOTHING`),
			j.ID, j.Tenant, j.Requester, j.IdempotencyKey, j.Repository, nonNil(j.Spec), j.SpecDigest, j.Commit, j.TreeHash,
			string(j.State), j.Message, j.NetworkState, j.Grant, micros(j.GrantExpiresAt), micros(j.DispatchedAt),
			j.Result, j.BundleDigest, j.Patch, j.Review, j.Provenance, micros(j.CreatedAt), micros(j.UpdatedAt), j.Version, j.Executor,
			j.ClaimedBy, micros(j.ClaimExpiresAt), micros(j.StartedAt), micros(j.EndedAt))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			out, err = scanJob(tx.QueryRowContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE tenant = ? AND idempotency_key = ?`), j.Tenant, j.IdempotencyKey))
			return err
		}
		out, err = scanJob(tx.QueryRowContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE id = ?`), j.ID))
		if err != nil {
			return err
		}
		created = true
		if e != nil {
			_, err = s.appendAudit(ctx, tx, *e)
		}
		return err
	})
	if err != nil {
		return store.Job{}, false, fmt.Errorf("store: create job: %w", err)
	}
	return out, created, nil
}

// GetJob implements store.Store.
func (s *DB) GetJob(ctx context.Context, id string) (store.Job, error) {
	j, err := scanJob(s.SQL.QueryRowContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, fmt.Errorf("%w: job %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return store.Job{}, fmt.Errorf("store: get job: %w", err)
	}
	return j, nil
}

// JobByIdempotencyKey implements store.Store.
func (s *DB) JobByIdempotencyKey(ctx context.Context, tenant, key string) (store.Job, error) {
	j, err := scanJob(s.SQL.QueryRowContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE tenant = ? AND idempotency_key = ?`), tenant, key))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, fmt.Errorf("%w: no job with that idempotency key", errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Job{}, fmt.Errorf("store: job by idempotency key: %w", err)
	}
	return j, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// ListJobs implements store.Store.
func (s *DB) ListJobs(ctx context.Context, opts store.ListOptions) ([]store.Job, string, error) {
	if opts.Limit <= 0 {
		return nil, "", fmt.Errorf("store: list jobs: limit must be positive")
	}
	where := []string{"tenant = ?"}
	args := []any{opts.Tenant}
	if len(opts.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(opts.States))+")")
		for _, st := range opts.States {
			args = append(args, string(st))
		}
	}
	tail, args, err := newestFirst(where, args, opts.PageToken, opts.Limit)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE `+tail), args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list jobs: %w", err)
	}
	jobs, err := collect(rows, scanJob)
	if err != nil {
		return nil, "", fmt.Errorf("store: list jobs: %w", err)
	}
	jobs, next := trimPage(jobs, opts.Limit, jobSize, func(j store.Job) (time.Time, string) { return j.CreatedAt, j.ID })
	return jobs, next, nil
}

// collect scans every row and closes rows.
func collect[T any](rows *sql.Rows, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
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
func (s *DB) JobsInStates(ctx context.Context, states ...store.State) ([]store.Job, error) {
	if len(states) == 0 {
		return nil, nil
	}
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = string(st)
	}
	rows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE state IN (`+placeholders(len(states))+`) ORDER BY created_at, id`), args...)
	if err != nil {
		return nil, fmt.Errorf("store: jobs in states: %w", err)
	}
	jobs, err := collect(rows, scanJob)
	if err != nil {
		return nil, fmt.Errorf("store: jobs in states: %w", err)
	}
	return jobs, nil
}

// UsageJobs implements store.Store.
func (s *DB) UsageJobs(ctx context.Context, f store.UsageFilter) ([]store.UsageRecord, error) {
	if f.Since.IsZero() || f.Until.IsZero() {
		return nil, fmt.Errorf("store: usage jobs: since and until are required")
	}
	where := "started_at <> 0 AND started_at < ? AND (ended_at = 0 OR ended_at > ?)"
	args := []any{micros(f.Until), micros(f.Since)}
	if len(f.Tenants) > 0 {
		where += " AND tenant IN (" + placeholders(len(f.Tenants)) + ")"
		for _, t := range f.Tenants {
			args = append(args, t)
		}
	}
	limit := ""
	if f.Limit > 0 {
		limit = " LIMIT " + strconv.Itoa(f.Limit)
	}
	rows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT id, tenant, state, signed_grant, result, started_at, ended_at FROM jobs WHERE `+where+
		` ORDER BY started_at DESC, id DESC`+limit), args...)
	if err != nil {
		return nil, fmt.Errorf("store: usage jobs: %w", err)
	}
	out, err := collect(rows, func(row scanner) (store.UsageRecord, error) {
		var (
			r              store.UsageRecord
			state          string
			started, ended int64
			grant, result  []byte
		)
		if err := row.Scan(&r.ID, &r.Tenant, &state, &grant, &result, &started, &ended); err != nil {
			return r, err
		}
		r.State, r.Grant, r.Result = store.State(state), grant, result
		r.StartedAt, r.EndedAt = fromMicros(started), fromMicros(ended)
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: usage jobs: %w", err)
	}
	return out, nil
}

// UpdateJob implements store.Store.
func (s *DB) UpdateJob(ctx context.Context, id string, update func(*store.Job) error) (store.Job, error) {
	return s.updateJob(ctx, id, func(j *store.Job) (*audit.Event, error) { return nil, update(j) })
}

// UpdateJobAudited implements store.Store.
func (s *DB) UpdateJobAudited(ctx context.Context, id string, update func(*store.Job) (audit.Event, error)) (store.Job, error) {
	return s.updateJob(ctx, id, func(j *store.Job) (*audit.Event, error) {
		e, err := update(j)
		return &e, err
	})
}

// updateJob is the read-modify-write of one job, with the audit event
// update returns (if any) appended in the same transaction.
func (s *DB) updateJob(ctx context.Context, id string, update func(*store.Job) (*audit.Event, error)) (store.Job, error) {
	var out store.Job
	var userErr error
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		var err error
		out, userErr, err = s.updateJobTx(ctx, tx, id, update)
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

// updateJobTx is updateJob's work inside tx. userErr is set (and returned
// as err too) when the refusal is the caller's: the job is unknown or
// update said no.
func (s *DB) updateJobTx(ctx context.Context, tx *sql.Tx, id string, update func(*store.Job) (*audit.Event, error)) (out store.Job, userErr, err error) {
	j, err := scanJob(tx.QueryRowContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE id = ?`+s.D.ForUpdate), id))
	if errors.Is(err, sql.ErrNoRows) {
		err = fmt.Errorf("%w: job %q", errdefs.ErrNotFound, id)
		return out, err, err
	}
	if err != nil {
		return out, nil, err
	}
	// The event defaults to the job as stored, not as update left it.
	jobID, tenant := j.ID, j.Tenant
	started, ended, hadResult := j.StartedAt, j.EndedAt, len(j.Result) > 0
	e, err := update(&j)
	if err != nil {
		return out, err, err
	}
	j.StartedAt, j.EndedAt = started, ended
	stamp(&j, hadResult)
	if !j.State.Valid() {
		return out, nil, fmt.Errorf("invalid state %q", j.State)
	}
	if e != nil {
		if e.JobID == "" {
			e.JobID = jobID
		}
		if e.Tenant == "" {
			e.Tenant = tenant
		}
		if err := e.Validate(); err != nil {
			return out, nil, fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
		}
	}
	j.Version++
	// claimed_by and claim_expires_at are not written: claims belong to
	// ClaimJobs, RenewClaims and ReleaseClaims (fleet.go).
	res, err := tx.ExecContext(ctx, s.Q(`UPDATE jobs SET commit_sha = ?, tree_hash = ?, state = ?, message = ?, network_state = ?,
		signed_grant = ?, grant_expires_at = ?, dispatched_at = ?, result = ?, bundle_digest = ?, patch = ?,
		review = ?, provenance = ?, updated_at = ?, version = ?, executor = ?, started_at = ?, ended_at = ? WHERE id = ? AND version = ?`),
		j.Commit, j.TreeHash, string(j.State), j.Message, j.NetworkState,
		j.Grant, micros(j.GrantExpiresAt), micros(j.DispatchedAt), j.Result, j.BundleDigest, j.Patch,
		j.Review, j.Provenance, micros(j.UpdatedAt), j.Version, j.Executor, micros(j.StartedAt), micros(j.EndedAt), id, j.Version-1)
	if err != nil {
		return out, nil, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return out, nil, fmt.Errorf("job %q changed underneath the update (rows=%d, err=%v)", id, n, err)
	}
	if e != nil {
		if _, err := s.appendAudit(ctx, tx, *e); err != nil {
			return out, nil, err
		}
	}
	out, err = scanJob(tx.QueryRowContext(ctx, s.Q(`SELECT `+jobColumns+` FROM jobs WHERE id = ?`), id))
	return out, nil, err
}

// newestFirst finishes a keyset-paged query over (created_at, id), newest
// first: the conditions in where, the position after token, and a LIMIT of
// one more than limit, which tells whether another page exists. It returns
// the text after WHERE and the arguments.
func newestFirst(where []string, args []any, token string, limit int) (string, []any, error) {
	if token != "" {
		at, id, err := decodeToken(token)
		if err != nil {
			return "", nil, err
		}
		where = append(where, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, at, at, id)
	}
	return strings.Join(where, " AND ") + ` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, limit+1), nil
}

// PageBytes bounds what one page of a listing holds, so a page always
// fits in a gRPC message (4 MiB by default) however large its rows are: a
// page ends before the row that would take it past PageBytes (it always
// holds at least one row) and the next page starts there.
const PageBytes = 2 << 20

// trimPage cuts a newestFirst result to limit rows and PageBytes (as size
// counts a row) and returns the token of the next page ("" when there is
// none).
func trimPage[T any](list []T, limit int, size func(T) int, key func(T) (time.Time, string)) ([]T, string) {
	n, total := 0, 0
	for n < len(list) && n < limit {
		total += size(list[n])
		if n > 0 && total > PageBytes {
			break
		}
		n++
	}
	if n == len(list) {
		return list, ""
	}
	list = list[:n]
	at, id := key(list[n-1])
	return list, encodeToken(micros(at), id)
}

// jobSize is about what a job takes in a listing.
func jobSize(j store.Job) int {
	return len(j.Spec) + len(j.Grant) + len(j.Result) + len(j.Message) + len(j.Repository) + 512
}
