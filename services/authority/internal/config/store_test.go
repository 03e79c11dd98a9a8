package config_test

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/services/authority/internal/config"
)

func TestStoreDefaultsToSQLite(t *testing.T) {
	c, err := config.Load(write(t, common), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Store.Driver != config.StoreSQLite || c.Store.DSN != "" {
		t.Fatalf("store = %+v, want sqlite without a DSN", c.Store)
	}
}

func TestStorePostgres(t *testing.T) {
	for _, dsn := range []string{
		"postgres://airlock:hunter2@db.internal:5432/airlock?sslmode=verify-full",
		"host=db.internal dbname=airlock user=airlock sslmode=require",
	} {
		c, err := config.Load(write(t, common+"store: {driver: postgres, dsn: '"+dsn+"'}\n"), nil)
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		if c.Store.Driver != config.StorePostgres || c.Store.DSN != dsn || c.Store.MaxConns != 10 {
			t.Fatalf("store = %+v", c.Store)
		}
	}
	c, err := config.Load(write(t, common+"store: {driver: postgres, dsn: 'postgres://db/airlock', max_conns: 40}\n"), nil)
	if err != nil || c.Store.MaxConns != 40 {
		t.Fatalf("max_conns 40: %+v, %v", c.Store, err)
	}
}

func TestStoreErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, store, want string
	}{
		{"unknown driver", "{driver: mysql}", `store.driver: "mysql": want sqlite or postgres`},
		{"dsn with sqlite", "{dsn: 'postgres://db/airlock'}", "store.dsn: only used with driver postgres"},
		{"postgres without dsn", "{driver: postgres}", "store.dsn: required with driver postgres"},
		{"max_conns with sqlite", "{max_conns: 5}", "store.max_conns: only used with driver postgres"},
		{"max_conns too big", "{driver: postgres, dsn: 'postgres://db/airlock', max_conns: 5000}", "store.max_conns: 5000: must be between 1 and 1000"},
		{"bad url", "{driver: postgres, dsn: 'postgres://airlock:hunter2@db:port/airlock'}", "store.dsn: not a valid PostgreSQL connection string"},
		{"bad key=value", "{driver: postgres, dsn: 'host=db password=hunter2 sslmode=sometimes'}", "store.dsn: not a valid PostgreSQL connection string"},
		{"unknown field", "{driver: postgres, path: /x}", "store.path (line 7): unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(write(t, common+"store: "+tc.store+"\n"), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v does not mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}
