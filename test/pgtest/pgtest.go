// Package pgtest gives each test an empty PostgreSQL schema of its own in
// the database that AIRLOCK_TEST_POSTGRES_DSN names, dropped when the test
// ends, so that test runs in parallel never meet. Without that variable a
// test is skipped, except in CI (CI=true), where it fails: CI must not pass
// by not testing PostgreSQL. Only tests import it.
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	// The pgx driver for database/sql, registered as "pgx".
	_ "github.com/jackc/pgx/v5/stdlib"
)

// EnvDSN names the variable holding the DSN of a database whose role may
// create schemas in it.
const EnvDSN = "AIRLOCK_TEST_POSTGRES_DSN"

// missing says what to do when EnvDSN is unset: fail in CI, else skip.
func missing(getenv func(string) string) (fail bool, msg string) {
	if ci, _ := strconv.ParseBool(getenv("CI")); ci {
		return true, EnvDSN + " is not set, and CI must run the PostgreSQL store tests: .ci/run starts a cluster and sets it"
	}
	return false, "PostgreSQL store tests skipped: set " + EnvDSN +
		"=postgres://USER:PASSWORD@127.0.0.1:5432/DATABASE (a role that may create schemas there), " +
		"or run `CI=true bash .ci/run`, which starts a throwaway cluster for them"
}

// BaseDSN returns the DSN from the environment, or ends the test.
func BaseDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		if fail, msg := missing(os.Getenv); fail {
			t.Fatal(msg)
		} else {
			t.Skip(msg)
		}
	}
	return dsn
}

// WithParam returns dsn, a URL or key=value DSN, with key set to value,
// which must be a plain word.
func WithParam(dsn, key, value string) string {
	if strings.Contains(dsn, "://") {
		if u, err := url.Parse(dsn); err == nil {
			q := u.Query()
			q.Set(key, value)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return dsn + " " + key + "=" + value
}

// Schema creates a uniquely named empty schema and returns a DSN whose
// search_path is that schema, so a store opened on it creates its tables
// there, and a database handle on it for SQL straight to the database. Both
// go away when t ends, after t's other cleanups (such as closing stores).
func Schema(t testing.TB) (dsn string, db *sql.DB) {
	t.Helper()
	base := BaseDSN(t)
	suffix := make([]byte, 8)
	rand.Read(suffix)
	name := "airlock_test_" + hex.EncodeToString(suffix)

	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatalf("%s: %v", EnvDSN, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
		admin.Close()
		t.Fatalf("create schema in the database %s names: %v", EnvDSN, err)
	}
	dsn = WithParam(base, "search_path", name)
	db, err = sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
		admin.Close()
	})
	return dsn, db
}
