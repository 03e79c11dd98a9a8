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

var execTests = []conformance{
	{"ExecCreateOnce", testExecCreate},
	{"ExecCreateRefusalWritesNothing", testExecCreateRefused},
	{"ExecConcurrentCreateAcrossStores", testExecCreateRace},
	{"ExecUpdate", testExecUpdate},
	{"ExecListLastOldestFirst", testExecList},
}

// NewExec returns a requested exec of session sid with every field set,
// asked at base+n seconds.
func NewExec(sid, id string, n int) store.Exec {
	at := base.Add(time.Duration(n) * time.Second)
	return store.Exec{
		SessionID: sid, ExecID: id, SpecDigest: "sha256:spec-" + id, Summary: []byte(`{"argv":["make","` + id + `"]}`),
		State: store.ExecRequested, ExitCode: -1, RequestedBy: "spiffe://airlock.test/client/dev", RequestedAt: at, UpdatedAt: at,
	}
}

func execEvent(x store.Exec) audit.Event {
	return audit.Event{Kind: audit.KindExecRequested, Caller: "spiffe://airlock.test/client/dev", Subject: x.SessionID, Tenant: "dev",
		Outcome: "allowed", Reason: "exec " + x.ExecID}
}

func equalExecs(a, b store.Exec) error {
	if a.SessionID != b.SessionID || a.ExecID != b.ExecID || a.Seq != b.Seq || a.SpecDigest != b.SpecDigest || string(a.Summary) != string(b.Summary) ||
		a.State != b.State || a.Reason != b.Reason || a.ExitCode != b.ExitCode || a.Message != b.Message || a.RequestedBy != b.RequestedBy ||
		!a.RequestedAt.Equal(b.RequestedAt) || !a.StartedAt.Equal(b.StartedAt) || !a.EndedAt.Equal(b.EndedAt) ||
		a.StdoutSize != b.StdoutSize || a.StderrSize != b.StderrSize || a.StdoutTruncated != b.StdoutTruncated || a.StderrTruncated != b.StderrTruncated ||
		a.StdoutSHA256 != b.StdoutSHA256 || a.StderrSHA256 != b.StderrSHA256 || !a.UpdatedAt.Equal(b.UpdatedAt) || a.Version != b.Version {
		return fmt.Errorf("exec records differ:\n%+v\n%+v", a, b)
	}
	return nil
}

// testExecCreate: an exec is recorded once with its audit entry; the same
// ids again hand the stored record to the caller's check, write nothing
// but the entry it returns, and survive a restart.
func testExecCreate(t *testing.T, open Opener) {
	s := open(t)
	x := NewExec("s1", "build", 1)
	var saw []*store.Exec
	got, created, err := s.CreateExecAudited(ctx(t), x, func(existing *store.Exec) (audit.Event, error) {
		saw = append(saw, existing)
		return execEvent(x), nil
	})
	if err != nil || !created || len(saw) != 1 || saw[0] != nil {
		t.Fatalf("first CreateExecAudited: created %v, %v, existing %v", created, err, saw)
	}
	x.Version = 1
	if err := equalExecs(got, x); err != nil {
		t.Fatal(err)
	}
	again := NewExec("s1", "build", 2)
	again.SpecDigest = "sha256:other"
	got2, created, err := s.CreateExecAudited(ctx(t), again, func(existing *store.Exec) (audit.Event, error) {
		if existing == nil || existing.SpecDigest != x.SpecDigest {
			return audit.Event{}, fmt.Errorf("existing = %+v", existing)
		}
		return execEvent(x), nil
	})
	if err != nil || created {
		t.Fatalf("second CreateExecAudited: created %v, %v", created, err)
	}
	if err := equalExecs(got2, x); err != nil {
		t.Fatalf("the second request changed the record: %v", err)
	}
	if n := countKind(t, s, audit.KindExecRequested); n != 2 {
		t.Fatalf("%d exec.requested entries, want 2 (one per request)", n)
	}
	s.Close()
	s = open(t)
	stored, err := s.GetExec(ctx(t), "s1", "build")
	if err != nil {
		t.Fatal(err)
	}
	if err := equalExecs(stored, x); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if _, err := s.GetExec(ctx(t), "s1", "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetExec of an unknown exec: %v", err)
	}
	if _, err := s.GetExec(ctx(t), "s2", "build"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetExec in another session: %v", err)
	}
}

// testExecCreateRefused: a check that refuses writes neither the record
// nor the audit entry; an invalid entry refuses the record too.
func testExecCreateRefused(t *testing.T, open Opener) {
	s := open(t)
	no := errors.New("refused")
	if _, _, err := s.CreateExecAudited(ctx(t), NewExec("s1", "a", 1), func(*store.Exec) (audit.Event, error) { return audit.Event{}, no }); !errors.Is(err, no) {
		t.Fatalf("a refused create: %v", err)
	}
	bad := execEvent(NewExec("s1", "a", 1))
	bad.Kind = ""
	if _, _, err := s.CreateExecAudited(ctx(t), NewExec("s1", "a", 1), func(*store.Exec) (audit.Event, error) { return bad, nil }); err == nil {
		t.Fatal("a create with an invalid audit entry succeeded")
	}
	if _, err := s.GetExec(ctx(t), "s1", "a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a refused exec was recorded: %v", err)
	}
	if n := countKind(t, s, audit.KindExecRequested); n != 0 {
		t.Fatalf("%d exec.requested entries for refused creates", n)
	}
	x := NewExec("s1", "a", 1)
	x.State = "lost"
	if _, _, err := s.CreateExecAudited(ctx(t), x, func(*store.Exec) (audit.Event, error) { return execEvent(x), nil }); err == nil {
		t.Fatal("an exec in an unknown state was recorded")
	}
}

// testExecCreateRace: two replicas recording one exec id at once create it
// once.
func testExecCreateRace(t *testing.T, open Opener) {
	a, b := open(t), open(t)
	var wg sync.WaitGroup
	created := make([]bool, 8)
	errs := make([]error, 8)
	for i := range created {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			x := NewExec("s1", "once", i)
			_, created[i], errs[i] = s.CreateExecAudited(ctx(t), x, func(*store.Exec) (audit.Event, error) { return execEvent(x), nil })
		}()
	}
	wg.Wait()
	n := 0
	for i := range created {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if created[i] {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d creates of one exec id succeeded, want 1", n)
	}
}

// testExecUpdate: an update changes a record with its version, a refused
// one writes nothing, and an exec first seen in an update is created.
func testExecUpdate(t *testing.T, open Opener) {
	s := open(t)
	x := NewExec("s1", "test", 1)
	if _, _, err := s.CreateExecAudited(ctx(t), x, func(*store.Exec) (audit.Event, error) { return execEvent(x), nil }); err != nil {
		t.Fatal(err)
	}
	end := base.Add(time.Minute)
	got, err := s.UpdateExec(ctx(t), "s1", "test", func(r *store.Exec, found bool) error {
		if !found || r.SpecDigest != x.SpecDigest {
			return fmt.Errorf("found %v, %+v", found, r)
		}
		r.Seq, r.State, r.Reason, r.ExitCode, r.Message = 3, store.ExecEnded, "exited", 1, "exited with status 1"
		r.StartedAt, r.EndedAt, r.UpdatedAt = base.Add(time.Second), end, end
		r.StdoutSize, r.StderrSize, r.StdoutTruncated, r.StdoutSHA256, r.StderrSHA256 = 10, 20, true, "aa", "bb"
		r.SessionID = "elsewhere" // ignored
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := x
	want.Seq, want.State, want.Reason, want.ExitCode, want.Message = 3, store.ExecEnded, "exited", 1, "exited with status 1"
	want.StartedAt, want.EndedAt, want.UpdatedAt = base.Add(time.Second), end, end
	want.StdoutSize, want.StderrSize, want.StdoutTruncated, want.StdoutSHA256, want.StderrSHA256 = 10, 20, true, "aa", "bb"
	want.Version = 2
	if err := equalExecs(got, want); err != nil {
		t.Fatal(err)
	}
	if stored, err := s.GetExec(ctx(t), "s1", "test"); err != nil || equalExecs(stored, want) != nil {
		t.Fatalf("stored after the update: %+v, %v", stored, err)
	}
	no := errors.New("no")
	if _, err := s.UpdateExec(ctx(t), "s1", "test", func(r *store.Exec, _ bool) error { r.State = store.ExecRunning; return no }); !errors.Is(err, no) {
		t.Fatalf("a refused update: %v", err)
	}
	if stored, _ := s.GetExec(ctx(t), "s1", "test"); stored.State != store.ExecEnded || stored.Version != 2 {
		t.Fatalf("a refused update wrote: %+v", stored)
	}
	// First seen in an update: created; refused: nothing.
	if _, err := s.UpdateExec(ctx(t), "s1", "seen", func(r *store.Exec, found bool) error { return no }); !errors.Is(err, no) {
		t.Fatal(err)
	}
	if _, err := s.GetExec(ctx(t), "s1", "seen"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a refused first sighting was recorded: %v", err)
	}
	seen, err := s.UpdateExec(ctx(t), "s1", "seen", func(r *store.Exec, found bool) error {
		if found || r.SessionID != "s1" || r.ExecID != "seen" || r.Version != 0 {
			return fmt.Errorf("first sighting: found %v, %+v", found, r)
		}
		r.State, r.Seq, r.RequestedAt, r.StartedAt = store.ExecRunning, 4, end, end
		return nil
	})
	if err != nil || seen.Version != 1 || seen.State != store.ExecRunning {
		t.Fatalf("first sighting: %+v, %v", seen, err)
	}
	if _, err := s.UpdateExec(ctx(t), "s1", "seen", func(r *store.Exec, _ bool) error { r.State = "lost"; return nil }); err == nil {
		t.Fatal("an update to an unknown state was written")
	}
}

// testExecList: a session's last execs, oldest first, with their total;
// other sessions' are not among them.
func testExecList(t *testing.T, open Opener) {
	s := open(t)
	for i, id := range []string{"e1", "e2", "e3", "e4", "e5"} {
		x := NewExec("s1", id, i)
		if _, _, err := s.CreateExecAudited(ctx(t), x, func(*store.Exec) (audit.Event, error) { return execEvent(x), nil }); err != nil {
			t.Fatal(err)
		}
	}
	o := NewExec("s2", "e9", 9)
	if _, _, err := s.CreateExecAudited(ctx(t), o, func(*store.Exec) (audit.Event, error) { return execEvent(o), nil }); err != nil {
		t.Fatal(err)
	}
	list, total, err := s.ListExecs(ctx(t), "s1", 3)
	if err != nil {
		t.Fatal(err)
	}
	if total != 5 || len(list) != 3 || list[0].ExecID != "e3" || list[1].ExecID != "e4" || list[2].ExecID != "e5" {
		ids := []string{}
		for _, x := range list {
			ids = append(ids, x.ExecID)
		}
		t.Fatalf("ListExecs(s1, 3) = %v of %d, want [e3 e4 e5] of 5", ids, total)
	}
	if list, total, err := s.ListExecs(ctx(t), "none", 10); err != nil || total != 0 || len(list) != 0 {
		t.Fatalf("an unknown session: %v of %d, %v", list, total, err)
	}
}
