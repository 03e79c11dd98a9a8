package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

var fleetTests = []conformance{
	{"ExecutorUpdateCreatesThenUpdates", testExecutorUpdate},
	{"ExecutorUpdateRefusalsWriteNothing", testExecutorRefusals},
	{"ExecutorConcurrentUpdatesAcrossStores", testExecutorRace},
	{"ExecutorListByName", testExecutorList},
	{"Placements", testPlacements},
	{"JobsOnExecutor", testJobsOnExecutor},
	{"ClaimJobs", testClaimJobs},
	{"ClaimJobsRaceAcrossStores", testClaimRace},
	{"RenewClaims", testRenewClaims},
	{"ReleaseClaims", testReleaseClaims},
	{"UpdateJobKeepsClaims", testUpdateKeepsClaims},
}

// NewExecutor returns an executor that is up, with every field set, first
// and last seen at base+n seconds.
func NewExecutor(name string, n int) store.Executor {
	at := base.Add(time.Duration(n) * time.Second)
	return store.Executor{
		Name: name, ID: "spiffe://airlock.test/service/executor/" + name, Address: name + ".airlock.test:7443",
		Report: []byte("report-" + name), State: store.ExecutorUp, JoinedAt: at, LastSeen: at,
	}
}

func equalExecutors(a, b store.Executor) error {
	if a.Name != b.Name || a.ID != b.ID || a.Address != b.Address || string(a.Report) != string(b.Report) || a.State != b.State ||
		a.Draining != b.Draining || a.DrainedBy != b.DrainedBy || !a.DrainedAt.Equal(b.DrainedAt) || a.DrainReason != b.DrainReason ||
		!a.JoinedAt.Equal(b.JoinedAt) || !a.LastSeen.Equal(b.LastSeen) || a.Version != b.Version {
		return fmt.Errorf("executor records differ:\n%+v\n%+v", a, b)
	}
	return nil
}

func executorEvent(kind, name string) *audit.Event {
	return &audit.Event{Kind: kind, Caller: "spiffe://airlock.test/service/executor/" + name, Subject: name, Outcome: "allowed"}
}

// set is an update that makes the record want and returns event.
func set(want store.Executor, event *audit.Event) func(*store.Executor, bool) (*audit.Event, error) {
	return func(e *store.Executor, _ bool) (*audit.Event, error) {
		*e = want
		return event, nil
	}
}

// testExecutorUpdate: the first update of a name sees no record and
// creates it with its audit entry; later ones see the stored record; an
// update without an event writes none; the name and Version are the
// store's whatever the update does; the record survives a restart.
func testExecutorUpdate(t *testing.T, open Opener) {
	s := open(t)
	if _, err := s.GetExecutor(ctx(t), "e1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetExecutor of an unknown executor: %v", err)
	}
	want := NewExecutor("e1", 1)
	want.LastSeen = want.LastSeen.Add(1500 * time.Nanosecond) // stored to the microsecond
	got, err := s.UpdateExecutorAudited(ctx(t), "e1", func(e *store.Executor, found bool) (*audit.Event, error) {
		if found || e.Name != "e1" || e.ID != "" || e.Version != 0 {
			return nil, fmt.Errorf("first update saw found %v, %+v", found, e)
		}
		*e = want
		return executorEvent(audit.KindExecutorJoined, "e1"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want.LastSeen, want.Version = want.LastSeen.Truncate(time.Microsecond), 1
	if err := equalExecutors(got, want); err != nil {
		t.Fatal(err)
	}

	lost := want
	lost.State, lost.Draining, lost.DrainedBy, lost.DrainedAt, lost.DrainReason = store.ExecutorLost, true, "spiffe://airlock.test/operator/ops", base.Add(time.Minute), "kernel update"
	got, err = s.UpdateExecutorAudited(ctx(t), "e1", func(e *store.Executor, found bool) (*audit.Event, error) {
		if !found {
			return nil, errors.New("second update found no record")
		}
		if err := equalExecutors(*e, want); err != nil {
			return nil, fmt.Errorf("second update saw another record: %v", err)
		}
		*e = lost
		e.Name, e.Version = "e2", 100 // neither is written
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lost.Version = 2
	if err := equalExecutors(got, lost); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetExecutor(ctx(t), "e2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an update renamed the executor: %v", err)
	}
	if n := countKind(t, s, audit.KindExecutorJoined); n != 1 || len(ReadAudit(t, s)) != 1 {
		t.Fatalf("%d executor.joined entries in %d, want the first update's only", n, len(ReadAudit(t, s)))
	}

	s.Close()
	s = open(t)
	stored, err := s.GetExecutor(ctx(t), "e1")
	if err != nil {
		t.Fatal(err)
	}
	if err := equalExecutors(stored, lost); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}

// testExecutorRefusals: an update that refuses, leaves an invalid record
// or returns an invalid event writes neither the record nor the event; an
// id another executor holds is refused too.
func testExecutorRefusals(t *testing.T, open Opener) {
	s := open(t)
	if _, err := s.UpdateExecutorAudited(ctx(t), "e1", set(NewExecutor("e1", 1), executorEvent(audit.KindExecutorJoined, "e1"))); err != nil {
		t.Fatal(err)
	}
	before, err := s.GetExecutor(ctx(t), "e1")
	if err != nil {
		t.Fatal(err)
	}
	no := errors.New("refused")
	noID := NewExecutor("e1", 2)
	noID.ID = ""
	down := NewExecutor("e1", 2)
	down.State = "down"
	taken := NewExecutor("e1", 2)
	taken.ID = NewExecutor("e2", 0).ID
	for _, tc := range []struct {
		name    string
		target  string
		update  func(*store.Executor, bool) (*audit.Event, error)
		wantErr error
	}{
		{"update's error", "e1", func(e *store.Executor, _ bool) (*audit.Event, error) {
			e.Address = "changed:1"
			return executorEvent(audit.KindExecutorLost, "e1"), no
		}, no},
		{"update's error, new executor", "e2", func(e *store.Executor, _ bool) (*audit.Event, error) {
			*e = NewExecutor("e2", 2)
			return executorEvent(audit.KindExecutorJoined, "e2"), no
		}, no},
		{"no id", "e1", set(noID, executorEvent(audit.KindExecutorLost, "e1")), errdefs.ErrInvalidArgument},
		{"unknown state", "e1", set(down, executorEvent(audit.KindExecutorLost, "e1")), errdefs.ErrInvalidArgument},
		{"invalid event", "e1", set(NewExecutor("e1", 2), &audit.Event{Kind: ""}), errdefs.ErrInvalidArgument},
		{"invalid event, new executor", "e2", set(NewExecutor("e2", 2), &audit.Event{Kind: "x", Reason: "nul\x00"}), errdefs.ErrInvalidArgument},
		{"no name", "", set(NewExecutor("e1", 2), nil), errdefs.ErrInvalidArgument},
	} {
		if _, err := s.UpdateExecutorAudited(ctx(t), tc.target, tc.update); !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.wantErr)
		}
	}
	// The first executor holds e1's id: a second may not take it.
	if _, err := s.UpdateExecutorAudited(ctx(t), "e2", set(NewExecutor("e2", 2), nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateExecutorAudited(ctx(t), "e1", set(taken, executorEvent(audit.KindExecutorLost, "e1"))); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("taking another executor's id: err = %v, want ErrAlreadyExists", err)
	}
	after, err := s.GetExecutor(ctx(t), "e1")
	if err != nil {
		t.Fatal(err)
	}
	if err := equalExecutors(after, before); err != nil {
		t.Fatalf("a refused update changed the record: %v", err)
	}
	if e2, err := s.GetExecutor(ctx(t), "e2"); err != nil || e2.Version != 1 {
		t.Fatalf("e2 after refused creates and one good one: %+v, %v", e2, err)
	}
	if got := VerifyAudit(t, s); len(got) != 1 || got[0].Kind != audit.KindExecutorJoined {
		t.Fatalf("audit log after refused updates: %+v", got)
	}
}

// testExecutorRace: 2×50 updates of one executor, through two stores at
// once and starting with no record, each adding one to a counter kept in
// Report, lose none; exactly one of them finds no record.
func testExecutorRace(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t)}
	const n = 100
	onStores(n, stores, func(i int, s store.Store) {
		_, err := s.UpdateExecutorAudited(ctx(t), "e1", func(e *store.Executor, found bool) (*audit.Event, error) {
			count := 0
			if found {
				var err error
				if count, err = strconv.Atoi(string(e.Report)); err != nil {
					return nil, err
				}
			}
			joined := NewExecutor("e1", i)
			e.ID, e.State, e.Report = joined.ID, joined.State, []byte(strconv.Itoa(count+1))
			if !found {
				return executorEvent(audit.KindExecutorJoined, "e1"), nil
			}
			return nil, nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	got, err := stores[1].GetExecutor(ctx(t), "e1")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Report) != strconv.Itoa(n) || got.Version != n {
		t.Fatalf("lost updates between two stores: counter %q, version %d; want %d", got.Report, got.Version, n)
	}
	if j := countKind(t, stores[0], audit.KindExecutorJoined); j != 1 {
		t.Fatalf("%d updates found no record, want 1", j)
	}
}

func testExecutorList(t *testing.T, open Opener) {
	s := open(t)
	if list, err := s.ListExecutors(ctx(t)); err != nil || len(list) != 0 {
		t.Fatalf("ListExecutors of an empty fleet = %+v, %v", list, err)
	}
	for i, name := range []string{"e3", "e1", "e2"} {
		if _, err := s.UpdateExecutorAudited(ctx(t), name, set(NewExecutor(name, i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.ListExecutors(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list {
		names = append(names, e.Name)
	}
	if !slices.Equal(names, []string{"e1", "e2", "e3"}) {
		t.Fatalf("ListExecutors = %v, want e1 e2 e3", names)
	}
	if err := equalExecutors(list[1], func() store.Executor { e := NewExecutor("e2", 2); e.Version = 1; return e }()); err != nil {
		t.Fatal(err)
	}
}

func createAll(t *testing.T, s store.Store, jobs ...store.Job) {
	t.Helper()
	for _, j := range jobs {
		mustCreate(t, s, j)
	}
}

// onStores runs fn(i, s) for every i below n at once, s being stores[i]
// round the list, and waits for them all.
func onStores(n int, stores []store.Store, fn func(i int, s store.Store)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i, stores[i%len(stores)])
		}()
	}
	wg.Wait()
}

// placed returns job id of tenant on executor in state, created at
// base+n seconds.
func placed(tenant, id, executor string, state store.State, n int) store.Job {
	j := NewJob(tenant, id, n)
	j.Executor, j.State = executor, state
	return j
}

const (
	execA = "spiffe://airlock.test/service/executor/a"
	execB = "spiffe://airlock.test/service/executor/b"
)

func testPlacements(t *testing.T, open Opener) {
	s := open(t)
	if p, err := s.Placements(ctx(t)); err != nil || len(p) != 0 {
		t.Fatalf("Placements with no jobs = %+v, %v", p, err)
	}
	createAll(t, s,
		placed("dev", "a1", execA, store.StateQueued, 0),
		placed("dev", "a2", execA, store.StateStaging, 1),
		placed("dev", "a3", execA, store.StateRunning, 2),
		placed("dev", "a4", execA, store.StateFinished, 3),
		placed("other", "a5", execA, store.StateRunning, 4),
		placed("dev", "b1", execB, store.StateFailed, 5),
		placed("dev", "b2", execB, store.StateCancelled, 6),
		placed("other", "b3", execB, store.StateQueued, 7),
		placed("dev", "nowhere", "", store.StateQueued, 8),
	)
	got, err := s.Placements(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	counts := map[store.Placement]bool{}
	for _, p := range got {
		counts[p] = true
	}
	want := []store.Placement{
		{Executor: execA, Tenant: "dev", Jobs: 3}, {Executor: execA, Tenant: "other", Jobs: 1}, {Executor: execB, Tenant: "other", Jobs: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("Placements = %+v, want %+v", got, want)
	}
	for _, p := range want {
		if !counts[p] {
			t.Fatalf("Placements = %+v, want %+v", got, want)
		}
	}
}

func ids(jobs []store.Job) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}

func testJobsOnExecutor(t *testing.T, open Opener) {
	s := open(t)
	// Created out of order; "a0" and "a9" share a creation time.
	createAll(t, s,
		placed("dev", "a3", execA, store.StateRunning, 3),
		placed("dev", "a9", execA, store.StateQueued, 1),
		placed("other", "a0", execA, store.StateStaging, 1),
		placed("dev", "a5", execA, store.StateFinished, 0),
		placed("dev", "a6", execA, store.StateFailed, 6),
		placed("dev", "b1", execB, store.StateRunning, 0),
		placed("dev", "n1", "", store.StateQueued, 0),
	)
	for _, tc := range []struct {
		executor string
		limit    int
		states   []store.State
		want     []string
	}{
		{execA, 10, nil, []string{"a0", "a9", "a3"}},
		{execA, 2, nil, []string{"a0", "a9"}},
		{execA, 10, []store.State{store.StateFinished, store.StateFailed}, []string{"a5", "a6"}},
		{execA, 10, []store.State{store.StateRunning}, []string{"a3"}},
		{execB, 10, nil, []string{"b1"}},
		{"spiffe://airlock.test/service/executor/c", 10, nil, []string{}},
	} {
		got, err := s.JobsOnExecutor(ctx(t), tc.executor, tc.limit, tc.states...)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("JobsOnExecutor(%s, %d, %v) = %v, want %v", tc.executor, tc.limit, tc.states, ids(got), tc.want)
		}
	}
	if got, err := s.JobsOnExecutor(ctx(t), execA, 1); err != nil || len(got) != 1 || got[0].Executor != execA || got[0].Tenant != "other" {
		t.Fatalf("JobsOnExecutor returned %+v, %v", got, err)
	}
}

// claimed returns job id, created at base+n seconds, claimed by owner
// until until.
func claimed(id string, n int, owner string, until time.Time) store.Job {
	j := NewJob("dev", id, n)
	j.ClaimedBy, j.ClaimExpiresAt = owner, until
	return j
}

// claim is ClaimJobs that fails t on an error and returns the jobs' ids.
func claim(t *testing.T, s store.Store, owner string, now, until time.Time, limit int) []string {
	t.Helper()
	jobs, err := s.ClaimJobs(ctx(t), owner, now, until, limit)
	if err != nil {
		t.Fatalf("ClaimJobs(%s): %v", owner, err)
	}
	for _, j := range jobs {
		if j.ClaimedBy != owner || !j.ClaimExpiresAt.Equal(until) {
			t.Fatalf("ClaimJobs(%s) returned %s claimed by %q until %v, want until %v", owner, j.ID, j.ClaimedBy, j.ClaimExpiresAt, until)
		}
	}
	return ids(jobs)
}

// testClaimJobs: a claim takes the unfinished jobs without a claim or
// whose claim has expired, oldest first, up to the limit, and leaves the
// job otherwise as it was (Version and UpdatedAt included); held claims
// and ended jobs are never taken.
func testClaimJobs(t *testing.T, open Opener) {
	s := open(t)
	now := base.Add(time.Hour)
	createAll(t, s,
		NewJob("dev", "j0", 0),
		claimed("j1", 1, "old", now.Add(-time.Second)),
		claimed("j2", 2, "other", now.Add(time.Second)),
		claimed("j3", 3, "old", now), // expires at now: expired
		NewJob("dev", "j4", 4),
		placed("dev", "done", "", store.StateFinished, 0),
		placed("dev", "failed", "", store.StateFailed, 0),
		placed("dev", "cancelled", "", store.StateCancelled, 0),
	)
	if j, err := s.GetJob(ctx(t), "j2"); err != nil || j.ClaimedBy != "other" || !j.ClaimExpiresAt.Equal(now.Add(time.Second)) {
		t.Fatalf("CreateJob did not keep the claim: %+v, %v", j, err)
	}
	before, err := s.GetJob(ctx(t), "j1")
	if err != nil {
		t.Fatal(err)
	}
	until := now.Add(30*time.Second + 700*time.Nanosecond).Truncate(time.Microsecond)
	if got := claim(t, s, "r1", now, until, 3); !slices.Equal(got, []string{"j0", "j1", "j3"}) {
		t.Fatalf("first claim took %v, want j0 j1 j3", got)
	}
	after, err := s.GetJob(ctx(t), "j1")
	if err != nil {
		t.Fatal(err)
	}
	if after.ClaimedBy != "r1" || !after.ClaimExpiresAt.Equal(until) {
		t.Fatalf("j1 after the claim: claimed by %q until %v", after.ClaimedBy, after.ClaimExpiresAt)
	}
	after.ClaimedBy, after.ClaimExpiresAt = before.ClaimedBy, before.ClaimExpiresAt
	if err := equalJobs(after, before); err != nil {
		t.Fatalf("a claim changed the job: %v", err)
	}
	if got := claim(t, s, "r1", now, until, 10); !slices.Equal(got, []string{"j4"}) {
		t.Fatalf("second claim took %v, want j4", got)
	}
	if got := claim(t, s, "r2", now, until, 10); len(got) != 0 {
		t.Fatalf("claim of held jobs took %v", got)
	}
	// Past r1's claims and other's: everything unfinished, ended jobs never.
	later := until.Add(time.Second)
	if got := claim(t, s, "r2", later, later.Add(time.Minute), 10); !slices.Equal(got, []string{"j0", "j1", "j2", "j3", "j4"}) {
		t.Fatalf("claim after expiry took %v, want j0..j4", got)
	}
	for _, id := range []string{"done", "failed", "cancelled"} {
		if j, err := s.GetJob(ctx(t), id); err != nil || j.ClaimedBy != "" || !j.ClaimExpiresAt.IsZero() {
			t.Fatalf("ended job %s was claimed: %+v, %v", id, j, err)
		}
	}
	for _, bad := range []struct {
		owner      string
		now, until time.Time
		limit      int
	}{{"", now, until, 1}, {"r1", now, until, 0}, {"r1", now, now, 1}} {
		if _, err := s.ClaimJobs(ctx(t), bad.owner, bad.now, bad.until, bad.limit); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ClaimJobs(%q, limit %d, until-now %v) = %v, want ErrInvalidArgument", bad.owner, bad.limit, bad.until.Sub(bad.now), err)
		}
	}
}

// testClaimRace: many claimers on two stores at once, each its own
// owner, share out 300 jobs so that each is taken exactly once and held by
// the one it was returned to.
func testClaimRace(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t)}
	const jobs, claimers = 300, 8
	for i := range jobs {
		mustCreate(t, stores[i%2], NewJob("dev", fmt.Sprintf("j%03d", i), i))
	}
	now := base.Add(time.Hour)
	got := make([][]string, claimers)
	onStores(claimers, stores, func(c int, s store.Store) {
		for {
			list, err := s.ClaimJobs(ctx(t), fmt.Sprint("r", c), now, now.Add(time.Hour), 7)
			if err != nil {
				t.Error(err)
				return
			}
			if len(list) == 0 {
				return
			}
			got[c] = append(got[c], ids(list)...)
		}
	})
	owner := map[string]string{}
	for c, list := range got {
		for _, id := range list {
			if prev, ok := owner[id]; ok {
				t.Fatalf("job %s was claimed by %s and r%d", id, prev, c)
			}
			owner[id] = fmt.Sprint("r", c)
		}
	}
	if len(owner) != jobs {
		t.Fatalf("%d of %d jobs were claimed", len(owner), jobs)
	}
	for id, o := range owner {
		if j, err := stores[0].GetJob(ctx(t), id); err != nil || j.ClaimedBy != o {
			t.Fatalf("job %s is held by %q, but was returned to %s (%v)", id, j.ClaimedBy, o, err)
		}
	}
}

// testRenewClaims: a renewal extends the claims its owner still holds on
// unfinished jobs and names them; a job another took, or that ended, is
// left out and left alone.
func testRenewClaims(t *testing.T, open Opener) {
	s := open(t)
	now := base.Add(time.Hour)
	soon, later := now.Add(10*time.Second), now.Add(time.Hour)
	createAll(t, s,
		claimed("held", 0, "r1", later),
		claimed("ended", 1, "r1", later),
		claimed("taken", 2, "r1", soon),
		claimed("also", 3, "r1", soon),
		claimed("others", 4, "r2", later),
	)
	if _, err := s.UpdateJob(ctx(t), "ended", func(j *store.Job) error { j.State = store.StateFinished; return nil }); err != nil {
		t.Fatal(err)
	}
	// r2 takes "taken" once r1's claim on it has expired; "also" expired
	// too but nobody took it, so r1 still holds it.
	if got := claim(t, s, "r2", soon.Add(time.Second), later, 1); !slices.Equal(got, []string{"taken"}) {
		t.Fatalf("r2 took %v, want taken", got)
	}
	renewed := later.Add(time.Minute)
	got, err := s.RenewClaims(ctx(t), "r1", renewed)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(got); !slices.Equal(got, []string{"also", "held"}) {
		t.Fatalf("RenewClaims(r1) = %v, want also held", got)
	}
	for _, c := range []struct {
		id, owner string
		until     time.Time
	}{{"held", "r1", renewed}, {"also", "r1", renewed}, {"ended", "r1", later}, {"taken", "r2", later}, {"others", "r2", later}} {
		if j, err := s.GetJob(ctx(t), c.id); err != nil || j.ClaimedBy != c.owner || !j.ClaimExpiresAt.Equal(c.until) {
			t.Errorf("%s after the renewal: claimed by %q until %v (%v), want %s until %v", c.id, j.ClaimedBy, j.ClaimExpiresAt, err, c.owner, c.until)
		}
	}
	if got, err := s.RenewClaims(ctx(t), "nobody", renewed); err != nil || len(got) != 0 {
		t.Fatalf("RenewClaims of an owner without claims = %v, %v", got, err)
	}
}

// testReleaseClaims: released jobs are claimed by no one, so another
// replica takes them up at once and the releasing one cannot renew them;
// others' claims and ended jobs stay as they were.
func testReleaseClaims(t *testing.T, open Opener) {
	a, b := open(t), open(t)
	now := base.Add(time.Hour)
	later := now.Add(time.Hour)
	createAll(t, a,
		claimed("j0", 0, "r1", later),
		claimed("j1", 1, "r1", later),
		claimed("j2", 2, "r2", later),
		claimed("ended", 3, "r1", later),
	)
	if _, err := a.UpdateJob(ctx(t), "ended", func(j *store.Job) error { j.State = store.StateCancelled; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, b, "r3", now, later, 10); len(got) != 0 {
		t.Fatalf("r3 took held jobs %v", got)
	}
	if err := a.ReleaseClaims(ctx(t), "r1"); err != nil {
		t.Fatal(err)
	}
	if got, err := a.RenewClaims(ctx(t), "r1", later); err != nil || len(got) != 0 {
		t.Fatalf("RenewClaims after ReleaseClaims = %v, %v", got, err)
	}
	if got := claim(t, b, "r3", now, later, 10); !slices.Equal(got, []string{"j0", "j1"}) {
		t.Fatalf("r3 took %v after the release, want j0 j1", got)
	}
	for _, c := range []struct{ id, owner string }{{"j2", "r2"}, {"ended", "r1"}} {
		if j, err := b.GetJob(ctx(t), c.id); err != nil || j.ClaimedBy != c.owner || !j.ClaimExpiresAt.Equal(later) {
			t.Errorf("%s after r1's release: claimed by %q until %v (%v)", c.id, j.ClaimedBy, j.ClaimExpiresAt, err)
		}
	}
}

// testUpdateKeepsClaims: UpdateJob and UpdateJobAudited write neither
// claim field, whatever the update does to them, and return the stored
// claim.
func testUpdateKeepsClaims(t *testing.T, open Opener) {
	s := open(t)
	until := base.Add(time.Hour)
	mustCreate(t, s, claimed("j1", 0, "r1", until))
	got, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
		j.State, j.ClaimedBy, j.ClaimExpiresAt = store.StateStaging, "r2", time.Time{}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.StateStaging || got.Version != 2 || got.ClaimedBy != "r1" || !got.ClaimExpiresAt.Equal(until) {
		t.Fatalf("UpdateJob returned %s version %d claimed by %q until %v", got.State, got.Version, got.ClaimedBy, got.ClaimExpiresAt)
	}
	got, err = s.UpdateJobAudited(ctx(t), "j1", func(j *store.Job) (audit.Event, error) {
		j.State, j.ClaimedBy, j.ClaimExpiresAt = store.StateRunning, "", until.Add(time.Hour)
		return audit.Event{Kind: "job.started"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s.GetJob(ctx(t), "j1")
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []store.Job{got, stored} {
		if j.State != store.StateRunning || j.Version != 3 || j.ClaimedBy != "r1" || !j.ClaimExpiresAt.Equal(until) {
			t.Fatalf("after UpdateJobAudited: %s version %d claimed by %q until %v", j.State, j.Version, j.ClaimedBy, j.ClaimExpiresAt)
		}
	}
}

// testExecutorAuditFailedWrite plants a row at the audit log's next
// sequence, so that the executor update's audit write fails in the
// database after the executor row was written: neither may stay.
func testExecutorAuditFailedWrite(t *testing.T, b Backend) {
	open, exec := b.New(t)
	s := open(t)
	mustExec(t, exec, `INSERT INTO audit_log (seq, occurred_at, kind, caller, subject, tenant, job_id, outcome, reason, prev_hash, hash)
		VALUES (1, 0, 'planted', '', '', '', '', '', '', '', '')`)
	if _, err := s.UpdateExecutorAudited(ctx(t), "e1", set(NewExecutor("e1", 0), executorEvent(audit.KindExecutorJoined, "e1"))); err == nil {
		t.Fatal("UpdateExecutorAudited succeeded over a conflicting audit row")
	}
	if _, err := s.GetExecutor(ctx(t), "e1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the executor outlived its failed audit entry: %v", err)
	}
	// Without an event the same update goes through.
	if e, err := s.UpdateExecutorAudited(ctx(t), "e1", set(NewExecutor("e1", 0), nil)); err != nil || e.Version != 1 {
		t.Fatalf("UpdateExecutorAudited without an event: %+v, %v", e, err)
	}
}
