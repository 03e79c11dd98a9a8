package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// cachedDB is a real SQLite file with a table t(k PRIMARY KEY, v) of n
// rows, opened through the statement cache as OpenSQLite opens one (with
// fewer pragmas and connections), with its connector (prepared) and its
// DSN.
func cachedDB(t testing.TB, n int) (*sql.DB, *stmtConnector, string) {
	t.Helper()
	dsn := filepath.Join(t.TempDir(), "db.sqlite") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	c, err := sqliteConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(4)
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if _, err := db.Exec(`CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := db.Exec(`INSERT INTO t (k, v) VALUES (?, ?)`, i, fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	return db, c, dsn
}

// TestStatementCache: a query run again is not prepared again; a query
// run while its own rows are open in one transaction gets a statement of
// its own and both read right; a failed statement (a constraint) is
// usable at once after; and the connection closes cleanly (cachedDB).
func TestStatementCache(t *testing.T) {
	db, c, _ := cachedDB(t, 10)
	ctx := context.Background()
	before := c.prepared.Load()
	for i := range 200 {
		var v string
		if err := db.QueryRowContext(ctx, `SELECT v FROM t WHERE k = ?`, i%10).Scan(&v); err != nil || v != fmt.Sprintf("v%d", i%10) {
			t.Fatalf("query %d: %q, %v", i, v, err)
		}
	}
	// One after another, on one connection: prepared once.
	if n := c.prepared.Load() - before; n > 1 {
		t.Fatalf("200 runs of one query prepared it %d times, want once", n)
	}

	// Nested: the outer rows stay right while the same query runs inside.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	const q = `SELECT k, v FROM t WHERE k >= ? ORDER BY k`
	outer, err := tx.QueryContext(ctx, q, 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for outer.Next() {
		var k int
		var v string
		if err := outer.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		inner, err := tx.QueryContext(ctx, q, k)
		if err != nil {
			t.Fatal(err)
		}
		var seen []int
		for inner.Next() {
			var ik int
			var iv string
			if err := inner.Scan(&ik, &iv); err != nil {
				t.Fatal(err)
			}
			seen = append(seen, ik)
		}
		if err := inner.Close(); err != nil {
			t.Fatal(err)
		}
		if len(seen) != 10-k || seen[0] != k {
			t.Fatalf("inner query from %d: %v", k, seen)
		}
		got = append(got, v)
	}
	if err := outer.Err(); err != nil {
		t.Fatal(err)
	}
	outer.Close()
	if strings.Join(got, ",") != "v5,v6,v7,v8,v9" {
		t.Fatalf("outer rows beside an inner run of the same query: %v", got)
	}
	// A failing exec (duplicate key) leaves its statement usable.
	const ins = `INSERT INTO t (k, v) VALUES (?, ?)`
	if _, err := tx.ExecContext(ctx, ins, 3, "dup"); err == nil || !strings.Contains(err.Error(), "UNIQUE") {
		t.Fatalf("a duplicate key: %v, want a UNIQUE failure", err)
	}
	if _, err := tx.ExecContext(ctx, ins, 100, "new"); err != nil {
		t.Fatalf("the same statement after its failure: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRowContext(ctx, `SELECT v FROM t WHERE k = ?`, 100).Scan(&v); err != nil || v != "new" {
		t.Fatalf("the committed row: %q, %v", v, err)
	}
	// A statement the schema changed under is prepared again by SQLite:
	// the table made anew with its columns the other way round.
	const all = `SELECT * FROM t WHERE k = ?`
	var k int
	if err := db.QueryRowContext(ctx, all, 100).Scan(&k, &v); err != nil || k != 100 || v != "new" {
		t.Fatalf("before a schema change: %d %q, %v", k, v, err)
	}
	for _, q := range []string{`DROP TABLE t`, `CREATE TABLE t (v TEXT NOT NULL, k INTEGER PRIMARY KEY)`, `INSERT INTO t (v, k) VALUES ('again', 100)`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.QueryRowContext(ctx, all, 100).Scan(&v, &k); err != nil || k != 100 || v != "again" {
		t.Fatalf("after a schema change: %d %q, %v", k, v, err)
	}
}

// TestStatementCacheBounded: queries whose text a caller decides (an IN
// list's length) do not pile up: past stmtCacheMax a statement not in use
// goes, and every query still answers right.
func TestStatementCacheBounded(t *testing.T) {
	db, c, _ := cachedDB(t, 10)
	ctx := context.Background()
	for n := 1; n <= 3*stmtCacheMax; n++ {
		q := `SELECT count(*) FROM t WHERE k IN (` + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + `)`
		args := make([]any, n)
		for i := range args {
			args[i] = i
		}
		var got int
		if err := db.QueryRowContext(ctx, q, args...).Scan(&got); err != nil || got != min(n, 10) {
			t.Fatalf("IN list of %d: %d, %v", n, got, err)
		}
	}
	db.SetMaxOpenConns(1) // the one connection the queries above used
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stmtConn)
		if !ok {
			return fmt.Errorf("connection %T, want *stmtConn", dc)
		}
		sc.mu.Lock()
		defer sc.mu.Unlock()
		if len(sc.stmts) > stmtCacheMax {
			return fmt.Errorf("%d statements cached, want at most %d", len(sc.stmts), stmtCacheMax)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A query after the flood is still kept: prepared once for two runs.
	before := c.prepared.Load()
	for range 2 {
		var v string
		if err := conn.QueryRowContext(ctx, `SELECT v FROM t WHERE k = ?`, 3).Scan(&v); err != nil || v != "v3" {
			t.Fatalf("a query after the flood: %q, %v", v, err)
		}
	}
	if n := c.prepared.Load() - before; n != 1 {
		t.Fatalf("a query run twice after the flood was prepared %d times, want once", n)
	}
}

// BenchmarkLookup is a row looked up by key, as the authority looks up a
// job, through the statement cache and through the driver as sql.Open
// gives it (the query's text parsed at every call), on one file in one
// run. benchstat -col /stmts.
func BenchmarkLookup(b *testing.B) {
	cached, _, dsn := cachedDB(b, 1000)
	parsed, err := sql.Open("sqlite", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer parsed.Close()
	const q = `SELECT k, v FROM t WHERE k = ?`
	for _, c := range []struct {
		name string
		db   *sql.DB
	}{{"cached", cached}, {"parsed", parsed}} {
		b.Run("stmts="+c.name, func(b *testing.B) {
			ctx := context.Background()
			i := 0
			for b.Loop() {
				var k int
				var v string
				if err := c.db.QueryRowContext(ctx, q, i%1000).Scan(&k, &v); err != nil || k != i%1000 {
					b.Fatalf("row %d: %d %q %v", i%1000, k, v, err)
				}
				i++
			}
		})
	}
}
