// Package store keeps the publisher's deployments: one record per approval
// published, written before each step of the publish flow starts and after
// it ends, so that a publisher that crashes anywhere resumes from its own
// record (an outbox) and never repeats a step that has side effects. The
// same SQL runs on SQLite (the default, a file in the data directory) and
// PostgreSQL (for replicas) through pkg/sqldb. Only the publisher's
// publish, api and server packages import it.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/sqldb"
)

// State is where a deployment is.
type State string

// Deployment states.
const (
	InProgress State = "in_progress"
	Succeeded  State = "succeeded"
	Failed     State = "failed"
)

// Terminal reports whether s is an end state.
func (s State) Terminal() bool { return s == Succeeded || s == Failed }

// Step is the last step of the flow a deployment completed.
type Step string

// The steps, in order. Each is recorded once done; a resumed deployment
// goes on after the last one recorded.
const (
	StepAccepted  Step = "accepted"  // the request was recorded
	StepVerified  Step = "verified"  // bundle, provenance and grant checked
	StepValidated Step = "validated" // content validated, no findings
	StepPrepared  Step = "prepared"  // the commit made, not pushed
	StepConsumed  Step = "consumed"  // the approval spent
	StepLeased    Step = "leased"    // the deploy credential leased
	StepPushed    Step = "pushed"    // the commit on the branch
	StepRevoked   Step = "revoked"   // the lease ended
)

// Steps is every step in order.
var Steps = []Step{StepAccepted, StepVerified, StepValidated, StepPrepared, StepConsumed, StepLeased, StepPushed, StepRevoked}

// Reached reports whether d has recorded step, or a later one.
func (d Deployment) Reached(step Step) bool {
	return slices.Index(Steps, d.Step) >= slices.Index(Steps, step)
}

// Finding is one validation finding, secret-free.
type Finding struct {
	Rule     string `json:"rule"`
	Path     string `json:"path"`
	Line     int    `json:"line,omitempty"`
	Message  string `json:"message"`
	Redacted string `json:"redacted,omitempty"`
}

// Deployment is the record of one publish.
type Deployment struct {
	ID string
	// IdempotencyKey and RequestDigest (of the request's fields) are fixed
	// at creation: the same key with another request is refused.
	IdempotencyKey string
	RequestDigest  string
	Requester      string
	JobID          string
	ApprovalID     string
	Tenant         string
	BundleDigest   string
	TargetRepo     string
	TargetBranch   string

	State State
	Step  Step
	// Message says why it failed, for people.
	Message  string
	Findings []Finding
	// PolicyDigest names the validation policy applied.
	PolicyDigest string
	// BaseCommit is the job's base; ParentCommit what the commit was made
	// on; Commit the commit made (set from StepPrepared on).
	BaseCommit, ParentCommit, Commit string
	// LeaseID is the deploy-credential lease, while one is held.
	LeaseID string
	// Approvers are the SPIFFE IDs of the approving votes.
	Approvers []string
	// FilesDigest names the list of paths the approved bundle changes
	// (files.json) and the commit changes: the publisher checks they are
	// the same list before it spends the approval (FilesDigestOf).
	FilesDigest string
	// Readers are the approver principals ("approver/NAME") who may read
	// it, or AnyApprover; pipelines read every deployment.
	Readers []string
	// Owner is the publisher process running it, until ClaimedUntil: one
	// run at a time, whichever replica (Claim).
	Owner        string
	ClaimedUntil time.Time
	// Steps records when each step was done.
	Steps map[Step]time.Time

	CreatedAt, UpdatedAt time.Time
	Version              int64
}

// AnyApprover in Readers lets every approver read a deployment.
const AnyApprover = "approver/*"

// ReadableBy reports whether approver principal p may read d.
func (d Deployment) ReadableBy(p string) bool {
	for _, r := range d.Readers {
		if r == AnyApprover || r == p {
			return true
		}
	}
	return false
}

// Store is the deployments' storage.
type Store struct {
	db *sqldb.DB
}

var migrationsSQLite = []string{schema("BLOB")}
var migrationsPostgres = []string{schema("BYTEA")}

func schema(blob string) string {
	return `CREATE TABLE deployments (
		id              TEXT   NOT NULL PRIMARY KEY,
		idempotency_key TEXT   NOT NULL UNIQUE,
		request_digest  TEXT   NOT NULL,
		requester       TEXT   NOT NULL,
		job_id          TEXT   NOT NULL,
		approval_id     TEXT   NOT NULL UNIQUE,
		tenant          TEXT   NOT NULL,
		bundle_digest   TEXT   NOT NULL,
		target_repo     TEXT   NOT NULL,
		target_branch   TEXT   NOT NULL,
		state           TEXT   NOT NULL,
		step            TEXT   NOT NULL,
		message         TEXT   NOT NULL,
		findings        ` + blob + `,
		policy_digest   TEXT   NOT NULL,
		base_commit     TEXT   NOT NULL,
		parent_commit   TEXT   NOT NULL,
		commit_sha      TEXT   NOT NULL,
		lease_id        TEXT   NOT NULL,
		steps           ` + blob + `,
		approvers       ` + blob + `,
		files_digest    TEXT   NOT NULL,
		readers         ` + blob + `,
		owner           TEXT   NOT NULL,
		claimed_until   BIGINT NOT NULL,
		created_at      BIGINT NOT NULL,
		updated_at      BIGINT NOT NULL,
		version         BIGINT NOT NULL
	);
	CREATE INDEX deployments_by_time ON deployments (created_at, id);
	CREATE INDEX deployments_by_job ON deployments (job_id, created_at);`
}

// OpenSQLite opens the store in the SQLite file at path.
func OpenSQLite(ctx context.Context, path string) (*Store, error) {
	db, err := sqldb.OpenSQLite(ctx, path, sqldb.Dialect{Migrations: migrationsSQLite}, "publisher")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{db: db}, nil
}

// migrationKey: the first eight bytes of sha256("airlock.publisher.store.migrate").
const migrationKey = 2725563987111075337

// OpenPostgres opens the store in the PostgreSQL database dsn names.
func OpenPostgres(ctx context.Context, dsn string, maxConns int) (*Store, error) {
	db, err := sqldb.OpenPostgres(ctx, dsn, maxConns, sqldb.Postgres(migrationsPostgres, migrationKey), "publisher")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

const columns = `id, idempotency_key, request_digest, requester, job_id, approval_id, tenant, bundle_digest, target_repo, target_branch,
	state, step, message, findings, policy_digest, base_commit, parent_commit, commit_sha, lease_id, steps, approvers, files_digest, readers, owner, claimed_until, created_at, updated_at, version`

// setColumns is columns as "c = ?, …", for an UPDATE of every column.
var setColumns = func() string {
	var set []string
	for _, c := range strings.Split(columns, ",") {
		set = append(set, strings.TrimSpace(c)+" = ?")
	}
	return strings.Join(set, ", ")
}()

type scanner interface{ Scan(...any) error }

func scan(row scanner) (Deployment, error) {
	var (
		d                Deployment
		state, step      string
		findings, steps  []byte
		approvers        []byte
		readers          []byte
		created, updated int64
		claimed          int64
	)
	if err := row.Scan(&d.ID, &d.IdempotencyKey, &d.RequestDigest, &d.Requester, &d.JobID, &d.ApprovalID, &d.Tenant, &d.BundleDigest,
		&d.TargetRepo, &d.TargetBranch, &state, &step, &d.Message, &findings, &d.PolicyDigest, &d.BaseCommit, &d.ParentCommit,
		&d.Commit, &d.LeaseID, &steps, &approvers, &d.FilesDigest, &readers, &d.Owner, &claimed, &created, &updated, &d.Version); err != nil {
		return Deployment{}, err
	}
	d.State, d.Step = State(state), Step(step)
	if len(findings) > 0 {
		if err := json.Unmarshal(findings, &d.Findings); err != nil {
			return Deployment{}, fmt.Errorf("deployment %s: findings: %w", d.ID, err)
		}
	}
	if len(approvers) > 0 {
		if err := json.Unmarshal(approvers, &d.Approvers); err != nil {
			return Deployment{}, fmt.Errorf("deployment %s: approvers: %w", d.ID, err)
		}
	}
	if len(readers) > 0 {
		if err := json.Unmarshal(readers, &d.Readers); err != nil {
			return Deployment{}, fmt.Errorf("deployment %s: readers: %w", d.ID, err)
		}
	}
	d.Steps = map[Step]time.Time{}
	if len(steps) > 0 {
		var raw map[Step]int64
		if err := json.Unmarshal(steps, &raw); err != nil {
			return Deployment{}, fmt.Errorf("deployment %s: steps: %w", d.ID, err)
		}
		for k, v := range raw {
			d.Steps[k] = time.UnixMicro(v).UTC()
		}
	}
	d.CreatedAt, d.UpdatedAt = time.UnixMicro(created).UTC(), time.UnixMicro(updated).UTC()
	if claimed != 0 {
		d.ClaimedUntil = time.UnixMicro(claimed).UTC()
	}
	return d, nil
}

func (d Deployment) args() ([]any, error) {
	findings, err := json.Marshal(d.Findings)
	if err != nil {
		return nil, err
	}
	raw := map[Step]int64{}
	for k, v := range d.Steps {
		raw[k] = v.UnixMicro()
	}
	steps, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	approvers, err := json.Marshal(d.Approvers)
	if err != nil {
		return nil, err
	}
	readers, err := json.Marshal(d.Readers)
	if err != nil {
		return nil, err
	}
	return []any{d.ID, d.IdempotencyKey, d.RequestDigest, d.Requester, d.JobID, d.ApprovalID, d.Tenant, d.BundleDigest,
		d.TargetRepo, d.TargetBranch, string(d.State), string(d.Step), d.Message, findings, d.PolicyDigest, d.BaseCommit,
		d.ParentCommit, d.Commit, d.LeaseID, steps, approvers, d.FilesDigest, readers, d.Owner, claimOf(d.ClaimedUntil), d.CreatedAt.UnixMicro(), d.UpdatedAt.UnixMicro(), d.Version}, nil
}

// Create records d unless a deployment with its idempotency key or its
// approval exists. It returns the stored deployment and whether it is new.
// The same key with another request (RequestDigest) is AlreadyExists
// naming the field; another key for an approval that has a deployment
// returns that deployment: one approval is published once.
func (s *Store) Create(ctx context.Context, d Deployment) (Deployment, bool, error) {
	if d.ID == "" || d.IdempotencyKey == "" || d.ApprovalID == "" {
		return Deployment{}, false, fmt.Errorf("%w: deployment id, idempotency key and approval are required", errdefs.ErrInvalidArgument)
	}
	d.Version = 1
	var (
		out     Deployment
		created bool
	)
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if s.db.D.KeyLock != "" {
			// Two pipelines creating for one approval at once take turns.
			if _, err := tx.ExecContext(ctx, s.db.Q(s.db.D.KeyLock), "deployment:"+d.ApprovalID); err != nil {
				return err
			}
		}
		existing, err := scan(tx.QueryRowContext(ctx, s.db.Q(`SELECT `+columns+` FROM deployments WHERE idempotency_key = ? OR approval_id = ?
			ORDER BY CASE WHEN idempotency_key = ? THEN 0 ELSE 1 END LIMIT 1`), d.IdempotencyKey, d.ApprovalID, d.IdempotencyKey))
		switch {
		case err == nil:
			if existing.IdempotencyKey == d.IdempotencyKey && existing.RequestDigest != d.RequestDigest {
				return fmt.Errorf("%w: idempotency_key: %q was used for another request (deployment %s)", errdefs.ErrAlreadyExists, d.IdempotencyKey, existing.ID)
			}
			out = existing
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		args, err := d.args()
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.db.Q(`INSERT INTO deployments (`+columns+`) VALUES (`+placeholders(len(args))+`)`), args...); err != nil {
			return err
		}
		out, created = d, true
		return nil
	})
	if err != nil {
		return Deployment{}, false, fmt.Errorf("store: create deployment: %w", err)
	}
	return out, created, nil
}

func claimOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// ErrClaimed is a deployment another publisher process is running.
var ErrClaimed = errors.New("another publisher is running this deployment")

// Claim makes owner the one process that runs deployment id until until,
// unless another owner holds an unexpired claim (ErrClaimed) or it has
// ended. Renew by claiming again; Release gives it up.
func (s *Store) Claim(ctx context.Context, id, owner string, now, until time.Time) (Deployment, error) {
	return s.Update(ctx, id, func(d *Deployment) error {
		if d.Owner != "" && d.Owner != owner && now.Before(d.ClaimedUntil) {
			return fmt.Errorf("%w (%s, until %s)", ErrClaimed, d.Owner, d.ClaimedUntil.Format(time.RFC3339))
		}
		d.Owner, d.ClaimedUntil = owner, until
		return nil
	})
}

// Release ends owner's claim on deployment id.
func (s *Store) Release(ctx context.Context, id, owner string) error {
	_, err := s.Update(ctx, id, func(d *Deployment) error {
		if d.Owner != owner {
			return nil
		}
		d.Owner, d.ClaimedUntil = "", time.Time{}
		return nil
	})
	return err
}

// ByKey returns the deployment with idempotency key key.
func (s *Store) ByKey(ctx context.Context, key string) (Deployment, error) {
	d, err := scan(s.db.SQL.QueryRowContext(ctx, s.db.Q(`SELECT `+columns+` FROM deployments WHERE idempotency_key = ?`), key))
	if errors.Is(err, sql.ErrNoRows) {
		return Deployment{}, fmt.Errorf("%w: no deployment with idempotency key %q", errdefs.ErrNotFound, key)
	}
	return d, err
}

// ErrNotFound wraps errdefs.ErrNotFound for a missing deployment.
func notFound(id string) error { return fmt.Errorf("%w: deployment %q", errdefs.ErrNotFound, id) }

// Get returns deployment id.
func (s *Store) Get(ctx context.Context, id string) (Deployment, error) {
	d, err := scan(s.db.SQL.QueryRowContext(ctx, s.db.Q(`SELECT `+columns+` FROM deployments WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return Deployment{}, notFound(id)
	}
	return d, err
}

// Update reads deployment id, lets fn change it and writes it back in one
// transaction, with its version one higher; an error from fn writes
// nothing and is returned.
func (s *Store) Update(ctx context.Context, id string, fn func(*Deployment) error) (Deployment, error) {
	var out Deployment
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		d, err := scan(tx.QueryRowContext(ctx, s.db.Q(`SELECT `+columns+` FROM deployments WHERE id = ?`+s.db.D.ForUpdate), id))
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(id)
		}
		if err != nil {
			return err
		}
		if err := fn(&d); err != nil {
			return err
		}
		d.Version++
		args, err := d.args()
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.db.Q(`UPDATE deployments SET `+setColumns+` WHERE id = ? AND version = ?`), append(args, id, d.Version-1)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("deployment %s changed underneath the update", id)
		}
		out = d
		return nil
	})
	if err != nil {
		return Deployment{}, err
	}
	return out, nil
}

// Unfinished returns every deployment not in an end state, oldest first:
// what a starting publisher resumes.
func (s *Store) Unfinished(ctx context.Context) ([]Deployment, error) {
	rows, err := s.db.SQL.QueryContext(ctx, s.db.Q(`SELECT `+columns+` FROM deployments WHERE state = ? ORDER BY created_at, id`), string(InProgress))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Deployment
	for rows.Next() {
		d, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// List returns a page of deployments, newest first, filtered by job and
// repository when set, and the next page's token ("" on the last).
func (s *Store) List(ctx context.Context, jobID, repo string, limit int, token string) ([]Deployment, string, error) {
	where, args := []string{"1 = 1"}, []any{}
	if jobID != "" {
		where, args = append(where, "job_id = ?"), append(args, jobID)
	}
	if repo != "" {
		where, args = append(where, "target_repo = ?"), append(args, repo)
	}
	if token != "" {
		at, id, ok := strings.Cut(token, "/")
		n, err := strconv.ParseInt(at, 10, 64)
		if !ok || err != nil {
			return nil, "", fmt.Errorf("%w: page_token: not a token this server issued", errdefs.ErrInvalidArgument)
		}
		where, args = append(where, "(created_at < ? OR (created_at = ? AND id < ?))"), append(args, n, n, id)
	}
	args = append(args, limit+1)
	rows, err := s.db.SQL.QueryContext(ctx, s.db.Q(`SELECT `+columns+` FROM deployments WHERE `+strings.Join(where, " AND ")+
		` ORDER BY created_at DESC, id DESC LIMIT ?`), args...)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []Deployment
	for rows.Next() {
		d, err := scan(rows)
		if err != nil {
			return nil, "", err
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = fmt.Sprintf("%d/%s", last.CreatedAt.UnixMicro(), last.ID)
	}
	return out, next, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
