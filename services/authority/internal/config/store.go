package config

import (
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/services/authority/internal/store/postgres"
)

// Store drivers.
const (
	// StoreSQLite is the embedded store: <data_dir>/authority.db.
	StoreSQLite = "sqlite"
	// StorePostgres is a PostgreSQL database that several authority
	// replicas may share.
	StorePostgres = "postgres"
)

// StoreFile is the store section as the file writes it:
//
//	store:
//	  driver: postgres
//	  dsn: postgres://airlock:PASSWORD@db.internal:5432/airlock?sslmode=verify-full
type StoreFile struct {
	// Driver is sqlite (the default) or postgres.
	Driver string `yaml:"driver"`
	// DSN is the PostgreSQL connection string, a postgres:// URL or
	// key=value pairs (pgx's syntax, so PGPASSWORD, PGPASSFILE and the other
	// PG* variables fill what it leaves out); required with postgres and
	// refused with sqlite. It may hold a password: nothing logs it, and
	// errors about it never quote it.
	DSN string `yaml:"dsn"`
	// MaxConns bounds this authority's connections to PostgreSQL; default
	// 10, at most 1000. Only with postgres.
	MaxConns int `yaml:"max_conns"`
}

func (s *StoreFile) validate() error {
	switch s.Driver {
	case "":
		s.Driver = StoreSQLite
	case StoreSQLite, StorePostgres:
	default:
		return config.Field("store.driver", "%q: want %s or %s", s.Driver, StoreSQLite, StorePostgres)
	}
	switch {
	case s.Driver == StoreSQLite && s.DSN != "":
		return config.Field("store.dsn", "only used with driver %s; the SQLite database is <data_dir>/authority.db", StorePostgres)
	case s.Driver == StorePostgres && s.DSN == "":
		return config.Field("store.dsn", "required with driver %s, e.g. postgres://USER@HOST:5432/DATABASE", StorePostgres)
	case s.Driver == StorePostgres:
		if err := postgres.CheckDSN(s.DSN); err != nil {
			return config.Field("store.dsn", "%v", err)
		}
	}
	switch {
	case s.MaxConns != 0 && s.Driver != StorePostgres:
		return config.Field("store.max_conns", "only used with driver %s", StorePostgres)
	case s.MaxConns == 0:
		s.MaxConns = postgres.DefaultMaxConns
	case s.MaxConns < 1 || s.MaxConns > 1000:
		return config.Field("store.max_conns", "%d: must be between 1 and 1000", s.MaxConns)
	}
	return nil
}
