package metering

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

// jsonJob is the stand-in decoder of these tests: the grant holds the
// Job as JSON (the authority's real one reads the wire grant and result).
func jsonJob(r store.UsageRecord) (Job, error) {
	var j Job
	if err := json.Unmarshal(r.Grant, &j); err != nil {
		return Job{}, err
	}
	j.ID, j.Tenant, j.Start, j.End = r.ID, r.Tenant, r.StartedAt, r.EndedAt
	if !r.State.Terminal() {
		j.End = time.Time{}
	}
	if j.Reported = len(r.Result) > 0; !j.Reported {
		// No result, no usage: as the real decoder reads it.
		j.Awake, j.Asleep, j.Wall = 0, 0, 0
	}
	return j, nil
}

// openStore is a real SQLite store, closed when t ends.
func openStore(t *testing.T) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestBudgetWarnsOnceAcrossReplicas: on a real SQLite store, a tenant at
// 80% of its budget is warned at every submission, the warning logged
// once a month even by a second authority sharing the store; at 100% it
// is refused naming the next month.
func TestBudgetWarnsOnceAcrossReplicas(t *testing.T) {
	st := openStore(t)
	now := time.Date(2026, 12, 20, 12, 0, 0, 0, time.UTC)
	// A job of 1 vCPU for 9 minutes at $1 a vCPU-minute: $9 of $10. Each
	// ends at now, as the store stamps a job's end when it is written.
	add := func(id string, minutes int) {
		grant, _ := json.Marshal(Job{Class: "runc", Shape: Shape{CPUMillis: 1000}, Awake: time.Duration(minutes) * time.Minute})
		start := now.Add(-time.Duration(minutes) * time.Minute)
		j := store.Job{ID: id, Tenant: "dev", IdempotencyKey: id, State: store.StateRunning, Grant: grant, CreatedAt: start, UpdatedAt: start}
		if _, _, err := st.CreateJob(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		if _, err := st.UpdateJob(t.Context(), id, func(j *store.Job) error {
			j.State, j.UpdatedAt, j.Result = store.StateFinished, start.Add(time.Duration(minutes)*time.Minute), []byte("r")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	add("j1", 9)
	now = now.Add(10 * time.Minute) // j1 settled: the ledger keeps it
	rates := Rates{VCPUMonth: MonthMinutes * 1_000_000}
	replica := func() *Service {
		s, err := New(Config{Store: st, Decode: jsonJob, Tenants: policy.Tenants{"dev": {Name: "dev"}}, Rates: rates,
			Budgets: map[string]Micros{"dev": 10_000_000}, Self: identity.MustParse("spiffe://airlock.test/service/authority"),
			Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := replica(), replica()
	for i, s := range []*Service{a, a, b, b} {
		w, err := s.Admit(t.Context(), "dev")
		if err != nil || w != "tenant dev has used $9.00 of its $10.00 monthly budget (90%)" {
			t.Fatalf("admit %d: %q, %v", i, w, err)
		}
	}
	events, err := st.ListAudit(t.Context(), store.AuditFilter{Kind: audit.KindBudgetWarning, Limit: 10})
	if err != nil || len(events) != 1 || events[0].Tenant != "dev" || events[0].Caller != "spiffe://airlock.test/service/authority" {
		t.Fatalf("warnings logged: %+v, %v; want one", events, err)
	}
	if w, err := a.Admit(t.Context(), "other"); w != "" || err != nil {
		t.Fatalf("a tenant without a budget: %q, %v", w, err)
	}
	add("j2", 1)
	_, err = b.Admit(t.Context(), "dev")
	if !errors.Is(err, errdefs.ErrResourceExhausted) ||
		!strings.HasSuffix(err.Error(), "tenant dev has used $10.00 of its $10.00 monthly budget; new jobs are refused until 2027-01-01") {
		t.Fatalf("at the budget: %v", err)
	}
	if used, err := a.MonthToDate(t.Context(), "dev"); err != nil || used != 10_000_000 {
		t.Fatalf("month to date %d, %v", used, err)
	}
}

// TestBudgetReadsALateResult: a job cancelled while its executor was lost
// ends with no result and counts its span (30 minutes); the ledger keeps
// it once settled. Its result, recorded an hour later (10 minutes awake),
// moves its end, so the next admission reads it again: counted once, as
// the result says, by this process's ledger and a new one alike.
func TestBudgetReadsALateResult(t *testing.T) {
	st := openStore(t)
	now := time.Date(2026, 12, 20, 12, 0, 0, 0, time.UTC)
	grant, _ := json.Marshal(Job{Class: "runc", Shape: Shape{CPUMillis: 1000}, Awake: 10 * time.Minute})
	start := now.Add(-time.Hour)
	if _, _, err := st.CreateJob(t.Context(), store.Job{ID: "lost", Tenant: "dev", IdempotencyKey: "lost", State: store.StateRunning,
		Grant: grant, CreatedAt: start, UpdatedAt: start}); err != nil {
		t.Fatal(err)
	}
	update := func(fn func(j *store.Job)) {
		t.Helper()
		if _, err := st.UpdateJob(t.Context(), "lost", func(j *store.Job) error { fn(j); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	update(func(j *store.Job) { j.State, j.UpdatedAt = store.StateCancelled, start.Add(30*time.Minute) })
	replica := func() *Service {
		s, err := New(Config{Store: st, Decode: jsonJob, Rates: Rates{VCPUMonth: MonthMinutes * 1_000_000},
			Budgets: map[string]Micros{"dev": 100_000_000}, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := replica()
	used := func(s *Service, want Micros, when string) {
		t.Helper()
		if got, err := s.monthToDate(t.Context(), "dev", now); err != nil || got != want {
			t.Fatalf("%s: month to date %s, %v; want %s", when, got, err, want)
		}
	}
	used(s, 30_000_000, "ended without a result (its span)")
	now = now.Add(time.Hour)
	used(s, 30_000_000, "settled in the ledger")
	update(func(j *store.Job) { j.Result, j.UpdatedAt = []byte("r"), now })
	used(s, 10_000_000, "its late result")
	now = now.Add(time.Hour)
	used(s, 10_000_000, "the late result settled")
	used(replica(), 10_000_000, "a new process")
}
