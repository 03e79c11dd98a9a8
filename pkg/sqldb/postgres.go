package sqldb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// DefaultMaxConns bounds one store's PostgreSQL connections unless asked
// otherwise: a replica rarely needs many, and a database's max_connections
// is shared by all of them.
const DefaultMaxConns = 10

// CheckDSN reports whether dsn is a connection string pgx accepts, a URL
// (postgres://user:password@host:port/database?sslmode=…) or key=value
// pairs. The error never contains the DSN, which may hold a password.
func CheckDSN(dsn string) error {
	_, err := parse(dsn)
	return err
}

func parse(dsn string) (*pgx.ConnConfig, error) {
	if dsn == "" {
		return nil, errors.New("empty connection string")
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, redact(err)
	}
	return cfg, nil
}

// redact keeps what is wrong with a DSN and drops the DSN itself: pgx's
// parse errors quote it (redacted only as far as pgx can tell what the
// password is), and a URL's parse error quotes it whole.
func redact(err error) error {
	const bad = "not a valid PostgreSQL connection string"
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return errors.New(bad)
	}
	// pgx's message is "cannot parse `DSN`: WHAT (INNER)"; WHAT is one of
	// pgx's own phrases.
	full, inner := pce.Error(), pce.Unwrap()
	if inner != nil {
		full = strings.TrimSuffix(full, " ("+inner.Error()+")")
	}
	what := "malformed"
	if i := strings.LastIndex(full, "`: "); i >= 0 {
		what = full[i+3:]
	}
	var (
		ue *url.Error
		ne *strconv.NumError
	)
	switch {
	case errors.As(inner, &ue):
		what += ": " + ue.Err.Error()
	case errors.As(inner, &ne):
		what += ": " + ne.Err.Error()
	}
	return fmt.Errorf("%s: %s", bad, what)
}

// Describe names the database dsn points at, host:port/database, for logs
// and messages: no user, no password, no options. It is "(invalid DSN)" if
// dsn does not parse.
func Describe(dsn string) string {
	cfg, err := parse(dsn)
	if err != nil {
		return "(invalid DSN)"
	}
	return describe(cfg)
}

func describe(cfg *pgx.ConnConfig) string {
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))) + "/" + cfg.Database
}

// Postgres is the dialect of PostgreSQL (11 or later) with migrations;
// migrationKey is the advisory lock key replicas take turns on while they
// migrate (one per store: the first eight bytes of a sha256 of its name).
func Postgres(migrations []string, migrationKey int64) Dialect {
	return Dialect{
		Rebind:        RebindDollar,
		ForUpdate:     " FOR UPDATE",
		MigrationLock: fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", migrationKey),
		Migrations:    migrations,
		KeyLock:       `SELECT pg_advisory_xact_lock(hashtextextended(?, 0))`,
		Conflict:      uniqueViolation,
	}
}

// OpenPostgres connects to the database dsn names (pgx through
// database/sql, at most maxConns connections; 0 means DefaultMaxConns) and
// brings its schema up to date with d, in the schema its search_path names
// first. Errors name the database by Describe, never by the DSN, which may
// hold a password.
func OpenPostgres(ctx context.Context, dsn string, maxConns int, d Dialect, program string) (*DB, error) {
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	cfg, err := parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	where := describe(cfg)
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s, err := New(ctx, db, d, program)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres %s: %w", where, err)
	}
	return s, nil
}

// uniqueViolation reports whether err is PostgreSQL's unique_violation.
func uniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}
