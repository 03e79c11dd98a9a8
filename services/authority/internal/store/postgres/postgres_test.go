package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/postgres"
	"github.com/airlockhq/airlock/services/authority/internal/store/storetest"
	"github.com/airlockhq/airlock/test/pgtest"
)

// opener opens stores on dsn, each closed when the test that opened it ends.
func opener(dsn string) storetest.Opener {
	return func(t *testing.T) store.Store {
		t.Helper()
		s, err := postgres.Open(context.Background(), dsn)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

var backend = storetest.Backend{
	New: func(t *testing.T) (storetest.Opener, storetest.Exec) {
		dsn, db := pgtest.Schema(t)
		return opener(dsn), func(query string) error {
			_, err := db.Exec(query)
			return err
		}
	},
	DropAuditGuards: postgres.DropAuditGuards,
}

func TestConformance(t *testing.T) {
	pgtest.BaseDSN(t) // one skip (or failure) rather than one per subtest
	storetest.Run(t, backend)
}

// TestReplicasMigrateAtOnce starts several stores on one empty schema at
// the same moment: the advisory lock lets one migrate and the rest find
// the schema current.
func TestReplicasMigrateAtOnce(t *testing.T) {
	dsn, db := pgtest.Schema(t)
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s, err := postgres.Open(t.Context(), dsn)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("replicas starting together: %v", err)
	}
	var rows, max int
	if err := db.QueryRow("SELECT COUNT(*), MAX(version) FROM schema_migrations").Scan(&rows, &max); err != nil || rows != 11 || max != 11 {
		t.Fatalf("schema_migrations: %d rows up to version %d, %v; want 11 up to 11", rows, max, err)
	}
	s := opener(dsn)(t)
	if v, err := s.(*postgres.Store).SchemaVersion(t.Context()); err != nil || v != 11 {
		t.Fatalf("schema version = %d, %v; want 11", v, err)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	dsn, db := pgtest.Schema(t)
	s, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := db.Exec("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Open(t.Context(), dsn); err == nil || !strings.Contains(err.Error(), "schema version 99 is newer") {
		t.Fatalf("opened a database from the future: %v", err)
	}
}

func TestTruncateRefused(t *testing.T) {
	dsn, db := pgtest.Schema(t)
	s := opener(dsn)(t)
	if _, err := s.AppendAudit(t.Context(), audit.Event{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("TRUNCATE audit_log"); err == nil {
		t.Fatal("TRUNCATE audit_log was allowed")
	}
	if got := storetest.VerifyAudit(t, s); len(got) != 1 {
		t.Fatalf("%d entries after a refused TRUNCATE, want 1", len(got))
	}
}

// TestAuditSurvivesKill SIGKILLs a process appending to the audit log 100
// times; see storetest.Crash. The server outlives its client, so after each
// kill the test waits for the server to end the dead child's session (and
// roll back whatever it left open) before it counts.
func TestAuditSurvivesKill(t *testing.T) {
	open := func(ctx context.Context, dsn string) (store.Store, error) { return postgres.Open(ctx, dsn) }
	storetest.CrashChild(open)
	storetest.Crash(t, crashTest(t, "TestAuditSurvivesKill", open))
}

// TestApprovalsSurviveKill SIGKILLs a process deciding, consuming and
// leasing 100 times; see storetest.ApprovalCrash.
func TestApprovalsSurviveKill(t *testing.T) {
	open := func(ctx context.Context, dsn string) (store.Store, error) { return postgres.Open(ctx, dsn) }
	storetest.ApprovalCrashChild(open)
	storetest.ApprovalCrash(t, crashTest(t, "TestApprovalsSurviveKill", open))
}

// crashTest is a crash test on a fresh schema whose Settle waits, after
// each kill, for the server to end the dead child's session (and roll back
// whatever it left open) before the test counts.
func crashTest(t *testing.T, name string, open func(ctx context.Context, dsn string) (store.Store, error)) storetest.CrashTest {
	dsn, db := pgtest.Schema(t)
	suffix := make([]byte, 6)
	rand.Read(suffix)
	app := "airlock-crash-" + hex.EncodeToString(suffix)
	return storetest.CrashTest{
		Name:        name,
		Target:      dsn,
		ChildTarget: pgtest.WithParam(dsn, "application_name", app),
		Open:        open,
		Iterations:  100,
		MaxDelay:    30 * time.Millisecond,
		Settle: func(t *testing.T) {
			deadline := time.Now().Add(30 * time.Second)
			for {
				var n int
				if err := db.QueryRow("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the killed child's %d sessions are still open after 30s", n)
				}
				time.Sleep(5 * time.Millisecond)
			}
		},
	}
}

func TestDSNNeverInErrors(t *testing.T) {
	const secret = "s3cr3t-pw"
	for _, dsn := range []string{
		"postgres://airlock:" + secret + "@db.example:notaport/airlock",
		"postgres://airlock:" + secret + "@[::1/airlock",
		"postgres://airlock:" + secret + "@db.example/airlock?connect_timeout=soon",
		"postgres://airlock:" + secret + "@db.example/airlock?sslmode=maybe",
		"host=db.example password=" + secret + " port=notaport",
		"host=db.example password='" + secret + "' sslmode=sometimes",
		"host=db.example password=" + secret + " = broken",
	} {
		err := postgres.CheckDSN(dsn)
		if err == nil {
			t.Errorf("CheckDSN accepted a broken DSN")
			continue
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "not a valid PostgreSQL connection string") {
			t.Errorf("CheckDSN error = %q", err)
		}
		if _, err := postgres.Open(t.Context(), dsn); err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("Open error = %v", err)
		}
		if d := postgres.Describe(dsn); strings.Contains(d, secret) {
			t.Errorf("Describe = %q", d)
		}
	}
	// A DSN that parses but cannot connect (nothing listens on port 1).
	dsn := "postgres://airlock:" + secret + "@127.0.0.1:1/airlock?connect_timeout=5"
	if err := postgres.CheckDSN(dsn); err != nil {
		t.Fatal(err)
	}
	if d := postgres.Describe(dsn); d != "127.0.0.1:1/airlock" {
		t.Errorf("Describe = %q, want 127.0.0.1:1/airlock", d)
	}
	_, err := postgres.Open(t.Context(), dsn)
	if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "127.0.0.1:1/airlock") {
		t.Errorf("Open error = %v; want one naming 127.0.0.1:1/airlock without the password", err)
	}
	if err := postgres.CheckDSN(""); err == nil {
		t.Error("CheckDSN accepted an empty DSN")
	}
}
