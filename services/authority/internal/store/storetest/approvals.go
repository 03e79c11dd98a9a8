package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The approval and lease tests.
var approvalTests = []conformance{
	{"ApprovalCreateIsOncePerJob", testApprovalCreate},
	{"ApprovalDecideVotesAndState", testApprovalDecide},
	{"ApprovalDecideErrorWritesNothing", testApprovalDecideError},
	{"ApprovalConsumeChecksEverything", testApprovalConsumeChecks},
	{"ApprovalConsumeRace100", testApprovalConsumeRace},
	{"ApprovalListFilters", testApprovalList},
	{"LeaseCreateRevokeList", testLeases},
	{"LeaseOneActivePerJob", testLeaseOneActive},
	{"ChangeRequestKinds", testChangeKinds},
	{"StartRequests", testStartRequests},
	{"ChangeApplyIsAtomic", testChangeApplyAtomic},
	{"ChangeApplyRace50", testChangeApplyRace},
	{"ExpireApprovalsAndLeases", testExpire},
	{"ExpireChangesOfEndedJobs", testExpireChangesOfEndedJobs},
}

// NewApproval returns a pending approval of job jobID, created at base+n
// seconds, expiring a day later, needing one vote.
func NewApproval(tenant, id, jobID string, n int) store.Approval {
	at := base.Add(time.Duration(n) * time.Second)
	return store.Approval{
		ID: id, JobID: jobID, Tenant: tenant, Requester: "spiffe://airlock.test/client/dev",
		BundleDigest: "sha256:" + id, TargetRepo: "demo", TargetBranch: "main", State: store.ApprovalPending,
		Required: 1, CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour),
	}
}

func mustApproval(t *testing.T, s store.Store, a store.Approval) store.Approval {
	t.Helper()
	got, created, err := s.CreateApprovalAudited(ctx(t), a, audit.Event{Kind: audit.KindApprovalOpened, Subject: a.ID})
	if err != nil || !created {
		t.Fatalf("CreateApprovalAudited(%s) = created %v, %v", a.ID, created, err)
	}
	return got
}

func approve(s store.Store, t *testing.T, id, who string, state store.ApprovalState) (store.Approval, error) {
	return s.DecideApprovalAudited(ctx(t), id, func(a *store.Approval) (store.Vote, audit.Event, error) {
		a.State = state
		return store.Vote{Approver: who, Decision: store.DecisionApprove, DecidedAt: base.Add(time.Minute)},
			audit.Event{Kind: audit.KindApprovalDecided, Caller: who, Subject: id}, nil
	})
}

func countKind(t *testing.T, s store.Store, kind string) int {
	n := 0
	for _, e := range VerifyAudit(t, s) {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

func testApprovalCreate(t *testing.T, open Opener) {
	s := open(t)
	a := mustApproval(t, s, NewApproval("dev", "a1", "j1", 0))
	if a.Version != 1 || a.State != store.ApprovalPending || a.Required != 1 || !a.ExpiresAt.Equal(base.Add(24*time.Hour)) {
		t.Fatalf("created %+v", a)
	}
	again, created, err := s.CreateApprovalAudited(ctx(t), NewApproval("dev", "a2", "j1", 1), audit.Event{Kind: audit.KindApprovalOpened})
	if err != nil || created || again.ID != "a1" {
		t.Fatalf("second approval of j1 = %s created=%v %v; want a1, not created", again.ID, created, err)
	}
	if n := countKind(t, s, "approval.opened"); n != 1 {
		t.Fatalf("%d approval.opened events, want 1", n)
	}
	if got, err := s.ApprovalForJob(ctx(t), "j1"); err != nil || got.ID != "a1" {
		t.Fatalf("ApprovalForJob = %s, %v", got.ID, err)
	}
	if _, err := s.GetApproval(ctx(t), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetApproval(unknown) = %v", err)
	}
}

func testApprovalDecide(t *testing.T, open Opener) {
	s := open(t)
	a := NewApproval("dev", "a1", "j1", 0)
	a.Required = 2
	mustApproval(t, s, a)
	got, err := approve(s, t, "a1", "spiffe://airlock.test/approver/alice", store.ApprovalPending)
	if err != nil || got.State != store.ApprovalPending || len(got.Votes) != 1 || got.Version != 2 {
		t.Fatalf("first vote: %+v, %v", got, err)
	}
	if _, err := approve(s, t, "a1", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second vote by alice = %v, want ErrAlreadyExists", err)
	}
	got, err = approve(s, t, "a1", "spiffe://airlock.test/approver/bob", store.ApprovalApproved)
	if err != nil || got.State != store.ApprovalApproved || len(got.Votes) != 2 {
		t.Fatalf("second vote: %+v, %v", got, err)
	}
	if n := countKind(t, s, "approval.decided"); n != 2 {
		t.Fatalf("%d approval.decided events, want 2 (the refused vote wrote none)", n)
	}
	if _, err := approve(s, t, "nope", "x", store.ApprovalApproved); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deciding an unknown approval = %v", err)
	}
}

func testApprovalDecideError(t *testing.T, open Opener) {
	s := open(t)
	mustApproval(t, s, NewApproval("dev", "a1", "j1", 0))
	boom := fmt.Errorf("%w: no", errdefs.ErrPermissionDenied)
	_, err := s.DecideApprovalAudited(ctx(t), "a1", func(a *store.Approval) (store.Vote, audit.Event, error) {
		a.State = store.ApprovalApproved
		return store.Vote{}, audit.Event{}, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	// An invalid event writes nothing either.
	_, err = s.DecideApprovalAudited(ctx(t), "a1", func(a *store.Approval) (store.Vote, audit.Event, error) {
		a.State = store.ApprovalApproved
		return store.Vote{Approver: "x", Decision: store.DecisionApprove, DecidedAt: base}, audit.Event{}, nil
	})
	if err == nil {
		t.Fatal("an event without a kind was accepted")
	}
	got, _ := s.GetApproval(ctx(t), "a1")
	if got.State != store.ApprovalPending || len(got.Votes) != 0 || got.Version != 1 {
		t.Fatalf("after refused decisions: %+v", got)
	}
}

func consumeReq(a store.Approval, at time.Time) store.ConsumeRequest {
	return store.ConsumeRequest{ID: a.ID, JobID: a.JobID, BundleDigest: a.BundleDigest, TargetRepo: a.TargetRepo,
		TargetBranch: a.TargetBranch, By: "spiffe://airlock.test/service/publisher", At: at}
}

func testApprovalConsumeChecks(t *testing.T, open Opener) {
	s := open(t)
	a := mustApproval(t, s, NewApproval("dev", "a1", "j1", 0))
	now := base.Add(time.Hour)
	ev := audit.Event{Kind: audit.KindApprovalConsumed, Subject: "a1"}
	if _, err := s.ConsumeApprovalAudited(ctx(t), consumeReq(a, now), ev); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("consuming a pending approval = %v", err)
	}
	if _, err := approve(s, t, "a1", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*store.ConsumeRequest){
		"job":     func(r *store.ConsumeRequest) { r.JobID = "j2" },
		"digest":  func(r *store.ConsumeRequest) { r.BundleDigest = "sha256:other" },
		"repo":    func(r *store.ConsumeRequest) { r.TargetRepo = "other" },
		"branch":  func(r *store.ConsumeRequest) { r.TargetBranch = "other" },
		"expired": func(r *store.ConsumeRequest) { r.At = a.ExpiresAt },
	} {
		r := consumeReq(a, now)
		mod(&r)
		if _, err := s.ConsumeApprovalAudited(ctx(t), r, ev); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("consume with another %s = %v, want ErrFailedPrecondition", name, err)
		}
	}
	got, err := s.ConsumeApprovalAudited(ctx(t), consumeReq(a, now), ev)
	if err != nil || got.State != store.ApprovalConsumed || !got.ConsumedAt.Equal(now) || got.ConsumedBy == "" {
		t.Fatalf("consume = %+v, %v", got, err)
	}
	if _, err := s.ConsumeApprovalAudited(ctx(t), consumeReq(a, now), ev); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second consume = %v", err)
	}
	if n := countKind(t, s, "approval.consumed"); n != 1 {
		t.Fatalf("%d approval.consumed events, want 1", n)
	}
}

// testApprovalConsumeRace has 100 goroutines, over two stores on one
// database, consume one approval at once: exactly one succeeds.
func testApprovalConsumeRace(t *testing.T, open Opener) {
	s1, s2 := open(t), open(t)
	a := mustApproval(t, s1, NewApproval("dev", "a1", "j1", 0))
	if _, err := approve(s1, t, "a1", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	raceOnce(t, 100, s1, s2, "consumers", func(s store.Store) error {
		_, err := s.ConsumeApprovalAudited(ctx(t), consumeReq(a, base.Add(time.Hour)), audit.Event{Kind: audit.KindApprovalConsumed, Subject: "a1"})
		return err
	})
	if c := countKind(t, s1, "approval.consumed"); c != 1 {
		t.Fatalf("%d approval.consumed events, want 1", c)
	}
}

func testApprovalList(t *testing.T, open Opener) {
	s := open(t)
	for i := range 5 {
		tenant := "dev"
		if i%2 == 1 {
			tenant = "other"
		}
		mustApproval(t, s, NewApproval(tenant, fmt.Sprintf("a%d", i), fmt.Sprintf("j%d", i), i))
	}
	if _, err := approve(s, t, "a4", "spiffe://airlock.test/approver/alice", store.ApprovalApproved); err != nil {
		t.Fatal(err)
	}
	var ids []string
	tok := ""
	for {
		page, next, err := s.ListApprovals(ctx(t), store.ApprovalFilter{Limit: 2, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page {
			ids = append(ids, a.ID)
		}
		if next == "" {
			break
		}
		tok = next
	}
	if fmt.Sprint(ids) != "[a4 a3 a2 a1 a0]" {
		t.Fatalf("all approvals by page = %v", ids)
	}
	dev, _, err := s.ListApprovals(ctx(t), store.ApprovalFilter{Tenant: "dev", States: []store.ApprovalState{store.ApprovalPending}, Limit: 10})
	if err != nil || len(dev) != 2 || dev[0].ID != "a2" || dev[1].ID != "a0" {
		t.Fatalf("dev pending = %v, %v", dev, err)
	}
	approved, _, err := s.ListApprovals(ctx(t), store.ApprovalFilter{States: []store.ApprovalState{store.ApprovalApproved}, Limit: 10})
	if err != nil || len(approved) != 1 || len(approved[0].Votes) != 1 {
		t.Fatalf("approved = %v, %v", approved, err)
	}
	if _, _, err := s.ListApprovals(ctx(t), store.ApprovalFilter{Limit: 1, PageToken: "bad"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad token = %v", err)
	}
}

func testLeases(t *testing.T, open Opener) {
	s := open(t)
	mk := func(id, job string, n int) store.Lease {
		at := base.Add(time.Duration(n) * time.Second)
		l, err := s.CreateLeaseAudited(ctx(t), store.Lease{ID: id, Purpose: "deploy", JobID: job, Resource: "demo",
			Holder: "spiffe://airlock.test/service/publisher", IssuedAt: at, ExpiresAt: at.Add(5 * time.Minute)},
			audit.Event{Kind: audit.KindLeaseIssued, Subject: id})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l1 := mk("l1", "j1", 0)
	if got, err := s.GetLease(ctx(t), "l1"); err != nil || got != l1 {
		t.Fatalf("GetLease = %+v, %v; want %+v", got, err, l1)
	}
	// A second lease for the same job and purpose replaces the first.
	mk("l2", "j1", 1)
	mk("l3", "j2", 2)
	if got, err := s.GetLease(ctx(t), "l1"); err != nil || got.Active(base.Add(2*time.Second)) || got.RevokeReason != "replaced by lease l2" ||
		!got.RevokedAt.Equal(base.Add(time.Second)) {
		t.Fatalf("l1 after l2 = %+v, %v; want revoked as replaced by l2", got, err)
	}
	if _, err := s.GetLease(ctx(t), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetLease(unknown) = %v", err)
	}
	r, err := s.RevokeLeaseAudited(ctx(t), "l2", base.Add(time.Minute), "done", audit.Event{Kind: audit.KindLeaseRevoked, Subject: "l2"})
	if err != nil || !r.RevokedAt.Equal(base.Add(time.Minute)) || r.RevokeReason != "done" || r.Active(base.Add(2*time.Minute)) {
		t.Fatalf("revoke = %+v, %v", r, err)
	}
	if _, err := s.RevokeLeaseAudited(ctx(t), "l2", base.Add(2*time.Minute), "again", audit.Event{Kind: audit.KindLeaseRevoked}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second revoke = %v", err)
	}
	if _, err := s.RevokeLeaseAudited(ctx(t), "nope", base, "x", audit.Event{Kind: audit.KindLeaseRevoked}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("revoke unknown = %v", err)
	}
	active, _, err := s.ListLeases(ctx(t), store.LeaseFilter{ActiveAt: base.Add(2 * time.Minute), Limit: 10})
	if err != nil || len(active) != 1 || active[0].ID != "l3" {
		t.Fatalf("active = %v, %v", active, err)
	}
	if later, _, _ := s.ListLeases(ctx(t), store.LeaseFilter{ActiveAt: base.Add(time.Hour), Limit: 10}); len(later) != 0 {
		t.Fatalf("active an hour later = %v", later)
	}
	page, next, err := s.ListLeases(ctx(t), store.LeaseFilter{JobID: "j1", Limit: 1})
	if err != nil || len(page) != 1 || page[0].ID != "l2" || next == "" {
		t.Fatalf("j1 page 1 = %v %q %v", page, next, err)
	}
	page, next, err = s.ListLeases(ctx(t), store.LeaseFilter{JobID: "j1", Limit: 1, PageToken: next})
	if err != nil || len(page) != 1 || page[0].ID != "l1" || next != "" {
		t.Fatalf("j1 page 2 = %v %q %v", page, next, err)
	}
	if n := countKind(t, s, "lease.issued") + countKind(t, s, "lease.revoked"); n != 5 {
		t.Fatalf("%d lease events, want 5 (three issued, one replaced, one revoked)", n)
	}
}

// testLeaseOneActive: many leases asked for one job at once, over two
// stores, leave exactly one active, every other revoked as replaced and on
// the log.
func testLeaseOneActive(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t)}
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := base.Add(time.Duration(i) * time.Millisecond)
			_, err := stores[i%2].CreateLeaseAudited(ctx(t), store.Lease{ID: fmt.Sprintf("c%02d", i), Purpose: "deploy", JobID: "j1", Resource: "demo",
				Holder: "spiffe://airlock.test/service/publisher", IssuedAt: at, ExpiresAt: at.Add(5 * time.Minute)},
				audit.Event{Kind: "lease.issued", Subject: fmt.Sprintf("c%02d", i)})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	all, _, err := stores[0].ListLeases(ctx(t), store.LeaseFilter{JobID: "j1", Limit: 100})
	if err != nil || len(all) != n {
		t.Fatalf("%d leases, %v; want %d", len(all), err, n)
	}
	active := 0
	for _, l := range all {
		if l.RevokedAt.IsZero() {
			active++
		} else if !strings.HasPrefix(l.RevokeReason, "replaced by lease c") {
			t.Errorf("%s revoked for %q", l.ID, l.RevokeReason)
		}
	}
	if active != 1 {
		t.Errorf("%d active leases for one job, want 1", active)
	}
	if got := countKind(t, stores[0], "lease.revoked"); got != n-1 {
		t.Errorf("%d lease.revoked events, want %d", got, n-1)
	}
}
