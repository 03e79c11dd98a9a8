package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite"
)

// OpenSQLite opens (creating if needed) the database file at path and
// brings its schema up to date with d (whose Migrations are SQLite's).
//
// _txlock=immediate takes the write lock when a transaction begins, so
// read-modify-write transactions queue on busy_timeout instead of one
// failing when it upgrades its read lock; it is also what serializes them,
// in place of PostgreSQL's row locks. synchronous=NORMAL in WAL mode can
// lose the last commits to a power cut, never to a crash of the process.
func OpenSQLite(ctx context.Context, path string, d Dialect, program string) (*DB, error) {
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("%w %q must not contain '?' or '#'", ErrPath, path)
	}
	dsn := path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := openSQLite(dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8) // each keeps its prepared statements
	s, err := New(ctx, db, d, program)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// openSQLite is the database at dsn through the registered SQLite driver,
// each connection keeping its prepared statements (stmtConnector).
func openSQLite(dsn string) (*sql.DB, error) {
	c, err := sqliteConnector(dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

func sqliteConnector(dsn string) (*stmtConnector, error) {
	// Opens no connection: only reaches the driver.
	reg, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	drv := reg.Driver()
	reg.Close()
	return &stmtConnector{drv: drv, dsn: dsn}, nil
}
