// Package sqlite is the authority's embedded store: one SQLite file in the
// data directory (pure Go, modernc.org/sqlite), in WAL mode with a busy
// timeout and foreign keys on, its schema versioned in a migrations table.
// The queries are store/internal/sqlstore's, shared with PostgreSQL; this
// package holds the SQLite schema; pkg/sqldb opens the file. Only the
// authority's composition root and tests import it; everything else sees
// store.Store.
package sqlite

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/internal/sqlstore"
)

// migrations are applied in order, each once; the index plus one is the
// schema version. Never edit one that has shipped: append a new one. The
// PostgreSQL store keeps the same versions with its own column types.
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

	// 2: the hash-chained audit log (see sqlstore for how it is written).
	// seq is the rowid, so entries are kept in chain order.
	`CREATE TABLE audit_log (
		seq         INTEGER NOT NULL PRIMARY KEY,
		occurred_at BIGINT  NOT NULL,
		kind        TEXT    NOT NULL,
		caller      TEXT    NOT NULL,
		subject     TEXT    NOT NULL,
		tenant      TEXT    NOT NULL,
		job_id      TEXT    NOT NULL,
		outcome     TEXT    NOT NULL,
		reason      TEXT    NOT NULL,
		prev_hash   TEXT    NOT NULL,
		hash        TEXT    NOT NULL
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
	CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
		BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
	CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
		BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;`,

	// 3: approvals with their votes, and credential leases (the secret
	// itself is never stored). One approval per job.
	`CREATE TABLE approvals (
		id            TEXT NOT NULL PRIMARY KEY,
		job_id        TEXT NOT NULL UNIQUE,
		tenant        TEXT NOT NULL,
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
		approval_id TEXT NOT NULL REFERENCES approvals (id),
		approver    TEXT NOT NULL,
		decision    TEXT   NOT NULL,
		comment     TEXT   NOT NULL,
		decided_at  BIGINT NOT NULL,
		UNIQUE (approval_id, approver)
	);
	CREATE TABLE leases (
		id            TEXT NOT NULL PRIMARY KEY,
		purpose       TEXT   NOT NULL,
		job_id        TEXT NOT NULL,
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
	// (a widening of a running job; any number per job), and the change
	// itself. SQLite cannot drop the old UNIQUE (job_id), so both tables
	// are rebuilt (votes first, so no foreign key ever dangles) and the
	// uniqueness becomes a partial index over publish requests.
	`CREATE TABLE approvals_v4 (
		id            TEXT NOT NULL PRIMARY KEY,
		job_id        TEXT NOT NULL,
		tenant        TEXT NOT NULL,
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
		version       BIGINT NOT NULL,
		kind          TEXT   NOT NULL,
		job_change    BLOB
	);
	INSERT INTO approvals_v4 SELECT id, job_id, tenant, requester, bundle_digest, target_repo, target_branch, state, required,
		created_at, expires_at, consumed_at, consumed_by, version, 'publish', NULL FROM approvals;
	CREATE TABLE approval_votes_v4 (
		approval_id TEXT NOT NULL REFERENCES approvals_v4 (id),
		approver    TEXT NOT NULL,
		decision    TEXT   NOT NULL,
		comment     TEXT   NOT NULL,
		decided_at  BIGINT NOT NULL,
		UNIQUE (approval_id, approver)
	);
	INSERT INTO approval_votes_v4 SELECT approval_id, approver, decision, comment, decided_at FROM approval_votes;
	DROP TABLE approval_votes;
	DROP TABLE approvals;
	ALTER TABLE approvals_v4 RENAME TO approvals;
	ALTER TABLE approval_votes_v4 RENAME TO approval_votes;
	CREATE UNIQUE INDEX approvals_one_publish_per_job ON approvals (job_id) WHERE kind = 'publish';
	CREATE INDEX approvals_by_job ON approvals (job_id, created_at);
	CREATE INDEX approvals_by_tenant ON approvals (tenant, created_at, id);
	CREATE INDEX approvals_by_time ON approvals (created_at, id);`,

	// 5: a result's review detail (complete file list, patch size, output
	// tails). output_tail, which held labelled output tails, is no longer
	// written or read.
	`ALTER TABLE jobs ADD COLUMN review BLOB;`,

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
		summary          BLOB     NOT NULL,
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
// write access to the file could.
const DropAuditGuards = `DROP TRIGGER audit_log_no_update; DROP TRIGGER audit_log_no_delete;`

// Store is the SQLite implementation of store.Store.
type Store struct {
	*sqlstore.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file at path and brings its
// schema up to date. A schema newer than this build knows is refused rather
// than guessed at.
func Open(ctx context.Context, path string) (*Store, error) {
	db, err := sqldb.OpenSQLite(ctx, path, sqldb.Dialect{Migrations: migrations}, "authority")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{DB: sqlstore.Wrap(db)}, nil
}
