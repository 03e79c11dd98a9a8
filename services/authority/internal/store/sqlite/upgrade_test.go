package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/services/authority/internal/store/internal/sqlstore"
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
	old, err := sqlstore.New(context.Background(), db, sqlstore.Dialect{Migrations: migrations[:1]})
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := old.CreateJob(t.Context(), storetest.NewJob("dev", "j1", 0))
	if err != nil {
		t.Fatal(err)
	}
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
