package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
	"github.com/airlockhq/airlock/services/authority/internal/store/storetest"
)

// backend gives the conformance suite a real database file in a fresh
// directory for each test; every store it opens is closed when the test
// ends.
var backend = storetest.Backend{
	New: func(t *testing.T) (storetest.Opener, storetest.Exec) {
		path := filepath.Join(t.TempDir(), "authority.db")
		open := func(t *testing.T) store.Store {
			t.Helper()
			s, err := sqlite.Open(context.Background(), path)
			if err != nil {
				t.Fatalf("open %s: %v", path, err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		exec := func(query string) error {
			db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
			if err != nil {
				return err
			}
			defer db.Close()
			_, err = db.Exec(query)
			return err
		}
		return open, exec
	},
	DropAuditGuards: sqlite.DropAuditGuards,
}

func TestConformance(t *testing.T) {
	storetest.Run(t, backend)
}

// TestAuditSurvivesKill SIGKILLs a process appending to the audit log 100
// times; see storetest.Crash.
func TestAuditSurvivesKill(t *testing.T) {
	open := func(ctx context.Context, path string) (store.Store, error) { return sqlite.Open(ctx, path) }
	storetest.CrashChild(open)
	storetest.Crash(t, storetest.CrashTest{
		Name:       "TestAuditSurvivesKill",
		Target:     filepath.Join(t.TempDir(), "authority.db"),
		Open:       open,
		Iterations: 100,
		MaxDelay:   30 * time.Millisecond,
	})
}

func TestFileSettings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "authority.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.SchemaVersion(t.Context()); err != nil || v != 11 {
		t.Fatalf("schema version = %d, %v; want 11", v, err)
	}
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Errorf("no WAL file beside the database: %v", err)
	}

	// A second handle on the same file sees the same settings applied per
	// connection, and the migration is not applied twice.
	again, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("reopen while open: %v", err)
	}
	again.Close()

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM schema_migrations").Scan(&n); err != nil || n != 11 {
		t.Errorf("schema_migrations rows = %d, %v; want 11", n, err)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := sqlite.Open(t.Context(), path); err == nil || !strings.Contains(err.Error(), "schema version 99 is newer") {
		t.Fatalf("opened a database from the future: %v", err)
	}
}

// TestApprovalsSurviveKill SIGKILLs a process deciding, consuming and
// leasing 100 times; see storetest.ApprovalCrash.
func TestApprovalsSurviveKill(t *testing.T) {
	open := func(ctx context.Context, path string) (store.Store, error) { return sqlite.Open(ctx, path) }
	storetest.ApprovalCrashChild(open)
	storetest.ApprovalCrash(t, storetest.CrashTest{
		Name:       "TestApprovalsSurviveKill",
		Target:     filepath.Join(t.TempDir(), "authority.db"),
		Open:       open,
		Iterations: 100,
		MaxDelay:   30 * time.Millisecond,
	})
}
