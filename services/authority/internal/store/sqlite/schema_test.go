package sqlite

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/services/authority/internal/store/storetest"
)

var space = regexp.MustCompile(`\s+`)

// dump is the database's schema: every table, index and trigger with the
// statement that made it (whitespace folded), and the versions applied.
func dump(t *testing.T, db *sql.DB) (schema, versions string) {
	t.Helper()
	rows, err := db.Query("SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_master ORDER BY rowid")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var typ, name, table, stmt string
		if err := rows.Scan(&typ, &name, &table, &stmt); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s on %s: %s\n", typ, name, table, strings.TrimSpace(space.ReplaceAllString(stmt, " ")))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String(), storetest.Versions(t, db)
}

// TestSchemaIsTheShippedOne: a new database gets exactly the schema the
// shipped builds made, at the same version, and a database those builds
// made at the current version opens with nothing applied or changed.
func TestSchemaIsTheShippedOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := dump(t, db)
	db.Close()
	want := storetest.ShippedSchema(t, got)
	if len(migrations) != 12 {
		t.Fatalf("%d migrations; the shipped schema is version 12", len(migrations))
	}

	// A database as the shipped build left it: its statements, and its
	// versions applied at their own times.
	old := filepath.Join(t.TempDir(), "old.db")
	db, err = sql.Open("sqlite", old)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(want), "\n") {
		_, stmt, _ := strings.Cut(line, ": ")
		if stmt == "" {
			continue // an index SQLite made itself
		}
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	for v := 1; v <= 12; v++ {
		if _, err := db.Exec("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", v, 1000+v); err != nil {
			t.Fatal(err)
		}
	}
	before, beforeVersions := dump(t, db)
	db.Close()
	s, err = Open(t.Context(), old)
	if err != nil {
		t.Fatalf("open the shipped build's database: %v", err)
	}
	if v, err := s.SchemaVersion(t.Context()); err != nil || v != 12 {
		t.Fatalf("schema version %d, %v; want 12", v, err)
	}
	s.Close()
	db, err = sql.Open("sqlite", old)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if after, afterVersions := dump(t, db); after != before || afterVersions != beforeVersions {
		t.Fatalf("opening changed the database:\n%s%s\nbecame\n%s%s", before, beforeVersions, after, afterVersions)
	}
}
