package sqldb_test

import (
	"testing"

	"github.com/airlockhq/airlock/pkg/sqldb"
)

func TestRebindDollar(t *testing.T) {
	got := sqldb.RebindDollar("SELECT a FROM t WHERE b = ? AND c IN (?, ?) LIMIT ?")
	if want := "SELECT a FROM t WHERE b = $1 AND c IN ($2, $3) LIMIT $4"; got != want {
		t.Fatalf("RebindDollar = %q, want %q", got, want)
	}
}
