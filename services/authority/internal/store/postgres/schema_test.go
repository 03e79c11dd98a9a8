package postgres_test

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/services/authority/internal/store/storetest"

	"github.com/airlockhq/airlock/services/authority/internal/store/postgres"
	"github.com/airlockhq/airlock/test/pgtest"
)

// dump describes the schema db's search_path names: columns (type,
// collation, nullability, default), constraints, indexes, triggers and
// functions, with the schema's own name left out; and the versions
// applied.
func dump(t *testing.T, db *sql.DB) (schema, versions string) {
	t.Helper()
	var name string
	if err := db.QueryRow("SELECT current_schema()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, q := range []string{
		`SELECT table_name || '.' || column_name || ' #' || ordinal_position || ' ' || data_type || ' ' || COALESCE(collation_name, '-') || ' ' ||
			is_nullable || ' ' || COALESCE(column_default, '-')
			FROM information_schema.columns WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position`,
		`SELECT conrelid::regclass::text || ' ' || conname || ': ' || pg_get_constraintdef(oid)
			FROM pg_constraint WHERE connamespace = current_schema()::regnamespace ORDER BY conrelid::regclass::text, conname`,
		`SELECT indexname || ': ' || indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY indexname`,
		`SELECT tgname || ': ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
			WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal ORDER BY tgname`,
		`SELECT proname || ': ' || prosrc FROM pg_proc WHERE pronamespace = current_schema()::regnamespace ORDER BY proname`,
	} {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			b.WriteString(strings.ReplaceAll(line, name+".", "S.") + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return b.String(), storetest.Versions(t, db)
}

// TestSchemaIsTheShippedOne: a new database gets exactly the schema the
// shipped builds made, at the same version 12, and opening a database at
// that version again applies and changes nothing.
func TestSchemaIsTheShippedOne(t *testing.T) {
	dsn, db := pgtest.Schema(t)
	s, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	got, versions := dump(t, db)
	storetest.ShippedSchema(t, got)
	if n := strings.Count(versions, "@"); n != 12 {
		t.Fatalf("versions %s; the shipped schema is version 12", versions)
	}
	s, err = postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("open again: %v", err)
	}
	s.Close()
	if after, afterVersions := dump(t, db); after != got || afterVersions != versions {
		t.Fatalf("opening again changed the database:\n%s%s\nbecame\n%s%s", got, versions, after, afterVersions)
	}
}
