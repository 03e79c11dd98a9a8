package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

// TestHeartbeatTellsOfARestart: a heartbeat reporting a later start than
// the one recorded tells the restart hook before it is recorded, once; a
// failing hook fails the heartbeat, and the next one tells it again.
func TestHeartbeatTellsOfARestart(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	fl, err := fleet.New(fleet.Config{Store: st, Interval: time.Second, LostAfter: 3 * time.Second, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fl.Close() })
	var (
		told []string
		fail error
	)
	fl.OnRestart(func(_ context.Context, id, name string, startedAt time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, fmt.Sprintf("%s %s %s", id, name, startedAt.Format(time.TimeOnly)))
		return fail
	})
	a, err := identity.Executor("airlock.test", "a")
	if err != nil {
		t.Fatal(err)
	}
	beat := func(started time.Time) error {
		_, err := fl.Heartbeat(t.Context(), a, "a.test:7402", fleet.Report{StartedAt: started, Classes: []string{"runc"}})
		return err
	}
	first := now.Add(-time.Hour)
	for _, started := range []time.Time{first, first} {
		if err := beat(started); err != nil {
			t.Fatal(err)
		}
	}
	if len(told) != 0 {
		t.Fatalf("told %q of no restart", told)
	}
	// A restart a moment after the last heartbeat (sooner than a
	// heartbeat is written) is still seen, and failing, fails the beat.
	mu.Lock()
	fail = errors.New("the store is away")
	mu.Unlock()
	second := now.Add(-time.Second)
	if err := beat(second); err == nil {
		t.Fatal("a heartbeat whose restart hook failed succeeded")
	}
	mu.Lock()
	fail, now = nil, now.Add(time.Second)
	mu.Unlock()
	for range 2 {
		if err := beat(second); err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprintf("[%s a 23:59:59 %s a 23:59:59]", a, a)
	if got := fmt.Sprint(told); got != want {
		t.Fatalf("told %s; want %s (the failed one, then once more)", got, want)
	}
	// An earlier start (a clock set back) is no restart.
	if err := beat(first); err != nil {
		t.Fatal(err)
	}
	if len(told) != 2 {
		t.Fatalf("told %q", told)
	}
}
