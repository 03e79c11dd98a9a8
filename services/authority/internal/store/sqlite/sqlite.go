// Package sqlite is the authority's embedded store: one SQLite file in the
// data directory (pure Go, modernc.org/sqlite), in WAL mode with a busy
// timeout and foreign keys on, its schema versioned in a migrations table.
// The queries and the schema are store/internal/sqlstore's, shared with
// PostgreSQL; pkg/sqldb opens the file. Only the
// authority's composition root and tests import it; everything else sees
// store.Store.
package sqlite

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/internal/sqlstore"
)

// migrations are the authority's schema (sqlstore.Migrations) as SQLite
// speaks it.
var migrations = sqlstore.Migrations(sqlstore.SQLite)

// DropAuditGuards removes the triggers that keep audit_log append-only; the
// conformance suite runs it before it tampers with the log as someone with
// write access to the file could.
const DropAuditGuards = `DROP TRIGGER audit_log_no_update; DROP TRIGGER audit_log_no_delete;`

// Store is the SQLite implementation of store.Store.
type Store struct {
	*sqlstore.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file at path and brings its
// schema up to date. A schema newer than this build knows is refused rather
// than guessed at.
func Open(ctx context.Context, path string) (*Store, error) {
	db, err := sqldb.OpenSQLite(ctx, path, sqldb.Dialect{Migrations: migrations}, "authority")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{DB: sqlstore.Wrap(db)}, nil
}
