package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

var forwardTests = []conformance{
	{"ForwardCreateGetList", testForwardCreate},
	{"ForwardMaxOpenAcrossStores", testForwardMaxOpen},
	{"ForwardUpdateAndTraffic", testForwardUpdate},
	{"ForwardsToEnd", testForwardsToEnd},
	{"WithdrawApproval", testWithdrawApproval},
}

// NewForward returns an open forward of session sid created at base+n
// seconds, living an hour.
func NewForward(tenant, sid, id string, n int) store.PortForward {
	at := base.Add(time.Duration(n) * time.Second)
	return store.PortForward{ID: id, SessionID: sid, Tenant: tenant, Requester: "spiffe://airlock.test/client/dev",
		Port: 8000, State: store.ForwardOpen, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
}

func forwardEvent(f store.PortForward) audit.Event {
	return audit.Event{Kind: audit.KindForwardOpened, Caller: f.Requester, Subject: f.ID, Outcome: audit.OutcomeAllowed, Reason: "test"}
}

func testForwardCreate(t *testing.T, open Opener) {
	s := open(t)
	f := NewForward("dev", "s1", "f1", 1)
	got, err := s.CreatePortForwardAudited(ctx(t), f, 8, forwardEvent(f))
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 || got.Port != 8000 || got.State != store.ForwardOpen || !got.CreatedAt.Equal(f.CreatedAt) || got.Tenant != "dev" {
		t.Fatalf("created %+v", got)
	}
	if _, err := s.CreatePortForwardAudited(ctx(t), f, 8, forwardEvent(f)); err == nil {
		t.Fatal("the same id twice was recorded")
	}
	if _, err := s.GetPortForward(ctx(t), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown forward: %v", err)
	}
	g := NewForward("dev", "s2", "f2", 2)
	if _, err := s.CreatePortForwardAudited(ctx(t), g, 8, forwardEvent(g)); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListPortForwards(ctx(t), store.ForwardFilter{Tenant: "dev", Limit: 10})
	if err != nil || len(list) != 2 || list[0].ID != "f2" || list[1].ID != "f1" {
		t.Fatalf("tenant's list = %+v, %v; want f2, f1", list, err)
	}
	list, err = s.ListPortForwards(ctx(t), store.ForwardFilter{SessionID: "s1", Limit: 10})
	if err != nil || len(list) != 1 || list[0].ID != "f1" {
		t.Fatalf("session's list = %+v, %v", list, err)
	}
	list, err = s.ListPortForwards(ctx(t), store.ForwardFilter{Tenant: "dev", States: []store.ForwardState{store.ForwardClosed}, Limit: 10})
	if err != nil || len(list) != 0 {
		t.Fatalf("closed ones = %+v, %v", list, err)
	}
	events, err := s.ListAudit(ctx(t), store.AuditFilter{Kind: audit.KindForwardOpened, Limit: 10})
	if err != nil || len(events) != 2 || events[0].JobID != "s1" || events[0].Tenant != "dev" {
		t.Fatalf("audit = %+v, %v", events, err)
	}
}

// testForwardMaxOpen: replicas creating at once never pass max_open.
func testForwardMaxOpen(t *testing.T, open Opener) {
	a, b := open(t), open(t)
	const tries, maxOpen = 12, 3
	var wg sync.WaitGroup
	errs := make([]error, tries)
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			f := NewForward("dev", "s1", fmt.Sprintf("f%d", i), i)
			_, errs[i] = s.CreatePortForwardAudited(ctx(t), f, maxOpen, forwardEvent(f))
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errdefs.ErrResourceExhausted):
			t.Fatalf("refusal = %v, want resource exhausted", err)
		}
	}
	if ok != maxOpen {
		t.Fatalf("%d created, want %d", ok, maxOpen)
	}
	// Another tenant has room of its own; a closed one frees a place.
	f := NewForward("other", "s9", "o1", 1)
	if _, err := a.CreatePortForwardAudited(ctx(t), f, maxOpen, forwardEvent(f)); err != nil {
		t.Fatal(err)
	}
	list, _ := a.ListPortForwards(ctx(t), store.ForwardFilter{Tenant: "dev", Limit: 10})
	if _, err := a.UpdatePortForwardAudited(ctx(t), list[0].ID, func(f *store.PortForward) (*audit.Event, error) {
		f.State = store.ForwardClosed
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	g := NewForward("dev", "s1", "again", 20)
	if _, err := b.CreatePortForwardAudited(ctx(t), g, maxOpen, forwardEvent(g)); err != nil {
		t.Fatalf("after a close: %v", err)
	}
}

func testForwardUpdate(t *testing.T, open Opener) {
	s := open(t)
	f := NewForward("dev", "s1", "f1", 1)
	f.State = store.ForwardPending
	if _, err := s.CreatePortForwardAudited(ctx(t), f, 8, forwardEvent(f)); err != nil {
		t.Fatal(err)
	}
	no := errors.New("no")
	if _, err := s.UpdatePortForwardAudited(ctx(t), "f1", func(f *store.PortForward) (*audit.Event, error) {
		f.State = store.ForwardClosed
		return nil, no
	}); !errors.Is(err, no) {
		t.Fatalf("update's own error = %v", err)
	}
	if err := s.AddForwardTraffic(ctx(t), "f1", 1, 10, 20); err != nil {
		t.Fatal(err)
	}
	if err := s.AddForwardTraffic(ctx(t), "f1", 0, 5, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.AddForwardTraffic(ctx(t), "nope", 1, 1, 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("traffic of an unknown forward: %v", err)
	}
	closed := base.Add(time.Minute)
	got, err := s.UpdatePortForwardAudited(ctx(t), "f1", func(f *store.PortForward) (*audit.Event, error) {
		f.State, f.ClosedAt, f.CloseReason, f.ApprovalID = store.ForwardClosed, closed, "denied", "a1"
		f.BytesIn = 999 // not the update's to write
		return &audit.Event{Kind: audit.KindForwardClosed, Caller: "c", Subject: f.ID, Outcome: audit.OutcomeAllowed}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.ForwardClosed || !got.ClosedAt.Equal(closed) || got.CloseReason != "denied" || got.ApprovalID != "a1" ||
		got.Connections != 1 || got.BytesIn != 15 || got.BytesOut != 20 {
		t.Fatalf("updated = %+v", got)
	}
	events, err := s.ListAudit(ctx(t), store.AuditFilter{Kind: audit.KindForwardClosed, Limit: 10})
	if err != nil || len(events) != 1 || events[0].JobID != "s1" {
		t.Fatalf("audit = %+v, %v", events, err)
	}
}

func testForwardsToEnd(t *testing.T, open Opener) {
	s := open(t)
	running := NewJob("dev", "live", 1)
	running.State = store.StateRunning
	mustCreate(t, s, running)
	ended := NewJob("dev", "gone", 2)
	ended.State = store.StateFinished
	mustCreate(t, s, ended)
	for _, f := range []store.PortForward{
		NewForward("dev", "live", "keep", 1),
		NewForward("dev", "gone", "ended", 2),
		NewForward("dev", "live", "expired", -7200),
	} {
		if _, err := s.CreatePortForwardAudited(ctx(t), f, 8, forwardEvent(f)); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.ForwardsToEnd(ctx(t), base.Add(time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range list {
		got[f.ID] = true
	}
	if len(list) != 2 || !got["ended"] || !got["expired"] {
		t.Fatalf("to end = %v, want ended and expired", got)
	}
}

// A pending forward's approval is withdrawn (expired) once, with its
// event; a decided one is left alone.
func testWithdrawApproval(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 1))
	a := NewApproval("dev", "a1", "j1", 1)
	mustApproval(t, s, a)
	event := func(a store.Approval) audit.Event {
		return audit.Event{Kind: audit.KindApprovalExpired, Subject: a.ID, Outcome: audit.OutcomeAllowed, Reason: "withdrawn"}
	}
	if done, err := s.WithdrawApprovalAudited(ctx(t), "a1", event); err != nil || !done {
		t.Fatalf("withdraw = %v, %v", done, err)
	}
	if got, err := s.GetApproval(ctx(t), "a1"); err != nil || got.State != store.ApprovalExpired {
		t.Fatalf("withdrawn approval = %s, %v", got.State, err)
	}
	if done, err := s.WithdrawApprovalAudited(ctx(t), "a1", event); err != nil || done {
		t.Fatalf("withdrawing again = %v, %v", done, err)
	}
	if done, err := s.WithdrawApprovalAudited(ctx(t), "missing", event); err != nil || done {
		t.Fatalf("withdrawing none = %v, %v", done, err)
	}
	ev, err := s.ListAudit(ctx(t), store.AuditFilter{Kind: audit.KindApprovalExpired, Limit: 10})
	if err != nil || len(ev) != 1 || ev[0].Subject != "a1" {
		t.Fatalf("withdrawal events = %+v, %v", ev, err)
	}
}
