// Package postgres is the authority's store in PostgreSQL (11 or later), for
// authorities that run as several replicas against one database. The
// queries are store/internal/sqlstore's, shared with SQLite; this package
// holds the PostgreSQL schema, and pkg/sqldb the connection (pgx through
// database/sql) and what makes replicas safe: row locks (SELECT … FOR
// UPDATE) on every read-modify-write, and migrations applied under an
// advisory lock. Only the
// authority's composition root, its config (to check a DSN) and tests
// import it; everything else sees store.Store.
package postgres

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/internal/sqlstore"
)

// migrations are applied in order, each once; the index plus one is the
// schema version, the same versions as the SQLite store's. Never edit one
// that has shipped: append a new one. Keys are compared byte-wise (COLLATE
// "C") whatever the database's locale, so pages and orders are the same as
// in SQLite.
var migrations = []string{
	`CREATE TABLE jobs (
		id               TEXT COLLATE "C" NOT NULL PRIMARY KEY,
		tenant           TEXT COLLATE "C" NOT NULL,
		requester        TEXT   NOT NULL,
		idempotency_key  TEXT COLLATE "C" NOT NULL,
		repository       TEXT   NOT NULL,
		spec             BYTEA  NOT NULL,
		spec_digest      TEXT   NOT NULL,
		commit_sha       TEXT   NOT NULL,
		tree_hash        TEXT   NOT NULL,
		state            TEXT   NOT NULL,
		message          TEXT   NOT NULL,
		network_state    TEXT   NOT NULL,
		signed_grant     BYTEA,
		grant_expires_at BIGINT NOT NULL,
		dispatched_at    BIGINT NOT NULL,
		result           BYTEA,
		bundle_digest    TEXT   NOT NULL,
		patch            BYTEA,
		output_tail      BYTEA,
		provenance       BYTEA,
		created_at       BIGINT NOT NULL,
		updated_at       BIGINT NOT NULL,
		version          BIGINT NOT NULL,
		UNIQUE (tenant, idempotency_key)
	);
	CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at, id);
	CREATE INDEX jobs_by_state ON jobs (state, created_at);`,

	// 2: the hash-chained audit log (see sqlstore for how it is written).
	`CREATE TABLE audit_log (
		seq         BIGINT NOT NULL PRIMARY KEY,
		occurred_at BIGINT NOT NULL,
		kind        TEXT COLLATE "C" NOT NULL,
		caller      TEXT COLLATE "C" NOT NULL,
		subject     TEXT   NOT NULL,
		tenant      TEXT COLLATE "C" NOT NULL,
		job_id      TEXT COLLATE "C" NOT NULL,
		outcome     TEXT   NOT NULL,
		reason      TEXT   NOT NULL,
		prev_hash   TEXT   NOT NULL,
		hash        TEXT   NOT NULL
	);
	CREATE INDEX audit_by_job ON audit_log (job_id, seq);
	CREATE INDEX audit_by_tenant ON audit_log (tenant, seq);
	CREATE INDEX audit_by_time ON audit_log (occurred_at);
	CREATE TABLE audit_head (
		id   INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
		seq  BIGINT  NOT NULL,
		hash TEXT    NOT NULL
	);
	INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '` + audit.GenesisHash + `');
	CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		RAISE EXCEPTION 'audit_log is append-only';
	END
	$$;
	CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
		FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
	CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
		FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();`,

	// 3: approvals with their votes, and credential leases (the secret
	// itself is never stored). One approval per job.
	`CREATE TABLE approvals (
		id            TEXT COLLATE "C" NOT NULL PRIMARY KEY,
		job_id        TEXT COLLATE "C" NOT NULL UNIQUE,
		tenant        TEXT COLLATE "C" NOT NULL,
		requester     TEXT   NOT NULL,
		bundle_digest TEXT   NOT NULL,
		target_repo   TEXT   NOT NULL,
		target_branch TEXT   NOT NULL,
		state         TEXT   NOT NULL,
		required      INTEGER NOT NULL,
		created_at    BIGINT NOT NULL,
		expires_at    BIGINT NOT NULL,
		consumed_at   BIGINT NOT NULL,
		consumed_by   TEXT   NOT NULL,
		version       BIGINT NOT NULL
	);
	CREATE INDEX approvals_by_tenant ON approvals (tenant, created_at, id);
	CREATE INDEX approvals_by_time ON approvals (created_at, id);
	CREATE TABLE approval_votes (
		approval_id TEXT COLLATE "C" NOT NULL REFERENCES approvals (id),
		approver    TEXT COLLATE "C" NOT NULL,
		decision    TEXT   NOT NULL,
		comment     TEXT   NOT NULL,
		decided_at  BIGINT NOT NULL,
		UNIQUE (approval_id, approver)
	);
	CREATE TABLE leases (
		id            TEXT COLLATE "C" NOT NULL PRIMARY KEY,
		purpose       TEXT   NOT NULL,
		job_id        TEXT COLLATE "C" NOT NULL,
		resource      TEXT   NOT NULL,
		holder        TEXT   NOT NULL,
		issued_at     BIGINT NOT NULL,
		expires_at    BIGINT NOT NULL,
		revoked_at    BIGINT NOT NULL,
		revoke_reason TEXT   NOT NULL
	);
	CREATE INDEX leases_by_job ON leases (job_id, issued_at);
	CREATE INDEX leases_by_time ON leases (issued_at, id);`,

	// 4: approvals get a kind: publish (one per job, as before) or change
	// (a widening of a running job; any number per job), and the change.
	`ALTER TABLE approvals ADD COLUMN kind TEXT NOT NULL DEFAULT 'publish';
	ALTER TABLE approvals ALTER COLUMN kind DROP DEFAULT;
	ALTER TABLE approvals ADD COLUMN job_change BYTEA;
	ALTER TABLE approvals DROP CONSTRAINT approvals_job_id_key;
	CREATE UNIQUE INDEX approvals_one_publish_per_job ON approvals (job_id) WHERE kind = 'publish';
	CREATE INDEX approvals_by_job ON approvals (job_id, created_at);`,

	// 5: a result's review detail (complete file list, patch size, output
	// tails). output_tail, which held labelled output tails, is no longer
	// written or read.
	`ALTER TABLE jobs ADD COLUMN review BYTEA;`,

	// 6: at most one active lease per job and purpose (a lease asked for
	// again replaces the one before). Older duplicates are ended first,
	// the newest kept.
	`UPDATE leases SET revoked_at = issued_at, revoke_reason = 'replaced (schema 6: one active lease per job)'
		WHERE revoked_at = 0 AND id NOT IN (
			SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY job_id, purpose ORDER BY issued_at DESC, id DESC) AS n
				FROM leases WHERE revoked_at = 0) AS ranked WHERE n = 1);
	CREATE UNIQUE INDEX leases_one_active ON leases (job_id, purpose) WHERE revoked_at = 0;`,

	// 7: the SPIFFE ID of the executor a job was dispatched to; only it
	// fetches the job's source and reports its result.
	`ALTER TABLE jobs ADD COLUMN executor TEXT NOT NULL DEFAULT '';`,

	// 8: the authority's own record of each exec of a session: what was
	// asked and what the executor last said of it, so the authority can
	// answer when the executor cannot.
	`CREATE TABLE execs (
		session_id       TEXT   NOT NULL,
		exec_id          TEXT   NOT NULL,
		seq              BIGINT NOT NULL,
		spec_digest      TEXT   NOT NULL,
		summary          BYTEA     NOT NULL,
		state            TEXT   NOT NULL,
		reason           TEXT   NOT NULL,
		exit_code        BIGINT NOT NULL,
		message          TEXT   NOT NULL,
		requested_by     TEXT   NOT NULL,
		requested_at     BIGINT NOT NULL,
		started_at       BIGINT NOT NULL,
		ended_at         BIGINT NOT NULL,
		stdout_size      BIGINT NOT NULL,
		stderr_size      BIGINT NOT NULL,
		stdout_truncated BIGINT NOT NULL,
		stderr_truncated BIGINT NOT NULL,
		stdout_sha256    TEXT   NOT NULL,
		stderr_sha256    TEXT   NOT NULL,
		updated_at       BIGINT NOT NULL,
		version          BIGINT NOT NULL,
		PRIMARY KEY (session_id, exec_id)
	);
	CREATE INDEX execs_by_session ON execs (session_id, requested_at, exec_id);`,
}

// DropAuditGuards removes the triggers that keep audit_log append-only; the
// conformance suite runs it before it tampers with the log as someone with
// write access to the database could.
const DropAuditGuards = `DROP TRIGGER audit_log_no_change ON audit_log; DROP TRIGGER audit_log_no_truncate ON audit_log;`

// migrationKey is the advisory lock key held while migrating: the first
// eight bytes of sha256("airlock.authority.store.migrate"). Advisory locks
// are per database, so replicas on one database take turns.
const migrationKey = 1740325469202071831

// DefaultMaxConns bounds one store's connections unless WithMaxConns says
// otherwise.
const DefaultMaxConns = sqldb.DefaultMaxConns

// Option changes how Open connects.
type Option func(*options)

type options struct{ maxConns int }

// WithMaxConns bounds the store's open connections to n (at least 1).
func WithMaxConns(n int) Option { return func(o *options) { o.maxConns = max(n, 1) } }

// Store is the PostgreSQL implementation of store.Store.
type Store struct {
	*sqlstore.DB
}

var _ store.Store = (*Store)(nil)

// CheckDSN reports whether dsn is a connection string pgx accepts; the
// error never contains the DSN, which may hold a password.
func CheckDSN(dsn string) error { return sqldb.CheckDSN(dsn) }

// Describe names the database dsn points at, host:port/database.
func Describe(dsn string) string { return sqldb.Describe(dsn) }

// Open connects to the database dsn names and brings its schema up to
// date, in the schema its search_path names first (normally public). A
// schema newer than this build knows is refused rather than guessed at.
// Errors name the database by Describe, never by the DSN.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	o := options{maxConns: DefaultMaxConns}
	for _, opt := range opts {
		opt(&o)
	}
	db, err := sqldb.OpenPostgres(ctx, dsn, o.maxConns, sqldb.Postgres(migrations, migrationKey), "authority")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{DB: sqlstore.Wrap(db)}, nil
}
