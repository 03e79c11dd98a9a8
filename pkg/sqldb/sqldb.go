// Package sqldb is the SQL plumbing Airlock's stores share: the two
// databases they run on (SQLite files by default, PostgreSQL for replicas)
// opened the one way each is safe, a Dialect for what differs between
// them, a migration runner, and transactions. A store writes its queries
// once, with ? placeholders, in the SQL both speak; the authority's store
// and the publisher's both stand on it.
package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Dialect is what differs between the databases a store runs on.
type Dialect struct {
	// Rebind rewrites the ? placeholders of a query into the database's
	// own; nil keeps them.
	Rebind func(query string) string
	// ForUpdate is appended to a SELECT of a row the transaction goes on to
	// write, so that a concurrent writer of that row waits. It is empty
	// where every write transaction already excludes all others (SQLite's
	// BEGIN IMMEDIATE).
	ForUpdate string
	// MigrationLock, if set, runs first in the migration transaction and
	// holds until it ends, so stores starting at once on one database apply
	// migrations one at a time.
	MigrationLock string
	// Migrations are applied in order, each once; the index plus one is the
	// schema version. Never edit one that has shipped: append a new one.
	Migrations []string
	// KeyLock, if set, is a statement taking a lock on one text key (its
	// one argument) held until the transaction ends, for writers of rows
	// that may not exist yet (PostgreSQL: an advisory lock; SQLite's write
	// transactions already exclude each other).
	KeyLock string
	// Conflict, if set, reports whether err is a unique-index violation by
	// a concurrent transaction, after which the transaction may be run
	// again (PostgreSQL; SQLite's write transactions never overlap).
	Conflict func(err error) bool
}

// RebindDollar rewrites ? placeholders as PostgreSQL's $1, $2, …. The
// queries hold no ? inside literals or identifiers.
func RebindDollar(query string) string {
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// DB is a database in some Dialect with its schema up to date.
type DB struct {
	// SQL is the database; D its dialect.
	SQL *sql.DB
	D   Dialect
}

// New brings db's schema up to date (d.Migrations) and returns it. A
// schema newer than d knows is refused rather than guessed at; program
// names what to run instead ("authority"). On error the caller still owns
// db.
func New(ctx context.Context, db *sql.DB, d Dialect, program string) (*DB, error) {
	s := &DB{SQL: db, D: d}
	if err := s.migrate(ctx, program); err != nil {
		return nil, err
	}
	return s, nil
}

// Q rewrites query's placeholders for the dialect.
func (s *DB) Q(query string) string {
	if s.D.Rebind == nil {
		return query
	}
	return s.D.Rebind(query)
}

// migrate applies the missing migrations in one transaction: a store that
// fails half-way leaves the schema as it found it.
func (s *DB) migrate(ctx context.Context, program string) error {
	return s.Tx(ctx, func(tx *sql.Tx) error {
		if s.D.MigrationLock != "" {
			if _, err := tx.ExecContext(ctx, s.D.MigrationLock); err != nil {
				return fmt.Errorf("migration lock: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER NOT NULL PRIMARY KEY,
			applied_at BIGINT  NOT NULL
		)`); err != nil {
			return fmt.Errorf("migrations table: %w", err)
		}
		var current int
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return fmt.Errorf("schema version: %w", err)
		}
		if current > len(s.D.Migrations) {
			return fmt.Errorf("schema version %d is newer than this build knows (%d); run a newer %s", current, len(s.D.Migrations), program)
		}
		for v := current + 1; v <= len(s.D.Migrations); v++ {
			if _, err := tx.ExecContext(ctx, s.D.Migrations[v-1]); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			if _, err := tx.ExecContext(ctx, s.Q(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`), v, time.Now().UnixMicro()); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
		}
		return nil
	})
}

// SchemaVersion returns the applied schema version, for tests and status.
func (s *DB) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.SQL.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}

// Close closes the database.
func (s *DB) Close() error { return s.SQL.Close() }

// Tx runs fn in a transaction, committed when fn returns nil and rolled
// back otherwise.
func (s *DB) Tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.SQL.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// ErrPath is a database path that cannot be opened as given.
var ErrPath = errors.New("database path")
