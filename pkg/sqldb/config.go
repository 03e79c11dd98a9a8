package sqldb

import "github.com/airlockhq/airlock/pkg/config"

// Store drivers.
const (
	// DriverSQLite is the embedded store: a file in the data directory.
	DriverSQLite = "sqlite"
	// DriverPostgres is a PostgreSQL database that several replicas of a
	// service may share.
	DriverPostgres = "postgres"
)

// Config is a service's store section as its config file writes it:
//
//	store:
//	  driver: postgres
//	  dsn: postgres://airlock:PASSWORD@db.internal:5432/airlock?sslmode=verify-full
type Config struct {
	// Driver is sqlite (the default) or postgres.
	Driver string `yaml:"driver"`
	// DSN is the PostgreSQL connection string, a postgres:// URL or
	// key=value pairs (pgx's syntax, so PGPASSWORD, PGPASSFILE and the other
	// PG* variables fill what it leaves out); required with postgres and
	// refused with sqlite. It may hold a password: nothing logs it, and
	// errors about it never quote it.
	DSN string `yaml:"dsn"`
	// MaxConns bounds this process's connections to PostgreSQL; default
	// 10, at most 1000. Only with postgres.
	MaxConns int `yaml:"max_conns"`
}

// Validate checks the section and fills in its defaults; sqliteFile names
// the SQLite database for the error that refuses a DSN with it.
func (s *Config) Validate(sqliteFile string) error {
	switch s.Driver {
	case "":
		s.Driver = DriverSQLite
	case DriverSQLite, DriverPostgres:
	default:
		return config.Field("store.driver", "%q: want %s or %s", s.Driver, DriverSQLite, DriverPostgres)
	}
	switch {
	case s.Driver == DriverSQLite && s.DSN != "":
		return config.Field("store.dsn", "only used with driver %s; the SQLite database is <data_dir>/%s", DriverPostgres, sqliteFile)
	case s.Driver == DriverPostgres && s.DSN == "":
		return config.Field("store.dsn", "required with driver %s, e.g. postgres://USER@HOST:5432/DATABASE", DriverPostgres)
	case s.Driver == DriverPostgres:
		if err := CheckDSN(s.DSN); err != nil {
			return config.Field("store.dsn", "%v", err)
		}
	}
	switch {
	case s.MaxConns != 0 && s.Driver != DriverPostgres:
		return config.Field("store.max_conns", "only used with driver %s", DriverPostgres)
	case s.MaxConns == 0:
		s.MaxConns = DefaultMaxConns
	case s.MaxConns < 1 || s.MaxConns > 1000:
		return config.Field("store.max_conns", "%d: must be between 1 and 1000", s.MaxConns)
	}
	return nil
}
