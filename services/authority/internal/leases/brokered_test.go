package leases_test

import (
	"crypto/ecdsa"
	"crypto/x509"
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

var (
	execA     = identity.MustParse("spiffe://airlock.test/service/executor/a")
	execB     = identity.MustParse("spiffe://airlock.test/service/executor/b")
	publisher = identity.MustParse("spiffe://airlock.test/service/publisher")
	authority = identity.MustParse("spiffe://airlock.test/service/authority")
	alice     = identity.MustParse("spiffe://airlock.test/approver/alice")
)

type fixture struct {
	leases *leases.Service
	st     store.Store
	ca     *pki.CA
	mu     sync.Mutex
	now    time.Time
	// deadline is the deadline every job's grant carries.
	deadline time.Duration
}

func (f *fixture) clock() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
func (f *fixture) add(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func setup(t *testing.T) *fixture {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tenants := policy.Tenants{"dev": {Name: "dev", Clients: []string{"client/dev"},
		Approvals: policy.Approvals{Approvers: []string{"approver/alice"}, Required: 1, TTL: time.Hour},
		Credentials: map[string]policy.Credential{
			"github": {Name: "github", Hosts: []string{"api.github.test", "*.gh.test"}, Header: "Authorization", Format: "Bearer {value}",
				File: "/secret/github", MaxTTL: 30 * time.Minute, UpstreamCA: "/ca/github.pem"},
			"npm":    {Name: "npm", Hosts: []string{"registry.npm.test"}, Header: "Authorization", BasicUser: "ci", Env: "NPM_TOKEN", MaxTTL: 2 * time.Hour},
			"broken": {Name: "broken", Hosts: []string{"broken.test"}, File: "/secret/missing", MaxTTL: time.Hour},
			"empty":  {Name: "empty", Hosts: []string{"empty.test"}, Env: "UNSET", MaxTTL: time.Hour},
			"other":  {Name: "other", Hosts: []string{"other.test"}, File: "/secret/other", MaxTTL: time.Hour},
		}}}
	f := &fixture{st: st, now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), deadline: time.Hour}
	appr, err := approvals.New(approvals.Config{Store: st, Tenants: tenants, Now: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	f.leases, err = leases.New(leases.Config{Store: st, Tenants: tenants, Approvals: appr,
		ReadFile: func(p string) ([]byte, error) {
			if p == "/secret/missing" {
				return nil, errors.New("open /secret/missing: no such file")
			}
			return []byte("value-of:" + p), nil
		},
		Getenv: func(k string) string {
			if k == "NPM_TOKEN" {
				return "npm-token"
			}
			return ""
		},
		// The grant of a test job is its credentials' names, comma
		// separated.
		Grants: func(wire []byte) (leases.JobGrant, error) {
			return leases.JobGrant{Credentials: strings.Split(string(wire), ","), Deadline: f.deadline}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if f.ca, err = pki.NewCA("airlock.test", time.Hour); err != nil {
		t.Fatal(err)
	}
	return f
}

// job records job id of tenant dev in state st, placed on executor on
// and dispatched now, asking for the brokered credentials names.
func (f *fixture) job(t *testing.T, id string, st store.State, on identity.ID, names string) {
	t.Helper()
	now := f.clock()
	j := store.Job{ID: id, Tenant: "dev", Requester: "spiffe://airlock.test/client/dev", IdempotencyKey: "k-" + id, Repository: "demo",
		State: st, Grant: []byte(names), Executor: on.String(), DispatchedAt: now, CreatedAt: now, UpdatedAt: now}
	if _, _, err := f.st.CreateJob(t.Context(), j); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) end(t *testing.T, id string, st store.State) {
	t.Helper()
	if _, err := f.st.UpdateJob(t.Context(), id, func(j *store.Job) error { j.State = st; return nil }); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) holder(t *testing.T, id identity.ID) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	kp, err := f.ca.Issue(id, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := pki.ParsePrivateKeyPEM(kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return kp.Cert, k.(*ecdsa.PrivateKey)
}

func brokered(job, name string, ttl time.Duration) leases.Request {
	return leases.Request{Purpose: leases.PurposeBrokered, JobID: job, Resource: name, TTL: ttl}
}

func wantErr(t *testing.T, what string, err, sentinel error, text string) {
	t.Helper()
	if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), text) {
		t.Errorf("%s: err = %v; want %v mentioning %q", what, err, sentinel, text)
	}
}

// reasons are the reasons of the audit events of kind with outcome.
func reasons(t *testing.T, st store.Store, kind, outcome string) []string {
	t.Helper()
	evs, err := st.ListAudit(t.Context(), store.AuditFilter{Kind: kind, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.Outcome == outcome {
			out = append(out, e.Reason)
		}
	}
	return out
}

// TestBrokeredLease: the executor a running job is placed on leases a
// credential the job asked for: sealed to its certificate, with the
// policy's injection spec, on the log with the hosts.
func TestBrokeredLease(t *testing.T) {
	f := setup(t)
	ctx := t.Context()
	cert, key := f.holder(t, execA)
	f.job(t, "j1", store.StateRunning, execA, "github,npm")

	out, err := f.leases.Lease(ctx, execA, cert, brokered("j1", "github", 0))
	if err != nil {
		t.Fatal(err)
	}
	l := out.Lease
	if l.Purpose != leases.PurposeBrokered || l.Resource != "github" || l.Holder != execA.String() || l.JobID != "j1" ||
		l.ExpiresAt.Sub(l.IssuedAt) != 30*time.Minute {
		t.Fatalf("lease = %+v; want github for j1 held by executor a for the credential's max_ttl", l)
	}
	b := out.Brokered
	if b == nil || b.Name != "github" || strings.Join(b.Hosts, " ") != "api.github.test *.gh.test" || b.Header != "Authorization" ||
		b.Format != "Bearer {value}" || string(b.UpstreamCA) != "value-of:/ca/github.pem" {
		t.Fatalf("brokered = %+v", b)
	}
	secret, err := seal.Open(cert, key, leases.SealContext(l.ID, "j1", "github"), out.Sealed)
	if err != nil || string(secret) != "value-of:/secret/github" {
		t.Fatalf("open = %q, %v", secret, err)
	}
	if strings.Contains(string(out.Sealed), "value-of") {
		t.Fatal("the credential is in the clear")
	}
	out, err = f.leases.Lease(ctx, execA, cert, brokered("j1", "npm", 0))
	if err != nil {
		t.Fatal(err)
	}
	if secret, err := seal.Open(cert, key, leases.SealContext(out.Lease.ID, "j1", "npm"), out.Sealed); err != nil || string(secret) != "npm-token" {
		t.Fatalf("open npm = %q, %v", secret, err)
	}
	if out.Brokered.BasicUser != "ci" || out.Brokered.UpstreamCA != nil {
		t.Fatalf("npm brokered = %+v", out.Brokered)
	}
	// Both credentials of the job are active at once.
	active, _, err := f.leases.List(ctx, alice, leases.Query{JobID: "j1"})
	if err != nil || len(active) != 2 {
		t.Fatalf("active = %+v, %v; want both", active, err)
	}
	got := reasons(t, f.st, "lease.issued", "allowed")
	if len(got) != 2 || !strings.HasPrefix(got[0], "brokered credential github for job j1 on hosts api.github.test, *.gh.test until 2030-01-01T00:30:00Z") {
		t.Fatalf("issued reasons = %q", got)
	}
	// A staging job's proxy starts before the job does.
	f.job(t, "j2", store.StateStaging, execA, "github")
	if _, err := f.leases.Lease(ctx, execA, cert, brokered("j2", "github", 0)); err != nil {
		t.Fatalf("staging job: %v", err)
	}
}

// TestBrokeredTTL: the TTL asked, cut to the credential's max_ttl and to
// the job's deadline.
func TestBrokeredTTL(t *testing.T) {
	f := setup(t)
	cert, _ := f.holder(t, execA)
	f.job(t, "j1", store.StateRunning, execA, "github,npm")
	for _, tc := range []struct {
		name      string
		ttl, want time.Duration
	}{
		{"github", 10 * time.Minute, 10 * time.Minute},
		{"github", 5 * time.Hour, 30 * time.Minute},
		{"github", 0, 30 * time.Minute},
		// npm's max is 2h; the job's deadline (1h from its dispatch) cuts it.
		{"npm", 0, time.Hour},
		{"npm", 3 * time.Hour, time.Hour},
		{"npm", 20 * time.Minute, 20 * time.Minute},
	} {
		out, err := f.leases.Lease(t.Context(), execA, cert, brokered("j1", tc.name, tc.ttl))
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Lease.ExpiresAt.Sub(out.Lease.IssuedAt); got != tc.want {
			t.Errorf("%s for %v: %v, want %v", tc.name, tc.ttl, got, tc.want)
		}
	}
	f.add(45 * time.Minute)
	out, err := f.leases.Lease(t.Context(), execA, cert, brokered("j1", "npm", 0))
	if err != nil || out.Lease.ExpiresAt.Sub(out.Lease.IssuedAt) != 15*time.Minute {
		t.Fatalf("45m into the job: %+v, %v; want 15m left", out.Lease, err)
	}
	f.add(15 * time.Minute)
	_, err = f.leases.Lease(t.Context(), execA, cert, brokered("j1", "npm", 0))
	wantErr(t, "past the deadline", err, errdefs.ErrFailedPrecondition, "past its deadline")
}

// TestBrokeredRefusals: every lease that must not be issued is refused,
// as the caller sees it and on the log.
func TestBrokeredRefusals(t *testing.T) {
	f := setup(t)
	ctx := t.Context()
	certA, _ := f.holder(t, execA)
	certB, _ := f.holder(t, execB)
	pub, _ := f.holder(t, publisher)
	f.job(t, "run", store.StateRunning, execA, "github,broken,empty,ghost")
	f.job(t, "queued", store.StateQueued, execA, "github")
	f.job(t, "done", store.StateRunning, execA, "github")
	f.end(t, "done", store.StateFinished)
	f.job(t, "gone", store.StateRunning, execA, "github")
	f.end(t, "gone", store.StateCancelled)
	f.job(t, "nowhere", store.StateRunning, identity.ID{}, "github")

	for _, tc := range []struct {
		what     string
		caller   identity.ID
		cert     *x509.Certificate
		req      leases.Request
		sentinel error
		text     string
	}{
		{"an executor asks for a deploy credential", execA, certA, leases.Request{Purpose: leases.PurposeDeploy, JobID: "run", Resource: "demo"},
			errdefs.ErrPermissionDenied, "only the publisher"},
		{"an executor asks to read", execA, certA, leases.Request{Purpose: leases.PurposeRead, JobID: "run", Resource: "demo"},
			errdefs.ErrPermissionDenied, "only the publisher"},
		{"the publisher asks for a brokered one", publisher, pub, brokered("run", "github", 0), errdefs.ErrPermissionDenied, "only the executor"},
		{"another executor", execB, certB, brokered("run", "github", 0), errdefs.ErrPermissionDenied, "not placed on service/executor/b"},
		{"a job placed nowhere", execA, certA, brokered("nowhere", "github", 0), errdefs.ErrPermissionDenied, "not placed on"},
		{"someone else's certificate", execA, certB, brokered("run", "github", 0), errdefs.ErrPermissionDenied, "certificate"},
		{"no certificate", execA, nil, brokered("run", "github", 0), errdefs.ErrPermissionDenied, "certificate"},
		{"a name the job did not ask for", execA, certA, brokered("run", "other", 0), errdefs.ErrPermissionDenied, `did not ask for the brokered credential "other"`},
		{"a name the policy does not hold", execA, certA, brokered("run", "ghost", 0), errdefs.ErrFailedPrecondition, `no brokered credential "ghost"`},
		{"a queued job", execA, certA, brokered("queued", "github", 0), errdefs.ErrFailedPrecondition, "queued, not started"},
		{"a finished job", execA, certA, brokered("done", "github", 0), errdefs.ErrFailedPrecondition, "ended (finished)"},
		{"a cancelled job", execA, certA, brokered("gone", "github", 0), errdefs.ErrFailedPrecondition, "ended (cancelled)"},
		{"an unknown job", execA, certA, brokered("nope", "github", 0), errdefs.ErrNotFound, "nope"},
		{"no name", execA, certA, brokered("run", "", 0), errdefs.ErrInvalidArgument, "resource"},
		{"a negative ttl", execA, certA, brokered("run", "github", -time.Second), errdefs.ErrInvalidArgument, "ttl"},
		{"an unreadable file", execA, certA, brokered("run", "broken", 0), errdefs.ErrUnavailable, "the brokered credential broken cannot be read"},
		{"an empty variable", execA, certA, brokered("run", "empty", 0), errdefs.ErrUnavailable, "the brokered credential empty cannot be read"},
	} {
		_, err := f.leases.Lease(ctx, tc.caller, tc.cert, tc.req)
		wantErr(t, tc.what, err, tc.sentinel, tc.text)
		if err != nil && strings.Contains(err.Error(), "/secret") {
			t.Errorf("%s: the error names the path: %v", tc.what, err)
		}
	}
	if got := reasons(t, f.st, "lease.issued", "allowed"); len(got) != 0 {
		t.Fatalf("issued %q", got)
	}
	// Refusals go on the log (the same one repeated within the
	// throttle's window once; an unavailable credential is no refusal).
	if got := reasons(t, f.st, "lease.issued", "denied"); len(got) < 12 {
		t.Fatalf("%d refusals on the log, want one for each kind", len(got))
	}
}

// TestBrokeredRevoke: the executor holding a brokered lease revokes it;
// another executor may not, nor the publisher; an approver may.
func TestBrokeredRevoke(t *testing.T) {
	f := setup(t)
	ctx := t.Context()
	certA, _ := f.holder(t, execA)
	f.job(t, "j1", store.StateRunning, execA, "github,npm")
	gh, err := f.leases.Lease(ctx, execA, certA, brokered("j1", "github", 0))
	if err != nil {
		t.Fatal(err)
	}
	npm, err := f.leases.Lease(ctx, execA, certA, brokered("j1", "npm", 0))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.leases.Revoke(ctx, execB, gh.Lease.ID, "not mine")
	wantErr(t, "another executor", err, errdefs.ErrPermissionDenied, "may not revoke")
	_, err = f.leases.Revoke(ctx, publisher, gh.Lease.ID, "not mine")
	wantErr(t, "the publisher", err, errdefs.ErrPermissionDenied, "may not revoke")
	l, err := f.leases.Revoke(ctx, execA, gh.Lease.ID, "the job's proxy stopped")
	if err != nil || l.ID != gh.Lease.ID {
		t.Fatalf("the holder's revoke = %+v, %v", l, err)
	}
	// An approver is told what ends a brokered lease: its revocation
	// would not reach the job's proxy, which holds the value.
	_, err = f.leases.Revoke(ctx, alice, npm.Lease.ID, "suspicious")
	wantErr(t, "an approver", err, errdefs.ErrFailedPrecondition, "cancel the job")
	if active, _, _ := f.leases.List(ctx, alice, leases.Query{JobID: "j1"}); len(active) != 1 || active[0].ID != npm.Lease.ID {
		t.Fatalf("active after revokes = %+v", active)
	}
}

// TestBrokeredEndsWithTheJob: the sweep revokes the brokered leases of
// jobs that ended, any way they ended, and only theirs.
func TestBrokeredEndsWithTheJob(t *testing.T) {
	f := setup(t)
	ctx := t.Context()
	certA, _ := f.holder(t, execA)
	for _, id := range []string{"run", "fin", "fail", "cancel"} {
		f.job(t, id, store.StateRunning, execA, "github")
		if _, err := f.leases.Lease(ctx, execA, certA, brokered(id, "github", 0)); err != nil {
			t.Fatal(err)
		}
	}
	f.end(t, "fin", store.StateFinished)
	f.end(t, "fail", store.StateFailed)
	f.end(t, "cancel", store.StateCancelled)
	f.add(time.Minute)
	if n, err := f.leases.Sweep(ctx, authority); err != nil || n != 3 {
		t.Fatalf("sweep = %d, %v; want 3", n, err)
	}
	active, _, err := f.leases.List(ctx, alice, leases.Query{})
	if err != nil || len(active) != 1 || active[0].JobID != "run" {
		t.Fatalf("active = %+v, %v; want the running job's only", active, err)
	}
	all, _, _ := f.leases.List(ctx, alice, leases.Query{JobID: "fail", IncludeInactive: true})
	if len(all) != 1 || all[0].RevokeReason != "job fail ended (failed)" {
		t.Fatalf("fail's lease = %+v", all)
	}
	got := reasons(t, f.st, "lease.revoked", "allowed")
	if len(got) != 3 || !strings.Contains(strings.Join(got, "|"), "job cancel ended (cancelled)") {
		t.Fatalf("revoked reasons = %q", got)
	}
	if n, err := f.leases.Sweep(ctx, authority); err != nil || n != 0 {
		t.Fatalf("second sweep = %d, %v", n, err)
	}
}

// TestBrokeredEndsWithTheExecutorProcess: the leases an executor held
// before it restarted end; those it leased since, and another
// executor's, stay.
func TestBrokeredEndsWithTheExecutorProcess(t *testing.T) {
	f := setup(t)
	ctx := t.Context()
	certA, _ := f.holder(t, execA)
	certB, _ := f.holder(t, execB)
	f.job(t, "a1", store.StateRunning, execA, "github,npm")
	f.job(t, "b1", store.StateRunning, execB, "github")
	for _, name := range []string{"github", "npm"} {
		if _, err := f.leases.Lease(ctx, execA, certA, brokered("a1", name, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.leases.Lease(ctx, execB, certB, brokered("b1", "github", 0)); err != nil {
		t.Fatal(err)
	}
	f.add(time.Minute)
	started := f.clock()
	f.add(time.Second)
	kept, err := f.leases.Lease(ctx, execA, certA, brokered("a1", "npm", 0)) // replaces the old npm lease
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.leases.RevokeRestarted(ctx, authority, execA.String(), "a", started); err != nil || n != 1 {
		t.Fatalf("RevokeRestarted = %d, %v; want 1 (github; npm was replaced)", n, err)
	}
	active, _, err := f.leases.List(ctx, alice, leases.Query{})
	if err != nil || len(active) != 2 {
		t.Fatalf("active = %+v, %v", active, err)
	}
	for _, l := range active {
		if l.Holder == execA.String() && l.ID != kept.Lease.ID {
			t.Errorf("executor a's lease %s from before its restart is active", l.ID)
		}
	}
	if got := reasons(t, f.st, "lease.revoked", "allowed"); !strings.Contains(strings.Join(got, "|"), "executor a restarted") {
		t.Fatalf("revoked reasons = %q", got)
	}
}
