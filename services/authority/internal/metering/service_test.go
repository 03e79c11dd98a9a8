package metering

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// TestUsageQuery: rows by job (newest first) and by tenant, day and
// class, the limit cutting rows but not the total, and the window
// defaulting to the month so far.
func TestUsageQuery(t *testing.T) {
	st := openStore(t)
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	// id, class, start, awake minutes (0: still running).
	for i, c := range []struct {
		id, class string
		start     time.Time
		minutes   int
	}{
		{"old", "runc", time.Date(2026, 11, 30, 23, 50, 0, 0, time.UTC), 20}, // 10 minutes in November
		{"vm1", "vm", time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), 60},
		{"run", "runc", time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC), 90}, // across midnight
		{"live", "runc", now.Add(-30 * time.Minute), 0},
	} {
		grant, _ := json.Marshal(Job{Class: c.class, Shape: Shape{CPUMillis: 1000}, Awake: time.Duration(c.minutes) * time.Minute})
		j := store.Job{ID: c.id, Tenant: "dev", IdempotencyKey: c.id, State: store.StateRunning, Grant: grant, CreatedAt: c.start, UpdatedAt: c.start}
		if _, _, err := st.CreateJob(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		if c.minutes > 0 {
			if _, err := st.UpdateJob(t.Context(), c.id, func(j *store.Job) error {
				j.State, j.UpdatedAt, j.Result = store.StateFinished, c.start.Add(time.Duration(c.minutes)*time.Minute), []byte{byte(i)}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, err := New(Config{Store: st, Decode: jsonJob, Tenants: policy.Tenants{"dev": {Name: "dev", Clients: []string{"client/dev"}}},
		Rates: Rates{VCPUMonth: MonthMinutes * 1_000_000, ClassCompute: map[string]int64{"vm": 2500}}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	dev := identity.MustParse("spiffe://airlock.test/client/dev")
	rep, err := s.Usage(t.Context(), dev, Query{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rep.Rows {
		ids = append(ids, r.JobID)
	}
	// $1 a vCPU-minute: old 10 (December's part), vm1 60 x 2.5, run 90, live 30 (running).
	if len(ids) != 4 || ids[0] != "live" || ids[3] != "old" || !rep.Rows[0].Running || rep.Total.Cost != (10+150+90+30)*1_000_000 ||
		!rep.Since.Equal(MonthStart(now)) || len(rep.Budgets) != 1 || rep.Budgets[0].Used != rep.Total.Cost {
		t.Fatalf("by job: %v, total %s, since %v, budgets %+v", ids, rep.Total.Cost, rep.Since, rep.Budgets)
	}
	days, err := s.Usage(t.Context(), dev, Query{By: ByDay, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Newest first: 12-03 runc (run's 30 after midnight, live's 30), 12-02
	// runc (run's 60 before it), then 12-01 vm and runc: cut at 2.
	if len(days.Rows) != 2 || !days.Truncated || days.Total.Cost != rep.Total.Cost ||
		days.Rows[0].Day != "2026-12-03" || days.Rows[0].AwakeMinutes != 30+30 || !days.Rows[0].Running || days.Rows[1].Day != "2026-12-02" || days.Rows[1].AwakeMinutes != 60 {
		t.Fatalf("by day: %+v, truncated %v, total %s", days.Rows, days.Truncated, days.Total.Cost)
	}
	// live started 30 minutes ago: a window inside its first minute holds
	// none of its minutes, and no row, running or not.
	if rep, err := s.Usage(t.Context(), dev, Query{Since: now.Add(-30*time.Minute + 10*time.Second), Until: now.Add(-30*time.Minute + 30*time.Second)}); err != nil || len(rep.Rows) != 0 {
		t.Fatalf("a window inside live's first minute: %+v, %v; want no row", rep.Rows, err)
	}
	if _, err := s.Usage(t.Context(), dev, Query{Since: now.Add(-MaxWindow - time.Hour)}); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "since: the window from since to until is 2233h0m0s: at most 93 days") {
		t.Fatalf("a window over 93 days: %v", err)
	}
	s.cfg.MaxJobs = 3
	if _, err := s.Usage(t.Context(), dev, Query{}); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "since: more than 3 jobs and sessions ran between since (2026-12-01T00:00:00Z) and until") {
		t.Fatalf("4 jobs, at most 3 read: %v", err)
	}
	if rep, err := s.Usage(t.Context(), dev, Query{Since: now.Add(-time.Hour)}); err != nil || len(rep.Rows) != 1 {
		t.Fatalf("a shorter window, 1 job: %+v, %v", rep.Rows, err)
	}
	if _, err := s.Usage(t.Context(), dev, Query{Tenant: "ops"}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("another tenant: %v", err)
	}
}
