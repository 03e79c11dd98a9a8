package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// usageTests hold the store to what metering reads: the start and end
// stamps the store sets, and UsageJobs' selection.
var usageTests = []conformance{
	{"UsageStampsStartAndEnd", testUsageStamps},
	{"UsageJobsSelectsOverlap", testUsageJobs},
}

func testUsageStamps(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	step := func(st store.State, at time.Time, result []byte) store.Job {
		t.Helper()
		j, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
			j.State, j.UpdatedAt = st, at
			j.StartedAt, j.EndedAt = base.Add(99*time.Hour), base.Add(99*time.Hour) // ignored: the store sets them
			if result != nil {
				j.Result = result
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	if j := step(store.StateQueued, base.Add(time.Second), nil); !j.StartedAt.IsZero() || !j.EndedAt.IsZero() {
		t.Fatalf("queued: started %v ended %v, want both zero", j.StartedAt, j.EndedAt)
	}
	// Dispatched, but the executor had no room: it waits, queued, and has
	// not started.
	if _, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
		j.DispatchedAt, j.UpdatedAt = base.Add(2*time.Second), base.Add(2*time.Second)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	start := base.Add(time.Minute)
	if j := step(store.StateStaging, start, nil); !j.StartedAt.Equal(start) || !j.EndedAt.IsZero() {
		t.Fatalf("staging: started %v ended %v, want %v (when it began staging, not its dispatch) and zero", j.StartedAt, j.EndedAt, start)
	}
	if j := step(store.StateRunning, start.Add(time.Minute), nil); !j.StartedAt.Equal(start) {
		t.Fatalf("running: started %v, want the first start %v kept", j.StartedAt, start)
	}
	end := start.Add(time.Hour)
	if j := step(store.StateFinished, end, []byte("result")); !j.StartedAt.Equal(start) || !j.EndedAt.Equal(end) {
		t.Fatalf("finished: started %v ended %v, want %v and %v", j.StartedAt, j.EndedAt, start, end)
	}
	if j := step(store.StateFinished, end.Add(time.Hour), nil); !j.EndedAt.Equal(end) {
		t.Fatalf("a later change moved the end to %v, want %v", j.EndedAt, end)
	}
	read, err := s.GetJob(ctx(t), "j1")
	if err != nil || !read.StartedAt.Equal(start) || !read.EndedAt.Equal(end) {
		t.Fatalf("GetJob: started %v ended %v (%v), want %v and %v", read.StartedAt, read.EndedAt, err, start, end)
	}
	// A job cancelled while queued never started: it ends unstarted.
	mustCreate(t, s, NewJob("dev", "j2", 1))
	j, err := s.UpdateJob(ctx(t), "j2", func(j *store.Job) error {
		j.State, j.UpdatedAt = store.StateCancelled, base.Add(time.Hour)
		return nil
	})
	if err != nil || !j.StartedAt.IsZero() || !j.EndedAt.Equal(base.Add(time.Hour)) {
		t.Fatalf("cancelled while queued: started %v ended %v (%v)", j.StartedAt, j.EndedAt, err)
	}

	// A job cancelled while running whose result comes late (its executor
	// was lost a while): the result moves its end to when it arrived, so
	// a reader of what ended since then reads it again; once only.
	mustCreate(t, s, NewJob("dev", "j3", 2))
	up := func(fn func(j *store.Job)) store.Job {
		t.Helper()
		j, err := s.UpdateJob(ctx(t), "j3", func(j *store.Job) error { fn(j); return nil })
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	up(func(j *store.Job) { j.State, j.UpdatedAt = store.StateRunning, start })
	if j := up(func(j *store.Job) { j.State, j.UpdatedAt = store.StateCancelled, end }); !j.EndedAt.Equal(end) {
		t.Fatalf("cancelled: ended %v, want %v", j.EndedAt, end)
	}
	late := end.Add(3 * time.Hour)
	if j := up(func(j *store.Job) { j.Result, j.UpdatedAt = []byte("late"), late }); !j.EndedAt.Equal(late) || !j.StartedAt.Equal(start) {
		t.Fatalf("a late result: started %v ended %v, want %v and %v (moved to the result)", j.StartedAt, j.EndedAt, start, late)
	}
	if j := up(func(j *store.Job) { j.Message, j.UpdatedAt = "later", late.Add(time.Hour) }); !j.EndedAt.Equal(late) {
		t.Fatalf("a change after the result moved the end to %v, want %v", j.EndedAt, late)
	}
}

func testUsageJobs(t *testing.T, open Opener) {
	s := open(t)
	hour := func(h int) time.Time { return base.Add(time.Duration(h) * time.Hour) }
	// id, tenant, started hour, ended hour (-1: running, -2: never started).
	for i, c := range []struct {
		id, tenant string
		start, end int
	}{
		{"before", "dev", 0, 1},     // ended before since
		{"across", "dev", 1, 3},     // ended inside
		{"inside", "dev", 3, 4},     // wholly inside
		{"running", "dev", 4, -1},   // still running
		{"after", "dev", 6, 7},      // starts at until: outside
		{"other", "ops", 3, 4},      // another tenant
		{"unstarted", "dev", 3, -2}, // cancelled while queued
	} {
		j := NewJob(c.tenant, c.id, i)
		mustCreate(t, s, j)
		update := func(st store.State, at time.Time) {
			t.Helper()
			if _, err := s.UpdateJob(ctx(t), c.id, func(j *store.Job) error {
				j.State, j.UpdatedAt, j.Result = st, at, []byte("r-"+c.id)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		switch c.end {
		case -2:
			if _, err := s.UpdateJob(ctx(t), c.id, func(j *store.Job) error {
				j.State, j.UpdatedAt = store.StateCancelled, hour(c.start)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		case -1:
			update(store.StateRunning, hour(c.start))
		default:
			update(store.StateRunning, hour(c.start))
			update(store.StateFinished, hour(c.end))
		}
	}
	ids := func(f store.UsageFilter) string {
		t.Helper()
		got, err := s.UsageJobs(ctx(t), f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range got {
			out = append(out, r.ID)
			if r.ID == "inside" && (!r.StartedAt.Equal(hour(3)) || !r.EndedAt.Equal(hour(4)) || string(r.Result) != "r-inside" ||
				string(r.Grant) != "grant-inside" || r.State != store.StateFinished || r.Tenant != "dev") {
				t.Fatalf("record of inside = %+v", r)
			}
		}
		return fmt.Sprint(out)
	}
	if got := ids(store.UsageFilter{Tenants: []string{"dev"}, Since: hour(2), Until: hour(6)}); got != "[running inside across]" {
		t.Fatalf("dev in [2h, 6h) = %s, want [running inside across] (newest start first)", got)
	}
	if got := ids(store.UsageFilter{Since: hour(2), Until: hour(6)}); got != "[running other inside across]" && got != "[running inside other across]" {
		t.Fatalf("every tenant in [2h, 6h) = %s", got)
	}
	if got := ids(store.UsageFilter{Tenants: []string{"dev"}, Since: hour(2), Until: hour(6), Limit: 2}); got != "[running inside]" {
		t.Fatalf("dev in [2h, 6h), limit 2 = %s, want [running inside]", got)
	}
	if got := ids(store.UsageFilter{Tenants: []string{"ops", "nobody"}, Since: hour(0), Until: hour(10)}); got != "[other]" {
		t.Fatalf("ops = %s, want [other]", got)
	}
	if _, err := s.UsageJobs(ctx(t), store.UsageFilter{}); err == nil {
		t.Fatal("UsageJobs without since and until: no error")
	}
}
