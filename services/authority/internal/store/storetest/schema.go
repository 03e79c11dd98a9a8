package storetest

import (
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// ShippedSchemaFile holds, in each implementation's testdata, the schema the
// builds before one schema for both dialects made, dumped from them.
const ShippedSchemaFile = "testdata/schema.txt"

// ShippedSchema fails t unless got, a new database's schema dumped by the
// implementation's test, is the one in ShippedSchemaFile, which it returns.
// AIRLOCK_UPDATE_SCHEMA=1 rewrites the file first (only ever for a new
// migration).
func ShippedSchema(t *testing.T, got string) string {
	t.Helper()
	if os.Getenv("AIRLOCK_UPDATE_SCHEMA") == "1" {
		if err := os.WriteFile(ShippedSchemaFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(ShippedSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("a new database's schema is not the shipped one:\n got:\n%s\nwant:\n%s", got, want)
	}
	return string(want)
}

// Versions lists the migrations db's schema_migrations records, each as
// version@applied_at, so a test sees any version applied again.
func Versions(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query("SELECT version, applied_at FROM schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var v strings.Builder
	for rows.Next() {
		var n, at int64
		if err := rows.Scan(&n, &at); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&v, "%d@%d ", n, at)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return v.String()
}

// CheckFleetUpgrade fails t unless s, just upgraded from a schema before
// the fleet's (version 8 or older) with the queued job jobID in it, holds
// the job claimed by no one, lets the first claimer take it up without a
// change of the job, and has an empty fleet.
func CheckFleetUpgrade(t *testing.T, s store.Store, jobID string) {
	t.Helper()
	if j, err := s.GetJob(ctx(t), jobID); err != nil || j.ClaimedBy != "" || !j.ClaimExpiresAt.IsZero() {
		t.Fatalf("job after the upgrade: %+v, %v", j, err)
	}
	now := time.Unix(1000, 0)
	if got, err := s.ClaimJobs(ctx(t), "r1", now, now.Add(time.Minute), 10); err != nil || len(got) != 1 || got[0].ID != jobID || got[0].Version != 1 {
		t.Fatalf("ClaimJobs after the upgrade: %+v, %v", got, err)
	}
	if list, err := s.ListExecutors(ctx(t)); err != nil || len(list) != 0 {
		t.Fatalf("ListExecutors after the upgrade: %+v, %v", list, err)
	}
}

// UsageUpgradeJob is a job as a build of schema 10 left it (times in
// microseconds), and the start and end migration 11 must give it.
type UsageUpgradeJob struct {
	ID, State                    string
	Dispatched, Created, Updated int64
	Started, Ended               int64
}

// UsageUpgradeJobs are the jobs each store's upgrade test writes at
// schema 10 and CheckUsageUpgrade reads after: a dispatched job starts at
// its first dispatch, never at its creation (its wait for an approval or
// in the queue is not compute), and ends at its last change; one
// cancelled before dispatch has no start; a queued one neither.
var UsageUpgradeJobs = []UsageUpgradeJob{
	{ID: "done", State: "finished", Dispatched: 5, Created: 3, Updated: 9, Started: 5, Ended: 9},
	{ID: "staging", State: "staging", Dispatched: 6, Created: 2, Updated: 7, Started: 6},
	{ID: "unsent", State: "cancelled", Created: 3, Updated: 7, Ended: 7},
	{ID: "waiting", State: "queued", Created: 3, Updated: 3},
}

// CheckUsageUpgrade fails t unless s, just upgraded from schema 10 with
// UsageUpgradeJobs in it, holds each with the start and end it must have.
func CheckUsageUpgrade(t *testing.T, s store.Store) {
	t.Helper()
	micro := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixMicro()
	}
	for _, c := range UsageUpgradeJobs {
		j, err := s.GetJob(ctx(t), c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := [2]int64{micro(j.StartedAt), micro(j.EndedAt)}, [2]int64{c.Started, c.Ended}; got != want {
			t.Errorf("%s (%s, dispatched %d, created %d): started, ended = %v µs, want %v", c.ID, c.State, c.Dispatched, c.Created, got, want)
		}
	}
}
