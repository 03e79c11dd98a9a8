package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/storetest"
)

// TestUpgradeFromJobsOnly opens a database made by a build that knew only
// the first migration (jobs, no audit log): the audit log is added and the
// jobs are kept.
func TestUpgradeFromJobsOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	db, err := sql.Open("sqlite", path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqldb.New(context.Background(), db, sqldb.Dialect{Migrations: migrations[:1]}, "authority")
	if err != nil {
		t.Fatal(err)
	}
	want := oldJob(t, db, "j1")
	old.Close()

	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("open the old database: %v", err)
	}
	defer s.Close()
	if v, err := s.SchemaVersion(t.Context()); err != nil || v != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", v, err, len(migrations))
	}
	if got, err := s.GetJob(t.Context(), "j1"); err != nil || got.Version != want.Version || got.SpecDigest != want.SpecDigest {
		t.Fatalf("job after the upgrade: %+v, %v", got, err)
	}
	if e, err := s.AppendAudit(t.Context(), audit.Event{Kind: "k"}); err != nil || e.Sequence != 1 || e.PrevHash != audit.GenesisHash {
		t.Fatalf("first audit entry after the upgrade: %+v, %v", e, err)
	}
}

// TestUpgradeKeepsApprovals opens a database made by a build that knew
// three migrations (approvals one per job, no kinds): its approvals and
// votes survive the rebuild of both tables as publish requests, a second
// publish request for the job is still refused, and change requests can be
// added.
func TestUpgradeKeepsApprovals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	db, err := sql.Open("sqlite", path+"?_txlock=immediate&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqldb.New(context.Background(), db, sqldb.Dialect{Migrations: migrations[:3]}, "authority")
	if err != nil {
		t.Fatal(err)
	}
	oldJob(t, db, "j1")
	// The version 3 schema, written as that build wrote it.
	if _, err := db.Exec(`INSERT INTO approvals (id, job_id, tenant, requester, bundle_digest, target_repo, target_branch, state, required,
		created_at, expires_at, consumed_at, consumed_by, version) VALUES ('a1', 'j1', 'dev', 'spiffe://airlock.test/client/dev',
		'sha256:b', 'demo', 'main', 'approved', 1, 1, 9999999999999999, 0, '', 2);
		INSERT INTO approval_votes (approval_id, approver, decision, comment, decided_at)
		VALUES ('a1', 'spiffe://airlock.test/approver/alice', 'approve', 'ok', 2)`); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("open the old database: %v", err)
	}
	defer s.Close()
	a, err := s.ApprovalForJob(t.Context(), "j1")
	if err != nil || a.ID != "a1" || a.Kind != store.KindPublish || a.State != store.ApprovalApproved || len(a.Votes) != 1 || a.Votes[0].Comment != "ok" {
		t.Fatalf("approval after the upgrade: %+v, %v", a, err)
	}
	if _, created, err := s.CreateApprovalAudited(t.Context(), storetest.NewApproval("dev", "a2", "j1", 1), audit.Event{Kind: "approval.opened"}); err != nil || created {
		t.Fatalf("second publish request after the upgrade: created %v, %v", created, err)
	}
	if _, created, err := s.CreateApprovalAudited(t.Context(), storetest.NewChange("dev", "c1", "j1", 1), audit.Event{Kind: "approval.opened"}); err != nil || !created {
		t.Fatalf("change request after the upgrade: created %v, %v", created, err)
	}
	// The votes' foreign key points at the rebuilt table.
	if _, err := s.DecideApprovalAudited(t.Context(), "nope", func(*store.Approval) (store.Vote, audit.Event, error) {
		return store.Vote{}, audit.Event{}, nil
	}); err == nil {
		t.Fatal("deciding an unknown approval succeeded")
	}
	check, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	var fkErrors int
	rows, err := check.QueryContext(t.Context(), "PRAGMA foreign_key_check")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		fkErrors++
	}
	rows.Close()
	var votesRef string
	if err := check.QueryRow(`SELECT sql FROM sqlite_master WHERE name = 'approval_votes'`).Scan(&votesRef); err != nil || !strings.Contains(votesRef, `REFERENCES "approvals"`) && !strings.Contains(votesRef, "REFERENCES approvals ") {
		t.Fatalf("approval_votes after the upgrade: %s, %v", votesRef, err)
	}
	if fkErrors != 0 {
		t.Fatalf("%d foreign key violations after the upgrade", fkErrors)
	}
}

// TestUpgradeAddsClaims opens a database made by a build that knew eight
// migrations (no fleet): its unfinished job is claimed by no one, so the
// first replica to claim takes it up, and the fleet is empty.
func TestUpgradeAddsClaims(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	db, err := sql.Open("sqlite", path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqldb.New(context.Background(), db, sqldb.Dialect{Migrations: migrations[:8]}, "authority")
	if err != nil {
		t.Fatal(err)
	}
	oldJob(t, db, "j1")
	old.Close()

	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("open the old database: %v", err)
	}
	defer s.Close()
	storetest.CheckFleetUpgrade(t, s, "j1")
}

// oldJob writes a job as the first schema's builds wrote it (this build's
// CreateJob writes columns that schema lacks), and returns it.
func oldJob(t *testing.T, db *sql.DB, id string) store.Job {
	t.Helper()
	j := storetest.NewJob("dev", id, 0)
	j.Version = 1
	_, err := db.Exec(`INSERT INTO jobs (id, tenant, requester, idempotency_key, repository, spec, spec_digest, commit_sha, tree_hash,
		state, message, network_state, signed_grant, grant_expires_at, dispatched_at, result, bundle_digest, patch, output_tail,
		provenance, created_at, updated_at, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 0, 0, NULL, '', NULL, ?, NULL, 1, 1, 1)`,
		j.ID, j.Tenant, j.Requester, j.IdempotencyKey, j.Repository, j.Spec, j.SpecDigest, j.Commit, j.TreeHash,
		string(j.State), j.Message, j.NetworkState, []byte("--- stdout (last 3 bytes) ---\nok\n"))
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestUpgradeStampsStartAndEnd opens a database of schema 10 and checks
// migration 11's backfill of starts and ends (storetest.UsageUpgradeJobs).
func TestUpgradeStampsStartAndEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	db, err := sql.Open("sqlite", path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqldb.New(context.Background(), db, sqldb.Dialect{Migrations: migrations[:10]}, "authority")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range storetest.UsageUpgradeJobs {
		oldJob(t, db, c.ID)
		if _, err := db.Exec(`UPDATE jobs SET state = ?, dispatched_at = ?, created_at = ?, updated_at = ? WHERE id = ?`,
			c.State, c.Dispatched, c.Created, c.Updated, c.ID); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("open the old database: %v", err)
	}
	defer s.Close()
	storetest.CheckUsageUpgrade(t, s)
}
