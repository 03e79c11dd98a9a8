package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The brokered leases' tests: one active lease per job, purpose and
// resource, and the revocations of leases whose job ended or whose holder
// restarted.
var leaseTests = []conformance{
	{"LeaseOneActivePerResource", testLeaseOnePerResource},
	{"RevokeLeasesOfEndedJobs", testRevokeLeasesOfEndedJobs},
	{"RevokeLeasesOfHolder", testRevokeLeasesOfHolder},
}

const (
	executorA = "spiffe://airlock.test/service/executor/a"
	executorB = "spiffe://airlock.test/service/executor/b"
)

// mustLease records a brokered lease of credential name for job, held by
// holder, issued at base+n seconds for an hour.
func mustLease(t *testing.T, s store.Store, id, job, name, holder string, n int) store.Lease {
	t.Helper()
	at := base.Add(time.Duration(n) * time.Second)
	l, err := s.CreateLeaseAudited(ctx(t), store.Lease{ID: id, Purpose: "brokered", JobID: job, Resource: name, Holder: holder,
		IssuedAt: at, ExpiresAt: at.Add(time.Hour)}, audit.Event{Kind: audit.KindLeaseIssued, Subject: id})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// active is the ids of s's active leases at at, oldest first.
func active(t *testing.T, s store.Store, at time.Time) []string {
	t.Helper()
	list, _, err := s.ListLeases(ctx(t), store.LeaseFilter{ActiveAt: at, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := len(list) - 1; i >= 0; i-- {
		ids = append(ids, list[i].ID)
	}
	return ids
}

// testLeaseOnePerResource: a job's leases of two resources are both
// active; a second lease of one resource replaces the first of it only.
func testLeaseOnePerResource(t *testing.T, open Opener) {
	s := open(t)
	mustLease(t, s, "b1", "j1", "github", executorA, 0)
	mustLease(t, s, "b2", "j1", "npm", executorA, 1)
	mustLease(t, s, "b3", "j1", "github", executorA, 2)
	if got := fmt.Sprint(active(t, s, base.Add(time.Minute))); got != "[b2 b3]" {
		t.Fatalf("active = %s, want [b2 b3]", got)
	}
	if l, _ := s.GetLease(ctx(t), "b1"); l.RevokeReason != "replaced by lease b3" {
		t.Fatalf("b1 = %+v, want replaced by b3", l)
	}
}

func revokedFor(reason string) func(store.Lease, store.State) audit.Event {
	return func(l store.Lease, st store.State) audit.Event {
		return audit.Event{Kind: audit.KindLeaseRevoked, Subject: l.ID, Outcome: "allowed", Reason: fmt.Sprintf(reason, l.JobID, st)}
	}
}

// testRevokeLeasesOfEndedJobs: the active brokered leases of ended jobs
// end, each on the log with the job's state in its reason; those of
// running jobs, of other purposes, and already ended ones stay as they are.
func testRevokeLeasesOfEndedJobs(t *testing.T, open Opener) {
	s := open(t)
	for i, id := range []string{"j-run", "j-done", "j-failed"} {
		mustCreate(t, s, NewJob("dev", id, i))
	}
	for id, st := range map[string]store.State{"j-done": store.StateFinished, "j-failed": store.StateFailed} {
		if _, err := s.UpdateJob(ctx(t), id, func(j *store.Job) error { j.State = st; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	mustLease(t, s, "run", "j-run", "github", executorA, 0)
	mustLease(t, s, "done1", "j-done", "github", executorA, 1)
	mustLease(t, s, "done2", "j-done", "npm", executorA, 2)
	mustLease(t, s, "failed", "j-failed", "github", executorB, 3)
	if _, err := s.CreateLeaseAudited(ctx(t), store.Lease{ID: "deploy", Purpose: "deploy", JobID: "j-done", Resource: "demo",
		Holder: "spiffe://airlock.test/service/publisher", IssuedAt: base, ExpiresAt: base.Add(time.Hour)},
		audit.Event{Kind: audit.KindLeaseIssued, Subject: "deploy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeLeaseAudited(ctx(t), "done2", base.Add(5*time.Second), "by hand", audit.Event{Kind: audit.KindLeaseRevoked, Subject: "done2"}); err != nil {
		t.Fatal(err)
	}
	at := base.Add(time.Minute)
	r := store.LeaseRevocation{Purpose: "brokered", At: at, JobEnded: true}
	got, err := s.RevokeLeasesAudited(ctx(t), r, 1, revokedFor("job %s ended (%s)"))
	if err != nil || len(got) != 1 || got[0].ID != "done1" || got[0].RevokeReason != "job j-done ended (finished)" || !got[0].RevokedAt.Equal(at) {
		t.Fatalf("first of a batch of 1 = %+v, %v; want done1", got, err)
	}
	got, err = s.RevokeLeasesAudited(ctx(t), r, 10, revokedFor("job %s ended (%s)"))
	if err != nil || len(got) != 1 || got[0].ID != "failed" || got[0].RevokeReason != "job j-failed ended (failed)" {
		t.Fatalf("the rest = %+v, %v; want failed", got, err)
	}
	if l, _ := s.GetLease(ctx(t), "done1"); l.RevokeReason != "job j-done ended (finished)" || !l.RevokedAt.Equal(at) {
		t.Fatalf("done1 as stored = %+v", l)
	}
	if got := fmt.Sprint(active(t, s, at)); got != "[deploy run]" {
		t.Fatalf("active = %s, want [deploy run]", got)
	}
	if again, err := s.RevokeLeasesAudited(ctx(t), r, 10, revokedFor("job %s ended (%s)")); err != nil || len(again) != 0 {
		t.Fatalf("again = %+v, %v", again, err)
	}
	if n := countKind(t, s, "lease.revoked"); n != 3 {
		t.Fatalf("%d lease.revoked events, want 3 (one by hand, two ended)", n)
	}
	for _, bad := range []store.LeaseRevocation{{At: at, JobEnded: true}, {Purpose: "brokered", JobEnded: true}} {
		if _, err := s.RevokeLeasesAudited(ctx(t), bad, 10, revokedFor("%s%s")); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("RevokeLeasesAudited(%+v) = %v; want invalid", bad, err)
		}
	}
	if _, err := s.RevokeLeasesAudited(ctx(t), r, 0, revokedFor("%s%s")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("limit 0 = %v; want invalid", err)
	}
}

// testRevokeLeasesOfHolder: an executor's brokered leases issued before a
// time end; another executor's, later ones and expired ones stay.
func testRevokeLeasesOfHolder(t *testing.T, open Opener) {
	s := open(t)
	mustLease(t, s, "a-old", "j1", "github", executorA, 0)
	mustLease(t, s, "a-old2", "j2", "github", executorA, 1)
	mustLease(t, s, "b-old", "j3", "github", executorB, 2)
	mustLease(t, s, "a-new", "j1", "npm", executorA, 20)
	at := base.Add(30 * time.Second)
	r := store.LeaseRevocation{Purpose: "brokered", At: at, Holder: executorA, IssuedBefore: base.Add(10 * time.Second)}
	got, err := s.RevokeLeasesAudited(ctx(t), r, 10, revokedFor("%s %s: executor a restarted"))
	if err != nil || len(got) != 2 || got[0].ID != "a-old" || got[1].ID != "a-old2" || got[0].RevokeReason != "j1 : executor a restarted" {
		t.Fatalf("revoked = %+v, %v; want a-old and a-old2 (no job record: state \"\")", got, err)
	}
	if got := fmt.Sprint(active(t, s, at)); got != "[b-old a-new]" {
		t.Fatalf("active = %s, want [b-old a-new]", got)
	}
	// Leases past their expiry are the expiry sweep's.
	if got, err := s.RevokeLeasesAudited(ctx(t), store.LeaseRevocation{Purpose: "brokered", At: base.Add(2 * time.Hour)}, 10, revokedFor("%s%s")); err != nil || len(got) != 0 {
		t.Fatalf("expired ones = %+v, %v; want none", got, err)
	}
}
