package config

import "github.com/airlockhq/airlock/pkg/sqldb"

// Store drivers.
const (
	// StoreSQLite is the embedded store: <data_dir>/authority.db.
	StoreSQLite = sqldb.DriverSQLite
	// StorePostgres is a PostgreSQL database that several authority
	// replicas may share.
	StorePostgres = sqldb.DriverPostgres
)

// StoreFile is the store section as the file writes it (pkg/sqldb).
type StoreFile = sqldb.Config
