package portforward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/tunnel"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
	"github.com/airlockhq/airlock/services/authority/internal/store/storetest"
)

const td = "airlock.test"

var (
	dev      = mustID(identity.KindClient, "dev")
	otherDev = mustID(identity.KindClient, "dev2")
	stranger = mustID(identity.KindClient, "other")
	alice    = mustID(identity.KindApprover, "alice")
	self     = identity.Service(td, identity.ServiceAuthority)
)

func mustID(k identity.Kind, name string) identity.ID {
	id, err := identity.New(td, k, name)
	if err != nil {
		panic(err)
	}
	return id
}

// fakeSessions answers Session as the jobs package does (the tenant's
// clients only) and ForwardPort with an echo server per connection.
type fakeSessions struct {
	st      store.Store
	tenants policy.Tenants
	mu      sync.Mutex
	dialed  int
	// fail, when set, is ForwardPort's answer (the executor refusing).
	fail error
}

func (f *fakeSessions) Session(ctx context.Context, caller identity.ID, id string) (store.Job, error) {
	j, err := f.st.GetJob(ctx, id)
	if err != nil {
		return store.Job{}, err
	}
	if t := f.tenants[j.Tenant]; t == nil || caller.Kind != identity.KindClient || !t.HasClient(caller.Principal()) {
		return store.Job{}, errdefs.ErrNotFound
	}
	return j, nil
}

func (f *fakeSessions) ForwardPort(ctx context.Context, j store.Job, port uint32, forwardID string) (tunnel.End, error) {
	f.mu.Lock()
	f.dialed++
	fail := f.fail
	f.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	// A TCP pair, so a half-close reaches the echo, which then ends.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer l.Close()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return nil, err
	}
	b, err := l.Accept()
	if err != nil {
		a.Close()
		return nil, err
	}
	go func() {
		defer b.Close()
		io.Copy(b, b)
	}()
	context.AfterFunc(ctx, func() { a.Close() })
	return tunnel.Conn(a), nil
}

type harness struct {
	st   store.Store
	svc  *Service
	now  time.Time
	mu   sync.Mutex
	sess *fakeSessions
}

func (h *harness) clock() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

func (h *harness) advance(d time.Duration) {
	h.mu.Lock()
	h.now = h.now.Add(d)
	h.mu.Unlock()
}

func newHarness(t *testing.T, pf *policy.PortForward) *harness {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tenants := policy.Tenants{
		"dev":   {Name: "dev", Clients: []string{"client/dev", "client/dev2"}, PortForward: pf, Approvals: policy.Approvals{Required: 1, TTL: time.Hour}},
		"other": {Name: "other", Clients: []string{"client/other"}, PortForward: &policy.PortForward{Ports: []policy.PortRange{{First: 1, Last: 65535}}, DefaultTTL: time.Minute, MaxTTL: time.Hour, MaxOpen: 8}},
	}
	h := &harness{st: st, now: time.Now().UTC()}
	h.sess = &fakeSessions{st: st, tenants: tenants}
	h.svc = h.service(t)
	for i, id := range []string{"s1", "s2", "queued"} {
		j := storetest.NewJob("dev", id, i)
		j.State = store.StateRunning
		if id == "queued" {
			j.State = store.StateQueued
		}
		if _, _, err := st.CreateJob(t.Context(), j); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// service is another Service on the same store: another replica.
func (h *harness) service(t *testing.T) *Service {
	t.Helper()
	svc, err := New(Config{Store: h.st, Tenants: h.sess.tenants, Sessions: h.sess, Self: self, Now: h.clock, CheckEvery: 50 * time.Millisecond, FlushEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func basicPolicy() *policy.PortForward {
	return &policy.PortForward{Ports: []policy.PortRange{{First: 3000, Last: 3000}, {First: 8000, Last: 8999}},
		DefaultTTL: 15 * time.Minute, MaxTTL: time.Hour, MaxOpen: 2}
}

func TestOpenRefusals(t *testing.T) {
	h := newHarness(t, basicPolicy())
	ctx := t.Context()
	for _, tc := range []struct {
		name   string
		caller identity.ID
		req    OpenRequest
		want   error
		words  string
	}{
		{"an approver", alice, OpenRequest{SessionID: "s1", Port: 3000}, errdefs.ErrPermissionDenied, "not a client"},
		{"another tenant's client", stranger, OpenRequest{SessionID: "s1", Port: 3000}, errdefs.ErrNotFound, ""},
		{"no session", dev, OpenRequest{Port: 3000}, errdefs.ErrInvalidArgument, "session_id"},
		{"port 0", dev, OpenRequest{SessionID: "s1"}, errdefs.ErrInvalidArgument, "port"},
		{"a port not listed", dev, OpenRequest{SessionID: "s1", Port: 22}, errdefs.ErrPermissionDenied, "port_forward.ports (3000, 8000-8999)"},
		{"a ttl past max_ttl", dev, OpenRequest{SessionID: "s1", Port: 3000, TTL: 2 * time.Hour}, errdefs.ErrInvalidArgument, "max_ttl"},
		{"a session not running", dev, OpenRequest{SessionID: "queued", Port: 3000}, errdefs.ErrFailedPrecondition, "queued"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.svc.Open(ctx, tc.caller, tc.req)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.words) {
				t.Fatalf("Open = %v, want %v with %q", err, tc.want, tc.words)
			}
		})
	}
	// A tenant without a policy.
	h.sess.tenants["dev"].PortForward = nil
	if _, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000}); !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "no port_forward") {
		t.Fatalf("no policy: %v", err)
	}
	h.sess.tenants["dev"].PortForward = basicPolicy()
	// max_open, then a close makes room.
	a, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000})
	if err != nil || a.State != store.ForwardOpen || !a.ExpiresAt.Equal(h.clock().Truncate(time.Microsecond).Add(15*time.Minute)) {
		t.Fatalf("open = %+v, %v", a, err)
	}
	if _, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s2", Port: 8080}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 8081}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("past max_open: %v", err)
	}
	if _, err := h.svc.Close(ctx, stranger, a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant closing: %v", err)
	}
	if _, err := h.svc.Close(ctx, otherDev, a.ID); err != nil {
		t.Fatalf("another client of the tenant closing: %v", err)
	}
	if _, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 8081}); err != nil {
		t.Fatalf("after a close: %v", err)
	}
	refusals, err := h.st.ListAudit(ctx, store.AuditFilter{Kind: audit.KindForwardRefused, Limit: 100})
	if err != nil || len(refusals) < 8 {
		t.Fatalf("refusals audited: %d, %v", len(refusals), err)
	}
}

// carry starts one connection of forward id as caller and returns its
// user's end once it is connected, and Carry's result.
func carry(t *testing.T, svc *Service, caller identity.ID, id string) (net.Conn, <-chan error) {
	t.Helper()
	user, side := net.Pipe()
	connected := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- svc.Carry(t.Context(), caller, id, func() error { close(connected); return nil }, tunnel.Conn(side))
		side.Close()
	}()
	select {
	case <-connected:
		return user, done
	case err := <-done:
		user.Close()
		ch := make(chan error, 1)
		ch <- err
		return nil, ch
	}
}

func TestCarryCountsAndCloseCuts(t *testing.T) {
	h := newHarness(t, basicPolicy())
	ctx := t.Context()
	f, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	// Only its requester carries.
	if _, done := carry(t, h.svc, otherDev, f.ID); !errors.Is(<-done, errdefs.ErrPermissionDenied) {
		t.Fatal("another client of the tenant carried on the forward")
	}
	if _, done := carry(t, h.svc, stranger, f.ID); !errors.Is(<-done, errdefs.ErrNotFound) {
		t.Fatal("another tenant's client carried on the forward")
	}
	user, done := carry(t, h.svc, dev, f.ID)
	if user == nil {
		t.Fatalf("carry: %v", <-done)
	}
	buf := make([]byte, 5)
	if _, err := user.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(user, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	// Closed through another replica: cut within CheckEvery.
	if _, err := h.service(t).Close(ctx, dev, f.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("Carry ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a close through another replica did not cut the connection")
	}
	if _, done := carry(t, h.svc, dev, f.ID); !errors.Is(<-done, errdefs.ErrFailedPrecondition) {
		t.Fatal("a closed forward carried a new connection")
	}
	got, err := h.st.GetPortForward(ctx, f.ID)
	if err != nil || got.Connections != 1 || got.BytesIn != 5 || got.BytesOut != 5 || got.State != store.ForwardClosed {
		t.Fatalf("record = %+v, %v", got, err)
	}
	conns, _ := h.st.ListAudit(ctx, store.AuditFilter{Kind: audit.KindForwardConnection, Limit: 10})
	if len(conns) != 1 || !strings.Contains(conns[0].Reason, "5 byte(s) in, 5 byte(s) out") {
		t.Fatalf("connection audit = %+v", conns)
	}

	// A close here cuts at once; expiry closes too.
	g, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	user, done = carry(t, h.svc, dev, g.ID)
	if user == nil {
		t.Fatalf("carry: %v", <-done)
	}
	h.advance(2 * time.Minute)
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "expired") {
			t.Fatalf("Carry at expiry ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("expiry did not cut the connection")
	}
	if got, _ := h.st.GetPortForward(ctx, g.ID); got.State != store.ForwardClosed || got.CloseReason != "expired" {
		t.Fatalf("expired record = %+v", got)
	}
}

func TestApprovalAndSweep(t *testing.T) {
	pf := basicPolicy()
	pf.ApprovalRequired = true
	h := newHarness(t, pf)
	ctx := t.Context()
	f, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000})
	if err != nil || f.State != store.ForwardPending || f.ApprovalID == "" {
		t.Fatalf("open = %+v, %v", f, err)
	}
	a, err := h.st.GetApproval(ctx, f.ApprovalID)
	if err != nil || a.Kind != store.KindPortForward || a.JobID != "s1" || a.Requester != dev.String() {
		t.Fatalf("approval = %+v, %v", a, err)
	}
	r, err := DecodeRequest(a.Change)
	if err != nil || r.ForwardID != f.ID || r.Port != 3000 || r.TTL != 15*time.Minute {
		t.Fatalf("request = %+v, %v", r, err)
	}
	if _, done := carry(t, h.svc, dev, f.ID); !errors.Is(<-done, errdefs.ErrFailedPrecondition) {
		t.Fatal("a pending forward carried a connection")
	}
	vote := func(id, decision string) {
		t.Helper()
		if _, err := h.st.DecideApprovalAudited(ctx, id, func(a *store.Approval) (store.Vote, audit.Event, error) {
			a.State = store.ApprovalApproved
			if decision == store.DecisionDeny {
				a.State = store.ApprovalDenied
			}
			return store.Vote{Approver: alice.String(), Decision: decision, Comment: "x", DecidedAt: h.clock()},
				audit.Event{Kind: audit.KindApprovalDecided, Caller: alice.String(), Subject: id, Outcome: audit.OutcomeAllowed}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	vote(f.ApprovalID, store.DecisionApprove)
	if n, err := h.svc.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep = %d, %v", n, err)
	}
	got, _ := h.st.GetPortForward(ctx, f.ID)
	if got.State != store.ForwardOpen {
		t.Fatalf("approved = %+v", got)
	}
	if a, _ := h.st.GetApproval(ctx, f.ApprovalID); a.State != store.ApprovalConsumed {
		t.Fatalf("approval once opened = %s", a.State)
	}
	user, done := carry(t, h.svc, dev, f.ID)
	if user == nil {
		t.Fatalf("carry once approved: %v", <-done)
	}
	user.Close()
	<-done

	g, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s2", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	vote(g.ApprovalID, store.DecisionDeny)
	list, err := h.svc.List(ctx, dev, ListRequest{SessionID: "s2"})
	if err != nil || len(list) != 1 || list[0].State != store.ForwardClosed || !strings.Contains(list[0].CloseReason, "denied") {
		t.Fatalf("denied = %+v, %v", list, err)
	}
	// The session ends: its open forward closes at the next sweep.
	if _, err := h.st.UpdateJob(ctx, "s1", func(j *store.Job) error { j.State = store.StateFinished; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, err := h.svc.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after the end = %d, %v", n, err)
	}
	if got, _ := h.st.GetPortForward(ctx, f.ID); got.State != store.ForwardClosed || got.CloseReason != "session ended" {
		t.Fatalf("after the session's end = %+v", got)
	}
	// Listing: the tenant's clients and approvers, never another tenant.
	if _, err := h.svc.List(ctx, stranger, ListRequest{SessionID: "s1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant listing: %v", err)
	}
	if list, err := h.svc.List(ctx, alice, ListRequest{Tenant: "dev"}); err != nil || len(list) != 2 {
		t.Fatalf("an approver listing = %d, %v", len(list), err)
	}
}

// A policy change reaches forwards already open: a new connection is
// refused and the forward closed; the sweep closes the others.
func TestPolicyNoLongerAllows(t *testing.T) {
	h := newHarness(t, basicPolicy())
	ctx := t.Context()
	f, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	g, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s2", Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	h.sess.tenants["dev"].PortForward.Ports = []policy.PortRange{{First: 8000, Last: 8999}}
	if _, done := carry(t, h.svc, dev, f.ID); !errors.Is(<-done, errdefs.ErrPermissionDenied) {
		t.Fatal("a forward to a port the policy no longer lists carried a connection")
	}
	if got, _ := h.st.GetPortForward(ctx, f.ID); got.State != store.ForwardClosed || got.CloseReason != "policy no longer allows port 3000" {
		t.Fatalf("after the refusal = %+v", got)
	}
	if n, err := h.svc.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep while 8080 is allowed = %d, %v", n, err)
	}
	h.sess.tenants["dev"].PortForward = nil
	if n, err := h.svc.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep without port_forward = %d, %v", n, err)
	}
	if got, _ := h.st.GetPortForward(ctx, g.ID); got.State != store.ForwardClosed || got.CloseReason != "policy no longer allows port 8080" {
		t.Fatalf("after the sweep = %+v", got)
	}
}

// A pending forward lasts as long as its approval, not its ttl; closing
// it withdraws the approval.
func TestPendingExpiryAndWithdraw(t *testing.T) {
	pf := basicPolicy()
	pf.ApprovalRequired = true
	h := newHarness(t, pf)
	ctx := t.Context()
	f, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	g, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s2", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	h.advance(20 * time.Minute) // past the 15m ttl, within the 1h approval
	if n, err := h.svc.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep while pending = %d, %v", n, err)
	}
	if got, _ := h.st.GetPortForward(ctx, f.ID); got.State != store.ForwardPending {
		t.Fatalf("pending past its ttl = %+v", got)
	}
	if _, err := h.svc.Close(ctx, dev, f.ID); err != nil {
		t.Fatal(err)
	}
	a, err := h.st.GetApproval(ctx, f.ApprovalID)
	if err != nil || a.State != store.ApprovalExpired {
		t.Fatalf("the closed forward's approval = %s, %v", a.State, err)
	}
	ev, _ := h.st.ListAudit(ctx, store.AuditFilter{Kind: audit.KindApprovalExpired, Limit: 10})
	if len(ev) != 1 || ev[0].Subject != f.ApprovalID || !strings.Contains(ev[0].Reason, "withdrawn") {
		t.Fatalf("withdrawal audit = %+v", ev)
	}
	h.advance(time.Hour)
	if n, err := h.svc.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep past the approval = %d, %v", n, err)
	}
	if got, _ := h.st.GetPortForward(ctx, g.ID); got.State != store.ForwardClosed || !strings.Contains(got.CloseReason, "expired undecided") {
		t.Fatalf("past its approval = %+v", got)
	}
}

// A close here waits for its connections' last bytes: the closed event
// counts them even with no periodic flush yet.
func TestCloseCountsLastBytes(t *testing.T) {
	h := newHarness(t, basicPolicy())
	ctx := t.Context()
	svc, err := New(Config{Store: h.st, Tenants: h.sess.tenants, Sessions: h.sess, Self: self, Now: h.clock, CheckEvery: time.Hour, FlushEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f, err := svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	user, done := carry(t, svc, dev, f.ID)
	if user == nil {
		t.Fatalf("carry: %v", <-done)
	}
	buf := make([]byte, 5)
	if _, err := user.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(user, buf); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Close(ctx, dev, f.ID); err != nil {
		t.Fatal(err)
	}
	<-done
	ev, _ := h.st.ListAudit(ctx, store.AuditFilter{Kind: audit.KindForwardClosed, Limit: 10})
	if len(ev) != 1 || !strings.Contains(ev[0].Reason, "1 connection(s), 5 byte(s) in, 5 byte(s) out") {
		t.Fatalf("closed event = %+v", ev)
	}
}

// A connection the executor refuses is audited, not counted.
func TestFailedConnectionAudited(t *testing.T) {
	h := newHarness(t, basicPolicy())
	ctx := t.Context()
	f, err := h.svc.Open(ctx, dev, OpenRequest{SessionID: "s1", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	h.sess.mu.Lock()
	h.sess.fail = fmt.Errorf("%w: nothing listens on port 3000 in the session", errdefs.ErrFailedPrecondition)
	h.sess.mu.Unlock()
	if _, done := carry(t, h.svc, dev, f.ID); !errors.Is(<-done, errdefs.ErrFailedPrecondition) {
		t.Fatal("a refused connection did not fail")
	}
	ev, _ := h.st.ListAudit(ctx, store.AuditFilter{Kind: audit.KindForwardConnection, Limit: 10})
	if len(ev) != 1 || ev[0].Outcome != audit.OutcomeDenied || !strings.Contains(ev[0].Reason, "nothing listens") {
		t.Fatalf("connection audit = %+v", ev)
	}
	if got, _ := h.st.GetPortForward(ctx, f.ID); got.Connections != 0 {
		t.Fatalf("a refused connection was counted: %+v", got)
	}
}
