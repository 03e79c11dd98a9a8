package postgres

import (
	"context"
	"testing"

	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/services/authority/internal/store/storetest"
	"github.com/airlockhq/airlock/test/pgtest"
)

// TestUpgradeAddsClaims opens a database made by a build that knew eight
// migrations (no fleet): its unfinished job is claimed by no one, so the
// first replica to claim takes it up, and the fleet is empty.
func TestUpgradeAddsClaims(t *testing.T) {
	dsn, db := pgtest.Schema(t)
	old, err := sqldb.OpenPostgres(context.Background(), dsn, 2, sqldb.Postgres(migrations[:8], migrationKey), "authority")
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	// The job as that build wrote it: every column but the claims.
	j := storetest.NewJob("dev", "j1", 0)
	if _, err := db.Exec(`INSERT INTO jobs (id, tenant, requester, idempotency_key, repository, spec, spec_digest, commit_sha, tree_hash,
		state, message, network_state, grant_expires_at, dispatched_at, bundle_digest, created_at, updated_at, version, executor)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, '', 'pending', 0, 0, '', 1, 1, 1, '')`,
		j.ID, j.Tenant, j.Requester, j.IdempotencyKey, j.Repository, j.Spec, j.SpecDigest, j.Commit, j.TreeHash, string(j.State)); err != nil {
		t.Fatal(err)
	}

	s, err := Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("open the old database: %v", err)
	}
	defer s.Close()
	if v, err := s.SchemaVersion(t.Context()); err != nil || v != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", v, err, len(migrations))
	}
	storetest.CheckFleetUpgrade(t, s, "j1")
}

// TestUpgradeStampsStartAndEnd opens a database of schema 10 and checks
// migration 11's backfill of starts and ends (storetest.UsageUpgradeJobs).
func TestUpgradeStampsStartAndEnd(t *testing.T) {
	dsn, db := pgtest.Schema(t)
	old, err := sqldb.OpenPostgres(context.Background(), dsn, 2, sqldb.Postgres(migrations[:10], migrationKey), "authority")
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	for i, c := range storetest.UsageUpgradeJobs {
		j := storetest.NewJob("dev", c.ID, i)
		if _, err := db.Exec(`INSERT INTO jobs (id, tenant, requester, idempotency_key, repository, spec, spec_digest, commit_sha, tree_hash,
			state, message, network_state, grant_expires_at, dispatched_at, bundle_digest, created_at, updated_at, version, executor)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, '', 'pending', 0, $11, '', $12, $13, 1, '')`,
			j.ID, j.Tenant, j.Requester, j.IdempotencyKey, j.Repository, j.Spec, j.SpecDigest, j.Commit, j.TreeHash,
			c.State, c.Dispatched, c.Created, c.Updated); err != nil {
			t.Fatal(err)
		}
	}

	s, err := Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("open the old database: %v", err)
	}
	defer s.Close()
	storetest.CheckUsageUpgrade(t, s)
}
