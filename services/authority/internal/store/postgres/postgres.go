// Package postgres is the authority's store in PostgreSQL (11 or later), for
// authorities that run as several replicas against one database. The
// queries and the schema are store/internal/sqlstore's, shared with
// SQLite; pkg/sqldb holds the connection (pgx through
// database/sql) and what makes replicas safe: row locks (SELECT … FOR
// UPDATE) on every read-modify-write, and migrations applied under an
// advisory lock. Only the
// authority's composition root, its config (to check a DSN) and tests
// import it; everything else sees store.Store.
package postgres

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/internal/sqlstore"
)

// migrations are the authority's schema (sqlstore.Migrations) as PostgreSQL
// speaks it.
var migrations = sqlstore.Migrations(sqlstore.Postgres)

// DropAuditGuards removes the triggers that keep audit_log append-only; the
// conformance suite runs it before it tampers with the log as someone with
// write access to the database could.
const DropAuditGuards = `DROP TRIGGER audit_log_no_change ON audit_log; DROP TRIGGER audit_log_no_truncate ON audit_log;`

// migrationKey is the advisory lock key held while migrating: the first
// eight bytes of sha256("airlock.authority.store.migrate"). Advisory locks
// are per database, so replicas on one database take turns.
const migrationKey = 1740325469202071831

// DefaultMaxConns bounds one store's connections unless WithMaxConns says
// otherwise.
const DefaultMaxConns = sqldb.DefaultMaxConns

// Option changes how Open connects.
type Option func(*options)

type options struct{ maxConns int }

// WithMaxConns bounds the store's open connections to n (at least 1).
func WithMaxConns(n int) Option { return func(o *options) { o.maxConns = max(n, 1) } }

// Store is the PostgreSQL implementation of store.Store.
type Store struct {
	*sqlstore.DB
}

var _ store.Store = (*Store)(nil)

// CheckDSN reports whether dsn is a connection string pgx accepts; the
// error never contains the DSN, which may hold a password.
func CheckDSN(dsn string) error { return sqldb.CheckDSN(dsn) }

// Describe names the database dsn points at, host:port/database.
func Describe(dsn string) string { return sqldb.Describe(dsn) }

// Open connects to the database dsn names and brings its schema up to
// date, in the schema its search_path names first (normally public). A
// schema newer than this build knows is refused rather than guessed at.
// Errors name the database by Describe, never by the DSN.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	o := options{maxConns: DefaultMaxConns}
	for _, opt := range opts {
		opt(&o)
	}
	db, err := sqldb.OpenPostgres(ctx, dsn, o.maxConns, sqldb.Postgres(migrations, migrationKey), "authority")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{DB: sqlstore.Wrap(db)}, nil
}
