package storetest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// NewChange returns a pending change request for job jobID, created at
// base+n seconds, expiring an hour later, needing one vote.
func NewChange(tenant, id, jobID string, n int) store.Approval {
	a := NewApproval(tenant, id, jobID, n)
	a.Kind, a.Change, a.TargetRepo, a.TargetBranch = store.KindChange, []byte(`{"to":"`+id+`"}`), "", ""
	a.ExpiresAt = a.CreatedAt.Add(time.Hour)
	return a
}

func changeReq(a store.Approval, at time.Time) store.ConsumeRequest {
	return store.ConsumeRequest{Kind: store.KindChange, ID: a.ID, JobID: a.JobID, BundleDigest: a.BundleDigest,
		By: "spiffe://airlock.test/service/authority", At: at}
}

// setGrant is the job update a change applies: a new grant.
func setGrant(grant string) func(*store.Job) (audit.Event, error) {
	return func(j *store.Job) (audit.Event, error) {
		j.Grant = []byte(grant)
		return audit.Event{Kind: audit.KindJobChanged, Subject: j.ID, Outcome: "allowed"}, nil
	}
}

// testChangeKinds: a job has one publish request but any number of change
// requests, and each kind is listed, found and consumed only as itself.
func testChangeKinds(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	pub := mustApproval(t, s, NewApproval("dev", "p1", "j1", 0))
	c1 := mustApproval(t, s, NewChange("dev", "c1", "j1", 1))
	c2 := mustApproval(t, s, NewChange("dev", "c2", "j1", 2))
	if c1.Kind != store.KindChange || string(c1.Change) != `{"to":"c1"}` || pub.Kind != store.KindPublish || pub.Change != nil {
		t.Fatalf("stored kinds: publish %+v, change %+v", pub, c1)
	}
	if _, created, err := s.CreateApprovalAudited(ctx(t), NewApproval("dev", "p2", "j1", 3), audit.Event{Kind: audit.KindApprovalOpened}); err != nil || created {
		t.Fatalf("a second publish request for the job: created %v, %v", created, err)
	}
	if got, err := s.ApprovalForJob(ctx(t), "j1"); err != nil || got.ID != "p1" {
		t.Fatalf("ApprovalForJob = %s, %v; want the publish request p1", got.ID, err)
	}
	bad := NewChange("dev", "c3", "j1", 4)
	bad.Change = nil
	if _, _, err := s.CreateApprovalAudited(ctx(t), bad, audit.Event{Kind: audit.KindApprovalOpened}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a change request without its change = %v, want ErrInvalidArgument", err)
	}
	list, _, err := s.ListApprovals(ctx(t), store.ApprovalFilter{Kind: store.KindChange, Limit: 10})
	if err != nil || len(list) != 2 || list[0].ID != "c2" || list[1].ID != "c1" {
		t.Fatalf("change requests listed: %v, %v", list, err)
	}
	for _, id := range []string{"p1", "c1", "c2"} {
		if _, err := approve(s, t, id, "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
			t.Fatal(err)
		}
	}
	now := base.Add(time.Minute)
	// The publisher's consume never spends a change, nor the authority's
	// apply a publish request.
	r := consumeReq(c1, now)
	if _, err := s.ConsumeApprovalAudited(ctx(t), r, audit.Event{Kind: audit.KindApprovalConsumed}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("consuming a change request as a publish one = %v", err)
	}
	if _, _, err := s.ApplyChangeAudited(ctx(t), changeReq(pub, now), audit.Event{Kind: audit.KindApprovalConsumed}, setGrant("g")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("applying a publish request as a change = %v", err)
	}
	other := changeReq(c1, now)
	other.BundleDigest = c2.BundleDigest
	if _, _, err := s.ApplyChangeAudited(ctx(t), other, audit.Event{Kind: audit.KindApprovalConsumed}, setGrant("g")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("applying c1 with c2's digest = %v", err)
	}
	if j, _ := s.GetJob(ctx(t), "j1"); string(j.Grant) == "g" {
		t.Fatal("a refused apply changed the job")
	}
	a, j, err := s.ApplyChangeAudited(ctx(t), changeReq(c1, now), audit.Event{Kind: audit.KindApprovalConsumed, Subject: "c1"}, setGrant("g1"))
	if err != nil || a.State != store.ApprovalConsumed || string(j.Grant) != "g1" {
		t.Fatalf("apply c1 = %+v, job grant %q, %v", a, j.Grant, err)
	}
	if _, _, err := s.ApplyChangeAudited(ctx(t), changeReq(c1, now), audit.Event{Kind: audit.KindApprovalConsumed}, setGrant("g2")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("applying c1 twice = %v", err)
	}
	if n := countKind(t, s, "job.changed"); n != 1 {
		t.Fatalf("%d job.changed events, want 1", n)
	}
}

// testChangeApplyAtomic: when the job update refuses, the approval is not
// spent and nothing is logged; when the approval is not spendable, the job
// is not changed.
func testChangeApplyAtomic(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	c := mustApproval(t, s, NewChange("dev", "c1", "j1", 0))
	if _, err := approve(s, t, "c1", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	before := len(VerifyAudit(t, s))
	refusal := errors.New("the job moved on")
	_, _, err := s.ApplyChangeAudited(ctx(t), changeReq(c, base.Add(time.Minute)), audit.Event{Kind: audit.KindApprovalConsumed},
		func(j *store.Job) (audit.Event, error) { j.Grant = []byte("x"); return audit.Event{}, refusal })
	if !errors.Is(err, refusal) {
		t.Fatalf("apply with a refusing update = %v", err)
	}
	if got, _ := s.GetApproval(ctx(t), "c1"); got.State != store.ApprovalApproved {
		t.Fatalf("approval after a refused apply: %s, want approved (unspent)", got.State)
	}
	if n := len(VerifyAudit(t, s)); n != before {
		t.Fatalf("a refused apply logged %d events", n-before)
	}
	// An invalid event (no kind) rolls back the consume as well.
	_, _, err = s.ApplyChangeAudited(ctx(t), changeReq(c, base.Add(time.Minute)), audit.Event{Kind: audit.KindApprovalConsumed},
		func(j *store.Job) (audit.Event, error) { return audit.Event{}, nil })
	if err == nil {
		t.Fatal("apply with an invalid job event succeeded")
	}
	if got, _ := s.GetApproval(ctx(t), "c1"); got.State != store.ApprovalApproved {
		t.Fatalf("approval after a failed apply: %s, want approved", got.State)
	}
	// Expired: nothing changes.
	if _, _, err := s.ApplyChangeAudited(ctx(t), changeReq(c, c.ExpiresAt), audit.Event{Kind: audit.KindApprovalConsumed}, setGrant("late")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("applying an expired change = %v", err)
	}
	if j, _ := s.GetJob(ctx(t), "j1"); string(j.Grant) == "late" || string(j.Grant) == "x" {
		t.Fatalf("job grant %q after refused applies", j.Grant)
	}
}

// testChangeApplyRace: 50 appliers over two stores race on one approved
// change: exactly one changes the job.
func testChangeApplyRace(t *testing.T, open Opener) {
	s1, s2 := open(t), open(t)
	mustCreate(t, s1, NewJob("dev", "j1", 0))
	c := mustApproval(t, s1, NewChange("dev", "c1", "j1", 0))
	if _, err := approve(s1, t, "c1", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	raceOnce(t, 50, s1, s2, "appliers", func(s store.Store) error {
		_, _, err := s.ApplyChangeAudited(ctx(t), changeReq(c, base.Add(time.Minute)), audit.Event{Kind: audit.KindApprovalConsumed}, setGrant("g"))
		return err
	})
	if n := countKind(t, s1, "job.changed"); n != 1 {
		t.Fatalf("%d job.changed events, want 1", n)
	}
	if j, _ := s1.GetJob(ctx(t), "j1"); j.Version != 2 {
		t.Fatalf("job version %d after one applied change, want 2", j.Version)
	}
}

// testExpire rewrites expired approvals and leases once each, with their
// events, and leaves live, decided and consumed ones alone.
func testExpire(t *testing.T, open Opener) {
	s := open(t)
	early := NewApproval("dev", "a-early", "j1", 0) // expires base+24h
	late := NewApproval("dev", "a-late", "j2", 3600)
	gone := NewApproval("dev", "a-consumed", "j3", 0)
	for _, a := range []store.Approval{early, late, gone} {
		mustApproval(t, s, a)
	}
	if _, err := approve(s, t, "a-consumed", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ConsumeApprovalAudited(ctx(t), consumeReq(gone, base.Add(time.Hour)), audit.Event{Kind: audit.KindApprovalConsumed}); err != nil {
		t.Fatal(err)
	}
	// Two jobs' leases: one job's second lease would replace its first.
	for i, id := range []string{"l-old", "l-new"} {
		at := base.Add(time.Duration(i) * time.Hour)
		if _, err := s.CreateLeaseAudited(ctx(t), store.Lease{ID: id, Purpose: "deploy", JobID: "j3-" + id, Resource: "demo",
			Holder: "spiffe://airlock.test/service/publisher", IssuedAt: at, ExpiresAt: at.Add(5 * time.Minute)},
			audit.Event{Kind: audit.KindLeaseIssued, Subject: id}); err != nil {
			t.Fatal(err)
		}
	}
	now := base.Add(24*time.Hour + time.Minute)
	aev := func(a store.Approval) audit.Event {
		return audit.Event{Kind: audit.KindApprovalExpired, Subject: a.ID, Outcome: "allowed"}
	}
	lev := func(l store.Lease) audit.Event {
		return audit.Event{Kind: audit.KindLeaseExpired, Subject: l.ID, Outcome: "allowed"}
	}
	got, err := s.ExpireApprovalsAudited(ctx(t), now, 10, aev)
	if err != nil || len(got) != 1 || got[0].ID != "a-early" || got[0].State != store.ApprovalExpired {
		t.Fatalf("expire approvals = %+v, %v; want a-early only", got, err)
	}
	if again, err := s.ExpireApprovalsAudited(ctx(t), now, 10, aev); err != nil || len(again) != 0 {
		t.Fatalf("expire approvals again = %+v, %v", again, err)
	}
	if a, _ := s.GetApproval(ctx(t), "a-consumed"); a.State != store.ApprovalConsumed {
		t.Fatalf("a consumed approval became %s", a.State)
	}
	if a, _ := s.GetApproval(ctx(t), "a-late"); a.State != store.ApprovalPending {
		t.Fatalf("a live approval became %s", a.State)
	}
	ls, err := s.ExpireLeasesAudited(ctx(t), base.Add(30*time.Minute), 10, lev)
	if err != nil || len(ls) != 1 || ls[0].ID != "l-old" || !ls[0].RevokedAt.Equal(ls[0].ExpiresAt) || ls[0].RevokeReason != store.ExpiredReason {
		t.Fatalf("expire leases = %+v, %v; want l-old ended at its expiry", ls, err)
	}
	if again, err := s.ExpireLeasesAudited(ctx(t), base.Add(30*time.Minute), 10, lev); err != nil || len(again) != 0 {
		t.Fatalf("expire leases again = %+v, %v", again, err)
	}
	if _, err := s.ExpireApprovalsAudited(ctx(t), now, 0, aev); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("limit 0 = %v", err)
	}
	if n, m := countKind(t, s, "approval.expired"), countKind(t, s, "lease.expired"); n != 1 || m != 1 {
		t.Fatalf("%d approval.expired and %d lease.expired events, want 1 each", n, m)
	}
}

// raceOnce starts n goroutines at once, alternating between s1 and s2 (two
// stores on one database), each calling fn once, and fails the test unless
// exactly one succeeds and every other fails with ErrFailedPrecondition.
func raceOnce(t *testing.T, n int, s1, s2 store.Store, who string, fn func(store.Store) error) {
	t.Helper()
	var (
		wg       sync.WaitGroup
		won      atomic.Int32
		mu       sync.Mutex
		failures []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := s1
			if i%2 == 1 {
				s = s2
			}
			<-start
			switch err := fn(s); {
			case err == nil:
				won.Add(1)
			case !errors.Is(err, errdefs.ErrFailedPrecondition):
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d %s failed otherwise than by precondition: %v", len(failures), who, failures[0])
	}
	if w := won.Load(); w != 1 {
		t.Fatalf("%d of %d concurrent %s succeeded, want exactly 1", w, n, who)
	}
}

// testExpireChangesOfEndedJobs: change requests of a job that ended can no
// longer apply and are expired, once; a running job's are left alone.
func testExpireChangesOfEndedJobs(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j-run", 0))
	mustCreate(t, s, NewJob("dev", "j-end", 1))
	if _, err := s.UpdateJob(ctx(t), "j-end", func(j *store.Job) error { j.State = store.StateFinished; return nil }); err != nil {
		t.Fatal(err)
	}
	mustApproval(t, s, NewChange("dev", "c-run", "j-run", 0))
	mustApproval(t, s, NewChange("dev", "c-end", "j-end", 1))
	mustApproval(t, s, NewChange("dev", "c-end2", "j-end", 2))
	if _, err := approve(s, t, "c-end2", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	mustApproval(t, s, NewApproval("dev", "p-end", "j-end", 3)) // a publish request stays
	ev := func(a store.Approval) audit.Event {
		return audit.Event{Kind: audit.KindApprovalExpired, Subject: a.ID, Outcome: "allowed"}
	}
	got, err := s.ExpireChangesOfEndedJobsAudited(ctx(t), 10, ev)
	if err != nil || len(got) != 2 || got[0].ID != "c-end" || got[1].ID != "c-end2" {
		t.Fatalf("expired = %+v, %v; want c-end and c-end2", got, err)
	}
	for id, want := range map[string]store.ApprovalState{"c-run": store.ApprovalPending, "c-end": store.ApprovalExpired, "c-end2": store.ApprovalExpired, "p-end": store.ApprovalPending} {
		if a, _ := s.GetApproval(ctx(t), id); a.State != want {
			t.Errorf("%s is %s, want %s", id, a.State, want)
		}
	}
	if again, err := s.ExpireChangesOfEndedJobsAudited(ctx(t), 10, ev); err != nil || len(again) != 0 {
		t.Fatalf("second sweep = %+v, %v", again, err)
	}
	if n := countKind(t, s, "approval.expired"); n != 2 {
		t.Fatalf("%d approval.expired events, want 2", n)
	}
}

// testStartRequests: a start request carries what it is about, is listed
// by job and kind, is consumed only as itself (never by the publisher's
// consume as a publish request), and expires with its ended job.
func testStartRequests(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	mustCreate(t, s, NewJob("dev", "j2", 1))
	start := func(id, job string, n int) store.Approval {
		a := NewChange("dev", id, job, n)
		a.Kind, a.Change = store.KindStart, []byte(`{"Credentials":[{"Name":"`+id+`"}]}`)
		return a
	}
	s1 := mustApproval(t, s, start("s1", "j1", 0))
	mustApproval(t, s, start("s2", "j2", 1))
	mustApproval(t, s, NewChange("dev", "c1", "j1", 2))
	if s1.Kind != store.KindStart || string(s1.Change) != `{"Credentials":[{"Name":"s1"}]}` {
		t.Fatalf("stored start request = %+v", s1)
	}
	bad := start("s3", "j1", 3)
	bad.Change = nil
	if _, _, err := s.CreateApprovalAudited(ctx(t), bad, audit.Event{Kind: audit.KindApprovalOpened}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a start request without what it is about = %v, want ErrInvalidArgument", err)
	}
	list, _, err := s.ListApprovals(ctx(t), store.ApprovalFilter{JobID: "j1", Kind: store.KindStart, Limit: 10})
	if err != nil || len(list) != 1 || list[0].ID != "s1" {
		t.Fatalf("j1's start requests: %v, %v", list, err)
	}
	if list, _, err := s.ListApprovals(ctx(t), store.ApprovalFilter{JobID: "j1", Limit: 10}); err != nil || len(list) != 2 {
		t.Fatalf("j1's requests: %v, %v", list, err)
	}
	if _, err := approve(s, t, "s1", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	now := base.Add(time.Minute)
	if _, err := s.ConsumeApprovalAudited(ctx(t), consumeReq(s1, now), audit.Event{Kind: audit.KindApprovalConsumed}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("consuming a start request as a publish one = %v", err)
	}
	r := changeReq(s1, now)
	r.Kind = store.KindStart
	if got, err := s.ConsumeApprovalAudited(ctx(t), r, audit.Event{Kind: audit.KindApprovalConsumed}); err != nil || got.State != store.ApprovalConsumed {
		t.Fatalf("consuming the start request = %+v, %v", got, err)
	}
	if _, err := s.UpdateJob(ctx(t), "j2", func(j *store.Job) error { j.State = store.StateCancelled; return nil }); err != nil {
		t.Fatal(err)
	}
	got, err := s.ExpireChangesOfEndedJobsAudited(ctx(t), 10, func(a store.Approval) audit.Event {
		return audit.Event{Kind: audit.KindApprovalExpired, Subject: a.ID, Outcome: "allowed"}
	})
	if err != nil || len(got) != 1 || got[0].ID != "s2" {
		t.Fatalf("expired with their ended jobs: %v, %v; want s2", got, err)
	}
}
