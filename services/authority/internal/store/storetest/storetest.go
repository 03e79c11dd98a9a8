// Package storetest is the conformance suite every implementation of the
// authority's store.Store must pass: the SQLite and the PostgreSQL store.
// It also holds the crash test both run (crash.go). Only the
// implementations' tests import it.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Opener opens the same, initially empty, database every time it is
// called, so the suite can close a store and open it again as a restarted
// authority would, or open two at once as two replicas would.
type Opener func(t *testing.T) store.Store

// Exec runs SQL directly on an Opener's database, not through a store, as
// an operator or an intruder with access to the database could.
type Exec func(query string) error

// Backend is what the suite needs of an implementation.
type Backend struct {
	// New returns an Opener for a fresh, empty database and an Exec on the
	// same database.
	New func(t *testing.T) (Opener, Exec)
	// DropAuditGuards is the SQL that lifts the schema's refusal to update
	// or delete audit entries, run before the suite tampers with the log.
	DropAuditGuards string
}

// conformance is one test of the suite, run on a fresh database.
type conformance struct {
	name string
	fn   func(t *testing.T, open Opener)
}

// Run runs every conformance test, each on a fresh database.
func Run(t *testing.T, b Backend) {
	for _, tc := range []conformance{
		{"CreateAndGet", testCreateAndGet},
		{"GetUnknown", testGetUnknown},
		{"IdempotencyKeyIsUniquePerTenant", testIdempotency},
		{"ConcurrentCreateSameKey", testConcurrentCreate},
		{"UpdateTransitions", testUpdate},
		{"UpdateErrorWritesNothing", testUpdateError},
		{"UpdateKeepsIdentity", testUpdateKeepsIdentity},
		{"ConcurrentUpdatesSerialize", testConcurrentUpdates},
		{"ConcurrentUpdatesAcrossStores", testConcurrentUpdatesAcrossStores},
		{"ListNewestFirstWithPages", testList},
		{"ListFiltersStates", testListStates},
		{"ListBadToken", testListBadToken},
		{"JobsInStates", testJobsInStates},
		{"SurvivesRestart", testRestart},
		{"AuditAppendAssigns", testAuditAppend},
		{"AuditRefusesInvalidEvents", testAuditInvalid},
		{"AuditConcurrentAppendsAcrossStores", testAuditConcurrent},
		{"AuditListFilters", testAuditList},
		{"AuditSurvivesRestart", testAuditRestart},
		{"CreateJobAudited", testCreateJobAudited},
		{"UpdateJobAudited", testUpdateJobAudited},
		{"UpdateJobAuditedFailuresWriteNeither", testUpdateJobAuditedFailures},
		{"ConcurrentAuditedUpdates", testConcurrentAuditedUpdates},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open, _ := b.New(t)
			tc.fn(t, open)
		})
	}
	for _, tc := range slices.Concat(approvalTests, leaseTests, execTests, fleetTests, usageTests, forwardTests) {
		t.Run(tc.name, func(t *testing.T) {
			open, _ := b.New(t)
			tc.fn(t, open)
		})
	}
	// These reach past the store into the database.
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, b Backend)
	}{
		{"AuditFailedWriteRollsBackJob", testAuditFailedWrite},
		{"AuditLogIsAppendOnly", testAuditGuards},
		{"AuditTamperDetected", testAuditTamper},
		{"ExecutorAuditFailedWriteRollsBack", testExecutorAuditFailedWrite},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b) })
	}
}

var base = time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)

// NewJob returns a queued job with every field set, created at base+n seconds.
func NewJob(tenant, id string, n int) store.Job {
	at := base.Add(time.Duration(n) * time.Second)
	return store.Job{
		ID: id, Tenant: tenant, Requester: "spiffe://airlock.test/client/dev", IdempotencyKey: "key-" + id,
		Repository: "demo", Spec: []byte("spec-" + id), SpecDigest: "sha256:" + id,
		Commit: "0123456789abcdef0123456789abcdef01234567", TreeHash: "89abcdef0123456789abcdef0123456789abcdef",
		State: store.StateQueued, Message: "", NetworkState: "pending",
		Grant: []byte("grant-" + id), GrantExpiresAt: at.Add(10 * time.Minute),
		CreatedAt: at, UpdatedAt: at,
	}
}

func ctx(t *testing.T) context.Context { return t.Context() }

func mustCreate(t *testing.T, s store.Store, j store.Job) store.Job {
	t.Helper()
	got, created, err := s.CreateJob(ctx(t), j)
	if err != nil || !created {
		t.Fatalf("CreateJob(%s) = created %v, %v", j.ID, created, err)
	}
	return got
}

func equalJobs(a, b store.Job) error {
	type field struct {
		name string
		x, y any
	}
	for _, f := range []field{
		{"ID", a.ID, b.ID}, {"Tenant", a.Tenant, b.Tenant}, {"Requester", a.Requester, b.Requester},
		{"IdempotencyKey", a.IdempotencyKey, b.IdempotencyKey}, {"Repository", a.Repository, b.Repository},
		{"SpecDigest", a.SpecDigest, b.SpecDigest}, {"Commit", a.Commit, b.Commit}, {"TreeHash", a.TreeHash, b.TreeHash},
		{"State", a.State, b.State}, {"Message", a.Message, b.Message}, {"NetworkState", a.NetworkState, b.NetworkState},
		{"BundleDigest", a.BundleDigest, b.BundleDigest}, {"Version", a.Version, b.Version},
		{"Executor", a.Executor, b.Executor}, {"ClaimedBy", a.ClaimedBy, b.ClaimedBy},
	} {
		if f.x != f.y {
			return fmt.Errorf("%s: %v != %v", f.name, f.x, f.y)
		}
	}
	for _, f := range []struct {
		name string
		x, y []byte
	}{{"Spec", a.Spec, b.Spec}, {"Grant", a.Grant, b.Grant}, {"Result", a.Result, b.Result}, {"Patch", a.Patch, b.Patch},
		{"Review", a.Review, b.Review}, {"Provenance", a.Provenance, b.Provenance}} {
		if !bytes.Equal(f.x, f.y) {
			return fmt.Errorf("%s: %q != %q", f.name, f.x, f.y)
		}
	}
	for _, f := range []struct {
		name string
		x, y time.Time
	}{{"GrantExpiresAt", a.GrantExpiresAt, b.GrantExpiresAt}, {"DispatchedAt", a.DispatchedAt, b.DispatchedAt},
		{"CreatedAt", a.CreatedAt, b.CreatedAt}, {"UpdatedAt", a.UpdatedAt, b.UpdatedAt},
		{"ClaimExpiresAt", a.ClaimExpiresAt, b.ClaimExpiresAt}} {
		if !f.x.Equal(f.y) {
			return fmt.Errorf("%s: %v != %v", f.name, f.x, f.y)
		}
	}
	return nil
}

func testCreateAndGet(t *testing.T, open Opener) {
	s := open(t)
	want := NewJob("dev", "j1", 0)
	got := mustCreate(t, s, want)
	want.Version = 1
	if err := equalJobs(got, want); err != nil {
		t.Fatalf("CreateJob returned a different job: %v", err)
	}
	read, err := s.GetJob(ctx(t), "j1")
	if err != nil {
		t.Fatal(err)
	}
	if err := equalJobs(read, want); err != nil {
		t.Fatalf("GetJob: %v", err)
	}
}

func testGetUnknown(t *testing.T, open Opener) {
	s := open(t)
	if _, err := s.GetJob(ctx(t), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetJob(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.UpdateJob(ctx(t), "nope", func(*store.Job) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("UpdateJob(unknown) = %v, want ErrNotFound", err)
	}
}

func testIdempotency(t *testing.T, open Opener) {
	s := open(t)
	first := mustCreate(t, s, NewJob("dev", "j1", 0))
	again := NewJob("dev", "j2", 1)
	again.IdempotencyKey = first.IdempotencyKey
	got, created, err := s.CreateJob(ctx(t), again)
	if err != nil || created {
		t.Fatalf("same tenant and key: created=%v err=%v, want the existing job", created, err)
	}
	if got.ID != "j1" {
		t.Fatalf("same key returned job %s, want j1", got.ID)
	}
	if _, err := s.GetJob(ctx(t), "j2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the duplicate was stored too: %v", err)
	}
	if got, err := s.JobByIdempotencyKey(ctx(t), "dev", first.IdempotencyKey); err != nil || got.ID != "j1" {
		t.Fatalf("JobByIdempotencyKey = %s, %v; want j1", got.ID, err)
	}
	if _, err := s.JobByIdempotencyKey(ctx(t), "other", first.IdempotencyKey); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("JobByIdempotencyKey in another tenant = %v, want ErrNotFound", err)
	}
	other := NewJob("other", "j3", 2)
	other.IdempotencyKey = first.IdempotencyKey
	mustCreate(t, s, other) // another tenant may use the same key
}

func testConcurrentCreate(t *testing.T, open Opener) {
	s := open(t)
	const n = 8
	var wg sync.WaitGroup
	ids := make([]string, n)
	createdCount := make([]bool, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := NewJob("dev", fmt.Sprintf("c%d", i), i)
			j.IdempotencyKey = "same"
			got, created, err := s.CreateJob(ctx(t), j)
			ids[i], createdCount[i], errs[i] = got.ID, created, err
		}()
	}
	wg.Wait()
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if createdCount[i] {
			winners++
		}
		if ids[i] != ids[0] {
			t.Fatalf("callers saw different jobs for one key: %v", ids)
		}
	}
	if winners != 1 {
		t.Fatalf("%d creations for one key, want 1", winners)
	}
}

func testUpdate(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	later := base.Add(time.Minute)
	steps := []func(j *store.Job){
		func(j *store.Job) { j.DispatchedAt = later },
		func(j *store.Job) { j.State = store.StateStaging },
		func(j *store.Job) { j.State, j.NetworkState = store.StateRunning, "applied" },
		func(j *store.Job) {
			j.State, j.Message = store.StateFinished, "exited with status 0"
			j.Result, j.BundleDigest = []byte("result"), "sha256:abc"
			j.Patch, j.Review, j.Provenance = []byte("patch"), []byte("review"), []byte("dsse")
		},
	}
	for i, step := range steps {
		got, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
			step(j)
			j.UpdatedAt = later.Add(time.Duration(i) * time.Second)
			return nil
		})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got.Version != int64(i+2) {
			t.Fatalf("step %d: version %d, want %d", i, got.Version, i+2)
		}
	}
	got, err := s.GetJob(ctx(t), "j1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.StateFinished || got.Message != "exited with status 0" || got.NetworkState != "applied" ||
		string(got.Result) != "result" || got.BundleDigest != "sha256:abc" || string(got.Patch) != "patch" ||
		string(got.Review) != "review" || string(got.Provenance) != "dsse" || !got.DispatchedAt.Equal(later) ||
		!got.UpdatedAt.Equal(later.Add(3*time.Second)) || !got.CreatedAt.Equal(base) {
		t.Fatalf("after updates: %+v", got)
	}
}

func testUpdateError(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	refusal := fmt.Errorf("%w: no", errdefs.ErrFailedPrecondition)
	_, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
		j.State = store.StateFailed
		return refusal
	})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("UpdateJob returned %v, want the update's own error", err)
	}
	got, _ := s.GetJob(ctx(t), "j1")
	if got.State != store.StateQueued || got.Version != 1 {
		t.Fatalf("a refused update was written: %+v", got)
	}
}

func testUpdateKeepsIdentity(t *testing.T, open Opener) {
	s := open(t)
	orig := mustCreate(t, s, NewJob("dev", "j1", 0))
	_, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
		j.Tenant, j.Requester, j.IdempotencyKey, j.Repository = "evil", "x", "y", "z"
		j.Spec, j.SpecDigest, j.CreatedAt = []byte("other"), "sha256:other", base.Add(time.Hour)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetJob(ctx(t), "j1")
	orig.Version = 2
	if err := equalJobs(got, orig); err != nil {
		t.Fatalf("identity fields changed: %v", err)
	}
}

func testConcurrentUpdates(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	const n = 16
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
				j.Message += "x"
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, _ := s.GetJob(ctx(t), "j1")
	if len(got.Message) != n || got.Version != n+1 {
		t.Fatalf("lost updates: message %q, version %d", got.Message, got.Version)
	}
}

func testConcurrentUpdatesAcrossStores(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t)}
	mustCreate(t, stores[0], NewJob("dev", "j1", 0))
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := stores[i%2].UpdateJob(ctx(t), "j1", func(j *store.Job) error {
				j.Message += "x"
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, _ := stores[1].GetJob(ctx(t), "j1")
	if len(got.Message) != n || got.Version != n+1 {
		t.Fatalf("lost updates between two stores: message %q, version %d", got.Message, got.Version)
	}
}

func testList(t *testing.T, open Opener) {
	s := open(t)
	for i := range 5 {
		mustCreate(t, s, NewJob("dev", fmt.Sprintf("j%d", i), i))
	}
	// Same creation time: the id breaks the tie, so pages never skip one.
	tie := NewJob("dev", "j9", 4)
	mustCreate(t, s, tie)
	mustCreate(t, s, NewJob("other", "o1", 10))

	var seen []string
	token := ""
	for page := 0; ; page++ {
		jobs, next, err := s.ListJobs(ctx(t), store.ListOptions{Tenant: "dev", Limit: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			seen = append(seen, j.ID)
		}
		if next == "" {
			break
		}
		if page > 5 {
			t.Fatal("pagination does not end")
		}
		token = next
	}
	want := []string{"j9", "j4", "j3", "j2", "j1", "j0"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("listed %v, want %v", seen, want)
	}
}

func testListStates(t *testing.T, open Opener) {
	s := open(t)
	for i, st := range []store.State{store.StateQueued, store.StateRunning, store.StateFinished, store.StateFailed} {
		j := NewJob("dev", fmt.Sprintf("j%d", i), i)
		j.State = st
		mustCreate(t, s, j)
	}
	jobs, next, err := s.ListJobs(ctx(t), store.ListOptions{Tenant: "dev", Limit: 10, States: []store.State{store.StateFinished, store.StateQueued}})
	if err != nil || next != "" {
		t.Fatalf("list: next=%q err=%v", next, err)
	}
	if len(jobs) != 2 || jobs[0].ID != "j2" || jobs[1].ID != "j0" {
		t.Fatalf("filtered list = %v", jobs)
	}
}

func testListBadToken(t *testing.T, open Opener) {
	s := open(t)
	if _, _, err := s.ListJobs(ctx(t), store.ListOptions{Tenant: "dev", Limit: 10, PageToken: "garbage!"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad token: %v, want ErrInvalidArgument", err)
	}
}

func testJobsInStates(t *testing.T, open Opener) {
	s := open(t)
	for i, st := range []store.State{store.StateRunning, store.StateQueued, store.StateFinished, store.StateStaging} {
		j := NewJob("dev", fmt.Sprintf("j%d", i), i)
		j.State = st
		mustCreate(t, s, j)
	}
	jobs, err := s.JobsInStates(ctx(t), store.StateQueued, store.StateStaging, store.StateRunning)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID)
	}
	if fmt.Sprint(ids) != "[j0 j1 j3]" {
		t.Fatalf("JobsInStates = %v, want oldest first [j0 j1 j3]", ids)
	}
}

func testRestart(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	updated, err := s.UpdateJob(ctx(t), "j1", func(j *store.Job) error {
		j.State, j.UpdatedAt, j.DispatchedAt = store.StateRunning, base.Add(time.Minute), base.Add(time.Minute)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t)
	got, err := s.GetJob(ctx(t), "j1")
	if err != nil {
		t.Fatalf("after reopening: %v", err)
	}
	if err := equalJobs(got, updated); err != nil {
		t.Fatalf("after reopening: %v", err)
	}
	if _, created, err := s.CreateJob(ctx(t), NewJob("dev", "j1-again", 1)); err != nil || !created {
		t.Fatalf("create after reopening: %v", err)
	}
	again := NewJob("dev", "j2", 2)
	again.IdempotencyKey = "key-j1"
	if got, created, err := s.CreateJob(ctx(t), again); err != nil || created || got.ID != "j1" {
		t.Fatalf("idempotency key forgotten across a restart: created=%v id=%s err=%v", created, got.ID, err)
	}
}
