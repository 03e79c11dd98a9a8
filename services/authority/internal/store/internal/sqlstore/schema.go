package sqlstore

import (
	"strings"

	"github.com/airlockhq/airlock/pkg/audit"
)

// The authority's schema, written once for both databases. A migration
// names what differs in words of its own, which Migrations fills in for
// one database: {blob} a byte column, {key} a text column compared byte
// by byte (COLLATE "C" in PostgreSQL, whatever the database's locale, so
// pages and orders are the same as in SQLite's default), {seq} the audit
// log's sequence (SQLite's rowid). The few steps that cannot be said in
// SQL both speak (the audit log's guards; rebuilding a table SQLite cannot
// alter) are given per database.

// Database names one of the databases the schema is written for.
type Database int

const (
	SQLite Database = iota
	Postgres
)

// migration is one schema version: SQL both speak (with the words above),
// or SQL for each database.
type migration struct {
	both             string
	sqlite, postgres string
}

// Migrations are the schema's migrations for database db, in order: the
// index plus one is the schema version. Never edit one that has shipped:
// append a new one (store/sqlite and store/postgres pin the schema they
// make).
func Migrations(db Database) []string {
	words := map[Database]*strings.Replacer{
		SQLite:   strings.NewReplacer("{blob}", "BLOB", "{key}", "TEXT", "{seq}", "INTEGER"),
		Postgres: strings.NewReplacer("{blob}", "BYTEA", "{key}", `TEXT COLLATE "C"`, "{seq}", "BIGINT"),
	}[db]
	out := make([]string, len(migrations))
	for i, m := range migrations {
		stmt := m.both
		switch {
		case stmt != "":
		case db == SQLite:
			stmt = m.sqlite
		default:
			stmt = m.postgres
		}
		out[i] = words.Replace(stmt)
	}
	return out
}

var migrations = []migration{
	// 1: jobs.
	{both: `CREATE TABLE jobs (
		id               {key} NOT NULL PRIMARY KEY,
		tenant           {key} NOT NULL,
		requester        TEXT   NOT NULL,
		idempotency_key  {key} NOT NULL,
		repository       TEXT   NOT NULL,
		spec             {blob}  NOT NULL,
		spec_digest      TEXT   NOT NULL,
		commit_sha       TEXT   NOT NULL,
		tree_hash        TEXT   NOT NULL,
		state            TEXT   NOT NULL,
		message          TEXT   NOT NULL,
		network_state    TEXT   NOT NULL,
		signed_grant     {blob},
		grant_expires_at BIGINT NOT NULL,
		dispatched_at    BIGINT NOT NULL,
		result           {blob},
		bundle_digest    TEXT   NOT NULL,
		patch            {blob},
		output_tail      {blob},
		provenance       {blob},
		created_at       BIGINT NOT NULL,
		updated_at       BIGINT NOT NULL,
		version          BIGINT NOT NULL,
		UNIQUE (tenant, idempotency_key)
	);
	CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at, id);
	CREATE INDEX jobs_by_state ON jobs (state, created_at);`},

	// 2: the hash-chained audit log (see audit.go for how it is written),
	// append-only: in SQLite seq is the rowid, so entries are kept in
	// chain order.
	{sqlite: auditLog + `
	CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
		BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
	CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
		BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;`,
		postgres: auditLog + `
	CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		RAISE EXCEPTION 'audit_log is append-only';
	END
	$$;
	CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
		FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
	CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
		FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();`},

	// 3: approvals with their votes, and credential leases (the secret
	// itself is never stored). One approval per job.
	{both: `CREATE TABLE approvals (
		id            {key} NOT NULL PRIMARY KEY,
		job_id        {key} NOT NULL UNIQUE,
		tenant        {key} NOT NULL,
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
		approval_id {key} NOT NULL REFERENCES approvals (id),
		approver    {key} NOT NULL,
		decision    TEXT   NOT NULL,
		comment     TEXT   NOT NULL,
		decided_at  BIGINT NOT NULL,
		UNIQUE (approval_id, approver)
	);
	CREATE TABLE leases (
		id            {key} NOT NULL PRIMARY KEY,
		purpose       TEXT   NOT NULL,
		job_id        {key} NOT NULL,
		resource      TEXT   NOT NULL,
		holder        TEXT   NOT NULL,
		issued_at     BIGINT NOT NULL,
		expires_at    BIGINT NOT NULL,
		revoked_at    BIGINT NOT NULL,
		revoke_reason TEXT   NOT NULL
	);
	CREATE INDEX leases_by_job ON leases (job_id, issued_at);
	CREATE INDEX leases_by_time ON leases (issued_at, id);`},

	// 4: approvals get a kind: publish (one per job, as before) or change
	// (a widening of a running job; any number per job), and the change
	// itself. SQLite cannot drop the old UNIQUE (job_id), so there both
	// tables are rebuilt (votes first, so no foreign key ever dangles) and
	// the uniqueness becomes a partial index over publish requests.
	{sqlite: `CREATE TABLE approvals_v4 (
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
		postgres: `ALTER TABLE approvals ADD COLUMN kind TEXT NOT NULL DEFAULT 'publish';
	ALTER TABLE approvals ALTER COLUMN kind DROP DEFAULT;
	ALTER TABLE approvals ADD COLUMN job_change BYTEA;
	ALTER TABLE approvals DROP CONSTRAINT approvals_job_id_key;
	CREATE UNIQUE INDEX approvals_one_publish_per_job ON approvals (job_id) WHERE kind = 'publish';
	CREATE INDEX approvals_by_job ON approvals (job_id, created_at);`},

	// 5: a result's review detail (complete file list, patch size, output
	// tails). output_tail, which held labelled output tails, is no longer
	// written or read.
	{both: `ALTER TABLE jobs ADD COLUMN review {blob};`},

	// 6: at most one active lease per job and purpose (a lease asked for
	// again replaces the one before). Older duplicates are ended first,
	// the newest kept.
	{both: `UPDATE leases SET revoked_at = issued_at, revoke_reason = 'replaced (schema 6: one active lease per job)'
		WHERE revoked_at = 0 AND id NOT IN (
			SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY job_id, purpose ORDER BY issued_at DESC, id DESC) AS n
				FROM leases WHERE revoked_at = 0) AS ranked WHERE n = 1);
	CREATE UNIQUE INDEX leases_one_active ON leases (job_id, purpose) WHERE revoked_at = 0;`},

	// 7: the SPIFFE ID of the executor a job was dispatched to; only it
	// fetches the job's source and reports its result.
	{both: `ALTER TABLE jobs ADD COLUMN executor TEXT NOT NULL DEFAULT '';`},

	// 8: the authority's own record of each exec of a session: what was
	// asked and what the executor last said of it, so the authority can
	// answer when the executor cannot.
	{both: `CREATE TABLE execs (
		session_id       TEXT   NOT NULL,
		exec_id          TEXT   NOT NULL,
		seq              BIGINT NOT NULL,
		spec_digest      TEXT   NOT NULL,
		summary          {blob}     NOT NULL,
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
	CREATE INDEX execs_by_session ON execs (session_id, requested_at, exec_id);`},

	// 9: the executor fleet, and the replicas' claims on unfinished jobs.
	// The claim indexes cover only unfinished jobs (the predicate is the
	// one fleet.go's queries repeat word for word, so that SQLite too
	// uses them): finished jobs pile up, claims are only ever taken on
	// the few that are not.
	{both: `CREATE TABLE executors (
		name         {key} NOT NULL PRIMARY KEY,
		id           {key} NOT NULL UNIQUE,
		address      TEXT   NOT NULL,
		report       {blob} NOT NULL,
		state        TEXT   NOT NULL,
		draining     BIGINT NOT NULL,
		drained_by   TEXT   NOT NULL,
		drained_at   BIGINT NOT NULL,
		drain_reason TEXT   NOT NULL,
		joined_at    BIGINT NOT NULL,
		last_seen    BIGINT NOT NULL,
		version      BIGINT NOT NULL
	);
	ALTER TABLE jobs ADD COLUMN claimed_by TEXT NOT NULL DEFAULT '';
	ALTER TABLE jobs ADD COLUMN claim_expires_at BIGINT NOT NULL DEFAULT 0;
	CREATE INDEX jobs_by_claim ON jobs (claim_expires_at, created_at, id)
		WHERE state IN ('queued', 'staging', 'running');
	CREATE INDEX jobs_by_claimant ON jobs (claimed_by)
		WHERE state IN ('queued', 'staging', 'running');
	CREATE INDEX jobs_by_executor ON jobs (executor, state, created_at, id);`},

	// 10: brokered credentials: a job holds one active lease per purpose
	// and resource (a credential's name), and the active leases are found
	// by purpose and holder (to end those of an executor that restarted,
	// or of jobs that ended).
	{both: `DROP INDEX leases_one_active;
	CREATE UNIQUE INDEX leases_one_active ON leases (job_id, purpose, resource) WHERE revoked_at = 0;
	CREATE INDEX leases_active ON leases (purpose, holder) WHERE revoked_at = 0;`},

	// 11: when a job started running and when it ended, for metering. Jobs
	// from before that were dispatched take their first dispatch as their
	// start (never their creation: a wait in the queue or for an approval
	// is not compute; the first dispatch is still an upper bound of their
	// span, as a start refused for room keeps it) and their last change as
	// their end.
	{both: `ALTER TABLE jobs ADD COLUMN started_at BIGINT NOT NULL DEFAULT 0;
	ALTER TABLE jobs ADD COLUMN ended_at BIGINT NOT NULL DEFAULT 0;
	UPDATE jobs SET started_at = dispatched_at WHERE state IN ('staging', 'running', 'finished', 'failed', 'cancelled') AND dispatched_at <> 0;
	UPDATE jobs SET ended_at = updated_at WHERE state IN ('finished', 'failed', 'cancelled');
	CREATE INDEX jobs_by_usage ON jobs (tenant, ended_at, started_at);`},
	// 12: port forwards into running sessions, with what each carried.
	{both: `CREATE TABLE port_forwards (
		id           {key} NOT NULL PRIMARY KEY,
		session_id   {key} NOT NULL,
		tenant       {key} NOT NULL,
		requester    TEXT   NOT NULL,
		port         BIGINT NOT NULL,
		state        TEXT   NOT NULL,
		created_at   BIGINT NOT NULL,
		expires_at   BIGINT NOT NULL,
		closed_at    BIGINT NOT NULL,
		close_reason TEXT   NOT NULL,
		approval_id  TEXT   NOT NULL,
		connections  BIGINT NOT NULL,
		bytes_in     BIGINT NOT NULL,
		bytes_out    BIGINT NOT NULL,
		version      BIGINT NOT NULL
	);
	CREATE INDEX port_forwards_by_session ON port_forwards (session_id, created_at, id);
	CREATE INDEX port_forwards_by_tenant ON port_forwards (tenant, created_at, id);
	CREATE INDEX port_forwards_live ON port_forwards (expires_at) WHERE state IN ('pending', 'open');`},
}

// auditLog is migration 2's tables, before each database's guards.
const auditLog = `CREATE TABLE audit_log (
		seq         {seq} NOT NULL PRIMARY KEY,
		occurred_at BIGINT NOT NULL,
		kind        {key} NOT NULL,
		caller      {key} NOT NULL,
		subject     TEXT   NOT NULL,
		tenant      {key} NOT NULL,
		job_id      {key} NOT NULL,
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
	INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '` + audit.GenesisHash + `');`
