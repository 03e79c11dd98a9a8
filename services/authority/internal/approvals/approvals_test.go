package approvals_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/seal"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/leases"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

const td = "airlock.test"

var (
	publisher = identity.MustParse("spiffe://airlock.test/service/publisher")
	executor  = identity.MustParse("spiffe://airlock.test/service/executor")
	alice     = identity.MustParse("spiffe://airlock.test/approver/alice")
	bob       = identity.MustParse("spiffe://airlock.test/approver/bob")
	carol     = identity.MustParse("spiffe://airlock.test/approver/carol")
	devAsAppr = identity.MustParse("spiffe://airlock.test/approver/dev")
	devClient = identity.MustParse("spiffe://airlock.test/client/dev")
	other     = identity.MustParse("spiffe://airlock.test/client/other")
)

const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

type fixture struct {
	svc    *approvals.Service
	leases *leases.Service
	st     store.Store
	clock  *clock
	ca     *pki.CA
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func setup(t *testing.T, required int, approvers ...string) *fixture {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tenants := policy.Tenants{
		"dev": {Name: "dev", Clients: []string{"client/dev"},
			Repositories:      map[string]policy.Repository{"demo": {Tenant: "dev", Name: "demo", URL: "/x"}, "site": {Tenant: "dev", Name: "site", URL: "/y"}},
			Approvals:         policy.Approvals{Approvers: approvers, Required: required, TTL: time.Hour},
			DeployCredentials: map[string]string{"demo": "/secret/demo", "site": "/secret/site"}},
		"other": {Name: "other", Clients: []string{"client/other"}},
	}
	c := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	svc, err := approvals.New(approvals.Config{Store: st, Tenants: tenants, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := leases.New(leases.Config{Store: st, Tenants: tenants, Approvals: svc,
		ReadFile: func(p string) ([]byte, error) { return []byte("token-for:" + p), nil }})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{svc: svc, leases: ls, st: st, clock: c, ca: ca}
}

// finished records a finished job of client/dev and opens its approval.
func (f *fixture) finished(t *testing.T, id string) store.Approval {
	t.Helper()
	j := store.Job{ID: id, Tenant: "dev", Requester: devClient.String(), IdempotencyKey: "k-" + id, Repository: "demo",
		State: store.StateFinished, BundleDigest: digest, Commit: "c0ffee", CreatedAt: f.clock.now(), UpdatedAt: f.clock.now()}
	if _, _, err := f.st.CreateJob(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	a, created, err := f.svc.Open(t.Context(), executor, j, approvals.Target{Repo: "demo", Branch: "main"})
	if err != nil || !created {
		t.Fatalf("Open = %v, %v", created, err)
	}
	again, created, err := f.svc.Open(t.Context(), executor, j, approvals.Target{Repo: "demo", Branch: "main"})
	if err != nil || created || again.ID != a.ID {
		t.Fatalf("Open again = %s %v %v; want the same approval, not created", again.ID, created, err)
	}
	return a
}

// sweep runs both sweeps as the authority's SweepEvery does: approvals,
// then leases.
func (f *fixture) sweep(ctx context.Context, caller identity.ID) (approvalsExpired, leasesExpired int, err error) {
	if approvalsExpired, err = f.svc.Sweep(ctx, caller); err != nil {
		return approvalsExpired, 0, err
	}
	leasesExpired, err = f.leases.Sweep(ctx, caller)
	return approvalsExpired, leasesExpired, err
}

func approve(id string) approvals.DecideRequest {
	return approvals.DecideRequest{ID: id, BundleDigest: digest, Decision: store.DecisionApprove}
}

func wantErr(t *testing.T, what string, err, sentinel error, text string) {
	t.Helper()
	if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), text) {
		t.Errorf("%s: err = %v; want %v mentioning %q", what, err, sentinel, text)
	}
}

func deniedEvents(t *testing.T, st store.Store, kind string) int {
	evs, err := st.ListAudit(t.Context(), store.AuditFilter{Kind: kind, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Outcome == "denied" {
			n++
		}
	}
	return n
}

func TestOpenOnlyForFinishedWithTarget(t *testing.T) {
	f := setup(t, 1)
	for name, j := range map[string]store.Job{
		"failed":    {ID: "j", Tenant: "dev", State: store.StateFailed, BundleDigest: digest},
		"no digest": {ID: "j", Tenant: "dev", State: store.StateFinished},
	} {
		if _, created, err := f.svc.Open(t.Context(), executor, j, approvals.Target{Repo: "demo", Branch: "main"}); created || err != nil {
			t.Errorf("%s: created=%v err=%v", name, created, err)
		}
	}
	if _, created, _ := f.svc.Open(t.Context(), executor, store.Job{ID: "j", Tenant: "dev", State: store.StateFinished, BundleDigest: digest}, approvals.Target{}); created {
		t.Error("opened an approval without a target")
	}
	a := f.finished(t, "j1")
	if a.Required != 1 || a.State != store.ApprovalPending || !a.ExpiresAt.Equal(f.clock.now().Add(time.Hour)) || a.Requester != devClient.String() {
		t.Fatalf("opened %+v", a)
	}
}

func TestDecideRefusals(t *testing.T) {
	f := setup(t, 2, "approver/alice", "approver/bob", "approver/dev")
	a := f.finished(t, "j1")
	ctx := t.Context()
	deny := approvals.DecideRequest{ID: a.ID, BundleDigest: digest, Decision: store.DecisionDeny}

	_, err := f.svc.Decide(ctx, devAsAppr, approve(a.ID))
	wantErr(t, "requester holding an approver certificate", err, errdefs.ErrPermissionDenied, "requested job")
	_, err = f.svc.Decide(ctx, publisher, approve(a.ID))
	wantErr(t, "service identity", err, errdefs.ErrPermissionDenied, "not an approver")
	_, err = f.svc.Decide(ctx, executor, approve(a.ID))
	wantErr(t, "executor", err, errdefs.ErrPermissionDenied, "not an approver")
	_, err = f.svc.Decide(ctx, devClient, approve(a.ID))
	wantErr(t, "client", err, errdefs.ErrPermissionDenied, "not an approver")
	_, err = f.svc.Decide(ctx, carol, approve(a.ID))
	// As if the request did not exist: nothing of another tenant's is told.
	wantErr(t, "approver not in the list", err, errdefs.ErrNotFound, a.ID)
	_, err = f.svc.Decide(ctx, alice, deny)
	wantErr(t, "deny without comment", err, errdefs.ErrInvalidArgument, "comment: required when denying")
	_, err = f.svc.Decide(ctx, alice, approvals.DecideRequest{ID: a.ID, BundleDigest: digest})
	wantErr(t, "no decision", err, errdefs.ErrInvalidArgument, "decision")
	_, err = f.svc.Decide(ctx, alice, approvals.DecideRequest{ID: a.ID, Decision: store.DecisionApprove})
	wantErr(t, "no digest", err, errdefs.ErrInvalidArgument, "bundle_digest")
	bad := approve(a.ID)
	bad.BundleDigest = "sha256:" + strings.Repeat("2", 64)
	_, err = f.svc.Decide(ctx, alice, bad)
	wantErr(t, "other digest", err, errdefs.ErrFailedPrecondition, "bundle_digest")
	_, err = f.svc.Decide(ctx, alice, approve("nope"))
	wantErr(t, "unknown approval", err, errdefs.ErrNotFound, "nope")

	got, err := f.svc.Decide(ctx, alice, approve(a.ID))
	if err != nil || got.State != store.ApprovalPending || len(got.Votes) != 1 {
		t.Fatalf("alice approves: %+v, %v", got, err)
	}
	_, err = f.svc.Decide(ctx, alice, approve(a.ID))
	wantErr(t, "second vote", err, errdefs.ErrAlreadyExists, "already decided")
	got, err = f.svc.Decide(ctx, bob, approve(a.ID))
	if err != nil || got.State != store.ApprovalApproved {
		t.Fatalf("bob approves: %+v, %v", got, err)
	}
	// Approved is decided: nobody votes any more.
	f2 := setup(t, 1)
	b := f2.finished(t, "j2")
	if _, err := f2.svc.Decide(ctx, alice, approve(b.ID)); err != nil {
		t.Fatal(err)
	}
	_, err = f2.svc.Decide(ctx, bob, approve(b.ID))
	wantErr(t, "already approved", err, errdefs.ErrFailedPrecondition, "not pending")

	if n := deniedEvents(t, f.st, "approval.decided"); n != 11 {
		t.Errorf("%d refused decisions audited, want 11", n)
	}
}

func TestDenyEndsAndExpiry(t *testing.T) {
	f := setup(t, 2)
	a := f.finished(t, "j1")
	got, err := f.svc.Decide(t.Context(), alice, approvals.DecideRequest{ID: a.ID, BundleDigest: digest, Decision: store.DecisionDeny, Comment: "touches CI"})
	if err != nil || got.State != store.ApprovalDenied || got.Votes[0].Comment != "touches CI" {
		t.Fatalf("deny: %+v, %v", got, err)
	}
	_, err = f.svc.Decide(t.Context(), bob, approve(a.ID))
	wantErr(t, "after deny", err, errdefs.ErrFailedPrecondition, "denied")

	b := f.finished(t, "j2")
	f.clock.add(2 * time.Hour)
	_, err = f.svc.Decide(t.Context(), alice, approve(b.ID))
	wantErr(t, "expired", err, errdefs.ErrFailedPrecondition, "expired")
	list, _, err := f.svc.List(t.Context(), alice, approvals.ListRequest{States: []store.ApprovalState{store.ApprovalExpired}})
	if err != nil || len(list) != 1 || list[0].ID != b.ID {
		t.Fatalf("expired list = %v, %v", list, err)
	}
}

func TestListAndGetVisibility(t *testing.T) {
	f := setup(t, 1)
	a := f.finished(t, "j1")
	ctx := t.Context()
	if l, _, err := f.svc.List(ctx, alice, approvals.ListRequest{}); err != nil || len(l) != 1 {
		t.Fatalf("approver list = %v, %v", l, err)
	}
	if l, _, err := f.svc.List(ctx, devClient, approvals.ListRequest{Tenant: "dev"}); err != nil || len(l) != 1 {
		t.Fatalf("client list = %v, %v", l, err)
	}
	_, _, err := f.svc.List(ctx, devClient, approvals.ListRequest{})
	wantErr(t, "client without tenant", err, errdefs.ErrInvalidArgument, "tenant")
	_, _, err = f.svc.List(ctx, other, approvals.ListRequest{Tenant: "dev"})
	wantErr(t, "foreign client", err, errdefs.ErrPermissionDenied, "tenant")
	_, _, err = f.svc.List(ctx, publisher, approvals.ListRequest{})
	wantErr(t, "service", err, errdefs.ErrPermissionDenied, "may not list")
	if got, j, err := f.svc.Get(ctx, devClient, a.ID); err != nil || got.ID != a.ID || j.Commit != "c0ffee" {
		t.Fatalf("client get = %v %v %v", got, j, err)
	}
	_, _, err = f.svc.Get(ctx, other, a.ID)
	wantErr(t, "foreign client get", err, errdefs.ErrNotFound, a.ID)
}

func (f *fixture) holder(t *testing.T, id identity.ID) (*pki.KeyPair, *ecdsa.PrivateKey) {
	t.Helper()
	kp, err := f.ca.Issue(id, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := pki.ParsePrivateKeyPEM(kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return kp, k.(*ecdsa.PrivateKey)
}

func (f *fixture) approved(t *testing.T, job string) store.Approval {
	a := f.finished(t, job)
	if _, err := f.svc.Decide(t.Context(), alice, approve(a.ID)); err != nil {
		t.Fatal(err)
	}
	return a
}

func consumeReq(a store.Approval) approvals.ConsumeRequest {
	return approvals.ConsumeRequest{ID: a.ID, JobID: a.JobID, BundleDigest: a.BundleDigest, Target: approvals.Target{Repo: "demo", Branch: "main"}}
}

func TestConsumeRefusals(t *testing.T) {
	f := setup(t, 1)
	ctx := t.Context()
	p := f.finished(t, "pending")
	_, err := f.svc.Consume(ctx, publisher, consumeReq(p))
	wantErr(t, "pending", err, errdefs.ErrFailedPrecondition, "state: ")
	a := f.approved(t, "j1")
	_, err = f.svc.Consume(ctx, alice, consumeReq(a))
	wantErr(t, "approver consumes", err, errdefs.ErrPermissionDenied, "only the publisher")
	for field, mod := range map[string]func(*approvals.ConsumeRequest){
		"job_id":        func(r *approvals.ConsumeRequest) { r.JobID = "pending" },
		"bundle_digest": func(r *approvals.ConsumeRequest) { r.BundleDigest = "sha256:" + strings.Repeat("3", 64) },
		"target":        func(r *approvals.ConsumeRequest) { r.Target.Branch = "prod" },
	} {
		r := consumeReq(a)
		mod(&r)
		_, err := f.svc.Consume(ctx, publisher, r)
		wantErr(t, "other "+field, err, errdefs.ErrFailedPrecondition, field+":")
	}
	got, err := f.svc.Consume(ctx, publisher, consumeReq(a))
	if err != nil || got.State != store.ApprovalConsumed || got.ConsumedBy != publisher.String() {
		t.Fatalf("consume = %+v, %v", got, err)
	}
	_, err = f.svc.Consume(ctx, publisher, consumeReq(a))
	wantErr(t, "second consume", err, errdefs.ErrFailedPrecondition, "consumed")

	b := f.approved(t, "j2")
	f.clock.add(2 * time.Hour)
	_, err = f.svc.Consume(ctx, publisher, consumeReq(b))
	wantErr(t, "expired", err, errdefs.ErrFailedPrecondition, "expired")
	if n := deniedEvents(t, f.st, "approval.consumed"); n != 7 {
		t.Errorf("%d refused consumptions audited, want 7", n)
	}
}

func TestLeaseAndRevoke(t *testing.T) {
	f := setup(t, 1)
	ctx := t.Context()
	pub, pubKey := f.holder(t, publisher)
	exe, _ := f.holder(t, executor)
	a := f.approved(t, "j1")
	req := leases.Request{Purpose: leases.PurposeDeploy, JobID: "j1", Resource: "demo"}

	_, err := f.leases.Lease(ctx, publisher, pub.Cert, req)
	wantErr(t, "before consume", err, errdefs.ErrFailedPrecondition, "not consumed")
	if _, err := f.svc.Consume(ctx, publisher, consumeReq(a)); err != nil {
		t.Fatal(err)
	}
	_, err = f.leases.Lease(ctx, executor, exe.Cert, req)
	wantErr(t, "executor", err, errdefs.ErrPermissionDenied, "only the publisher")
	_, err = f.leases.Lease(ctx, publisher, exe.Cert, req)
	wantErr(t, "someone else's certificate", err, errdefs.ErrPermissionDenied, "certificate")
	other := req
	other.Resource = "site"
	_, err = f.leases.Lease(ctx, publisher, pub.Cert, other)
	wantErr(t, "another repository", err, errdefs.ErrPermissionDenied, "resource:")
	other = req
	other.JobID = "nope"
	_, err = f.leases.Lease(ctx, publisher, pub.Cert, other)
	wantErr(t, "another job", err, errdefs.ErrFailedPrecondition, "no approval")
	other = req
	other.Purpose = "fetch"
	_, err = f.leases.Lease(ctx, publisher, pub.Cert, other)
	wantErr(t, "purpose", err, errdefs.ErrInvalidArgument, "purpose")

	long := req
	long.TTL = time.Hour
	issued, err := f.leases.Lease(ctx, publisher, pub.Cert, long)
	if err != nil {
		t.Fatal(err)
	}
	l, box := issued.Lease, issued.Sealed
	if got := l.ExpiresAt.Sub(l.IssuedAt); got != leases.MaxTTL {
		t.Errorf("an hour's TTL gave %v, want the cap %v", got, leases.MaxTTL)
	}
	secret, err := seal.Open(pub.Cert, pubKey, leases.SealContext(l.ID, "j1", "demo"), box)
	if err != nil || string(secret) != "token-for:/secret/demo" {
		t.Fatalf("open the sealed credential: %q, %v", secret, err)
	}
	if _, err := seal.Open(pub.Cert, pubKey, leases.SealContext(l.ID, "j2", "demo"), box); err == nil {
		t.Error("the box opened under another job's context")
	}

	// Default TTL, and never past leases.MaxTTL after the consumption.
	f.clock.add(12 * time.Minute)
	issued, err = f.leases.Lease(ctx, publisher, pub.Cert, req)
	l2 := issued.Lease
	if err != nil || l2.ExpiresAt.Sub(l2.IssuedAt) != 3*time.Minute {
		t.Fatalf("late lease: %+v, %v; want it cut to 3m", l2, err)
	}
	f.clock.add(4 * time.Minute)
	_, err = f.leases.Lease(ctx, publisher, pub.Cert, req)
	wantErr(t, "long after consume", err, errdefs.ErrFailedPrecondition, "consumed more than")
	f.clock.add(-16 * time.Minute)

	// One active lease per consumed approval: the second replaced the first.
	active, _, err := f.leases.List(ctx, alice, leases.Query{})
	if err != nil || len(active) != 1 || active[0].ID != l2.ID {
		t.Fatalf("active leases = %v, %v; want only the latest", active, err)
	}
	if first, err := f.st.GetLease(ctx, l.ID); err != nil || first.RevokeReason != "replaced by lease "+l2.ID {
		t.Fatalf("the first lease after the second: %+v, %v", first, err)
	}
	if mine, _, err := f.leases.List(ctx, publisher, leases.Query{}); err != nil || len(mine) != 1 || mine[0].ID != l2.ID {
		t.Fatalf("the publisher's active leases = %v, %v; want only the latest", mine, err)
	}
	_, _, err = f.leases.List(ctx, devClient, leases.Query{})
	wantErr(t, "client lists", err, errdefs.ErrPermissionDenied, "may not list leases")

	_, err = f.leases.Revoke(ctx, devClient, l2.ID, "x")
	wantErr(t, "client revokes", err, errdefs.ErrPermissionDenied, "may not revoke")
	r, err := f.leases.Revoke(ctx, publisher, l2.ID, "pushed")
	if err != nil || r.RevokedAt.IsZero() || r.RevokeReason != "pushed" {
		t.Fatalf("revoke = %+v, %v", r, err)
	}
	_, err = f.leases.Revoke(ctx, alice, l2.ID, "again")
	wantErr(t, "revoke twice", err, errdefs.ErrFailedPrecondition, "already revoked")
	_, err = f.leases.Revoke(ctx, alice, l.ID, "the replaced one")
	wantErr(t, "revoke the replaced lease", err, errdefs.ErrFailedPrecondition, "already revoked")
	active, _, _ = f.leases.List(ctx, alice, leases.Query{})
	all, _, _ := f.leases.List(ctx, alice, leases.Query{IncludeInactive: true, JobID: "j1"})
	if len(active) != 0 || len(all) != 2 {
		t.Fatalf("after revoking: %d active, %d in all; want 0 and 2", len(active), len(all))
	}
	if n := deniedEvents(t, f.st, "lease.issued"); n != 7 {
		t.Errorf("%d refused leases audited, want 7", n)
	}
}

// TestConcurrentConsumeOnce has 100 goroutines consume one approval through
// the domain: one wins, every other gets FailedPrecondition.
func TestConcurrentConsumeOnce(t *testing.T) {
	f := setup(t, 1)
	a := f.approved(t, "j1")
	var (
		wg          sync.WaitGroup
		mu          sync.Mutex
		won, refuse int
		other       []error
	)
	start := make(chan struct{})
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := f.svc.Consume(t.Context(), publisher, consumeReq(a))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, errdefs.ErrFailedPrecondition):
				refuse++
			default:
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if won != 1 || refuse != 99 || len(other) > 0 {
		t.Fatalf("won %d, refused %d, other errors %v; want 1, 99, none", won, refuse, other)
	}
}

// TestConcurrentVotes: two approvers voting at once on a request that needs
// both both count; one approver voting twice at once counts once.
func TestConcurrentVotes(t *testing.T) {
	f := setup(t, 2)
	a := f.finished(t, "j1")
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, who := range []identity.ID{alice, bob, alice, bob} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.svc.Decide(t.Context(), who, approve(a.ID))
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition):
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	got, _, err := f.svc.Get(t.Context(), alice, a.ID)
	if err != nil || ok != 2 || got.State != store.ApprovalApproved || len(got.Votes) != 2 {
		t.Fatalf("%d votes accepted; approval %s with %d votes, %v; want 2, approved, 2", ok, got.State, len(got.Votes), err)
	}
}

func TestOpenMissing(t *testing.T) {
	f := setup(t, 1)
	have := f.finished(t, "has")
	for _, j := range []store.Job{
		{ID: "missing", State: store.StateFinished, BundleDigest: digest},
		{ID: "notarget", State: store.StateFinished, BundleDigest: digest},
		{ID: "failed", State: store.StateFailed, BundleDigest: digest},
	} {
		j.Tenant, j.Requester, j.IdempotencyKey = "dev", devClient.String(), "k-"+j.ID
		if _, _, err := f.st.CreateJob(t.Context(), j); err != nil {
			t.Fatal(err)
		}
	}
	targetOf := func(j store.Job) (approvals.Target, error) {
		if j.ID == "notarget" {
			return approvals.Target{}, nil
		}
		return approvals.Target{Repo: "demo", Branch: "main"}, nil
	}
	n, err := f.svc.OpenMissing(t.Context(), executor, targetOf)
	if err != nil || n != 1 {
		t.Fatalf("OpenMissing = %d, %v; want 1", n, err)
	}
	if id, _ := f.svc.IDForJob(t.Context(), "missing"); id == "" {
		t.Error("job missing has no approval")
	}
	for _, j := range []string{"notarget", "failed"} {
		if id, _ := f.svc.IDForJob(t.Context(), j); id != "" {
			t.Errorf("job %s got approval %s", j, id)
		}
	}
	if id, _ := f.svc.IDForJob(t.Context(), "has"); id != have.ID {
		t.Errorf("the existing approval changed: %s", id)
	}
	if n, err := f.svc.OpenMissing(t.Context(), executor, targetOf); err != nil || n != 0 {
		t.Fatalf("second OpenMissing = %d, %v; want 0", n, err)
	}
}

// TestUseLeaseRefusesExpiredAndRevoked presents a lease as its holder at
// each point of its life: active, expired (by the clock), revoked.
func TestUseLeaseRefusesExpiredAndRevoked(t *testing.T) {
	f := setup(t, 1)
	ctx := t.Context()
	pub, _ := f.holder(t, publisher)
	a := f.approved(t, "j1")
	if _, err := f.svc.Consume(ctx, publisher, consumeReq(a)); err != nil {
		t.Fatal(err)
	}
	issued, err := f.leases.Lease(ctx, publisher, pub.Cert, leases.Request{Purpose: leases.PurposeDeploy, JobID: "j1", Resource: "demo", TTL: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	l := issued.Lease
	use := leases.UseRequest{LeaseID: l.ID, JobID: "j1", Resource: "demo"}
	if _, err := f.leases.Use(ctx, publisher, use); err != nil {
		t.Fatalf("use of an active lease: %v", err)
	}
	_, err = f.leases.Use(ctx, alice, use)
	wantErr(t, "someone else presents it", err, errdefs.ErrPermissionDenied, "held by")
	_, err = f.leases.Use(ctx, publisher, leases.UseRequest{LeaseID: "nope", JobID: "j1", Resource: "demo"})
	wantErr(t, "unknown lease", err, errdefs.ErrNotFound, "nope")
	_, err = f.leases.Use(ctx, publisher, leases.UseRequest{LeaseID: l.ID, JobID: "j1"})
	wantErr(t, "no resource", err, errdefs.ErrInvalidArgument, "resource")

	f.clock.add(2 * time.Minute)
	_, err = f.leases.Use(ctx, publisher, use)
	wantErr(t, "expired", err, errdefs.ErrFailedPrecondition, "expired")
	f.clock.add(-time.Minute)
	if _, err := f.leases.Use(ctx, publisher, use); err != nil {
		t.Fatalf("use a minute before expiry: %v", err)
	}
	if _, err := f.leases.Revoke(ctx, alice, l.ID, "incident"); err != nil {
		t.Fatal(err)
	}
	_, err = f.leases.Use(ctx, publisher, use)
	wantErr(t, "revoked", err, errdefs.ErrFailedPrecondition, "revoked")

	evs, err := f.st.ListAudit(ctx, store.AuditFilter{Kind: "lease.used", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	allowed, denied := 0, 0
	for _, e := range evs {
		if e.Outcome == "allowed" {
			allowed++
		} else {
			denied++
		}
	}
	if allowed != 2 || denied != 5 {
		t.Errorf("lease.used events: %d allowed, %d denied; want 2 and 5", allowed, denied)
	}
}

// TestSweepExpires lets a request and a lease run out on the clock: the
// sweep rewrites each once, on the log, and decisions on the expired
// request are refused.
func TestSweepExpires(t *testing.T) {
	f := setup(t, 1)
	ctx := t.Context()
	pub, _ := f.holder(t, publisher)
	authority := identity.MustParse("spiffe://airlock.test/service/authority")
	pending := f.finished(t, "j-pending")
	a := f.approved(t, "j1")
	if _, err := f.svc.Consume(ctx, publisher, consumeReq(a)); err != nil {
		t.Fatal(err)
	}
	issued, err := f.leases.Lease(ctx, publisher, pub.Cert, leases.Request{Purpose: leases.PurposeDeploy, JobID: "j1", Resource: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	l := issued.Lease
	if n, m, err := f.sweep(ctx, authority); err != nil || n != 0 || m != 0 {
		t.Fatalf("sweep before anything expired = %d, %d, %v", n, m, err)
	}
	f.clock.add(2 * time.Hour)
	if n, m, err := f.sweep(ctx, authority); err != nil || n != 1 || m != 1 {
		t.Fatalf("sweep after expiry = %d approvals, %d leases, %v; want 1 and 1", n, m, err)
	}
	if n, m, err := f.sweep(ctx, authority); err != nil || n+m != 0 {
		t.Fatalf("second sweep = %d, %d, %v", n, m, err)
	}
	got, err := f.st.GetApproval(ctx, pending.ID)
	if err != nil || got.State != store.ApprovalExpired {
		t.Fatalf("stored state after the sweep = %s, %v", got.State, err)
	}
	_, err = f.svc.Decide(ctx, alice, approve(pending.ID))
	wantErr(t, "deciding an expired request", err, errdefs.ErrFailedPrecondition, "expired")
	gl, err := f.st.GetLease(ctx, l.ID)
	if err != nil || gl.RevokeReason != store.ExpiredReason || !gl.RevokedAt.Equal(gl.ExpiresAt) {
		t.Fatalf("lease after the sweep = %+v, %v", gl, err)
	}
	_, err = f.leases.Use(ctx, publisher, leases.UseRequest{LeaseID: l.ID, JobID: "j1", Resource: "demo"})
	wantErr(t, "using an expired lease", err, errdefs.ErrFailedPrecondition, "expired")
}
