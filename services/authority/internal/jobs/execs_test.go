package jobs

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

// unreached stand in for the boundaries the exec records never cross:
// calling one panics on its nil interface.
type (
	unreachedSource    struct{ Source }
	unreachedSigner    struct{ Signer }
	unreachedFleet     struct{ Fleet }
	unreachedExecutors struct{ Executors }
)

func newExecService(t *testing.T) *Service {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Source: unreachedSource{}, Signer: unreachedSigner{}, Fleet: unreachedFleet{}, Executors: unreachedExecutors{}, GrantTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestExecRecordsInTheDomain: a request is recorded with a bounded summary
// and a digest of each field; none and an empty environment are one;
// another spec under a used id is refused naming the field; a report
// never moves a record back.
func TestExecRecordsInTheDomain(t *testing.T) {
	s := newExecService(t)
	ctx := t.Context()
	dev := identity.MustParse("spiffe://airlock.test/client/dev")
	j := store.Job{ID: "s1", Tenant: "dev"}
	long := ExecSpec{ID: "long", Argv: []string{"echo", strings.Repeat("x", 5000)}, Env: map[string]string{}}
	x, created, err := s.RequestExec(ctx, dev, j, long, nil)
	if err != nil || !created || x.State != store.ExecRequested || x.ExitCode != -1 || x.RequestedBy != dev.String() {
		t.Fatalf("RequestExec: %+v, %v, %v", x, created, err)
	}
	if spec, cut := ExecRecordSpec(x); !cut || len(spec.Argv) != 1 || len(x.Summary) > 2*execSummaryBytes {
		t.Fatalf("the record of a 5000-byte argv keeps %d bytes, cut %v", len(x.Summary), cut)
	}
	long.Env = nil
	if _, created, err := s.RequestExec(ctx, dev, j, long, nil); err != nil || created {
		t.Fatalf("a retry (no environment for an empty one): created %v, %v", created, err)
	}
	for _, tc := range []struct {
		field string
		spec  ExecSpec
		stdin []byte
	}{
		{"spec.argv", ExecSpec{ID: "long", Argv: []string{"echo", strings.Repeat("x", 5001)}}, nil},
		{"spec.env", ExecSpec{ID: "long", Argv: long.Argv, Env: map[string]string{"A": "b"}}, nil},
		{"spec.timeout", ExecSpec{ID: "long", Argv: long.Argv, Timeout: time.Second}, nil},
		{"spec.stdin", ExecSpec{ID: "long", Argv: long.Argv}, []byte("x")},
	} {
		if _, _, err := s.RequestExec(ctx, dev, j, tc.spec, tc.stdin); !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("another %s under a used id: %v", tc.field, err)
		}
	}
	if _, _, err := s.RequestExec(ctx, dev, j, ExecSpec{ID: "a/b", Argv: []string{"true"}}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "spec.exec_id") {
		t.Errorf("a malformed exec id: %v", err)
	}

	ended := ExecSeen{Spec: long, Seq: 1, Ended: true, Reason: "exited", ExitCode: 0, StartedAt: time.Now(), EndedAt: time.Now(), StdoutSize: 5002}
	if err := s.ObserveExec(ctx, j.ID, ended); err != nil {
		t.Fatal(err)
	}
	stale := ended
	stale.Ended, stale.Reason, stale.ExitCode, stale.StdoutSize = false, "", -1, 10
	if err := s.ObserveExec(ctx, j.ID, stale); err != nil {
		t.Fatal(err)
	}
	x, err = s.Exec(ctx, j, "long")
	if err != nil || x.State != store.ExecEnded || x.Reason != "exited" || x.ExitCode != 0 || x.StdoutSize != 5002 || x.Seq != 1 {
		t.Fatalf("after an older report: %+v, %v", x, err)
	}
	if list, total, err := s.Execs(ctx, j, 10); err != nil || total != 1 || len(list) != 1 {
		t.Fatalf("Execs: %v of %d, %v", list, total, err)
	}
}

// TestExecRecordStreamedStdin: a streamed stdin is its own spec (a retry
// without the stream is refused naming spec.stdin), recorded as a stream
// with no size until the executor reports the ended exec's, which the
// record then keeps.
func TestExecRecordStreamedStdin(t *testing.T) {
	s := newExecService(t)
	ctx := t.Context()
	dev := identity.MustParse("spiffe://airlock.test/client/dev")
	j := store.Job{ID: "s1", Tenant: "dev"}
	spec := ExecSpec{ID: "fed", Argv: []string{"cat"}, StdinStream: true}
	x, _, err := s.RequestExec(ctx, dev, j, spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := ExecRecordSpec(x); !got.StdinStream || got.StdinSize != 0 || got.StdinSHA256 != "" {
		t.Fatalf("a streamed exec's request recorded stdin %+v", got)
	}
	if _, created, err := s.RequestExec(ctx, dev, j, spec, nil); err != nil || created {
		t.Fatalf("a retry with the stream: created %v, %v", created, err)
	}
	bytesSpec := spec
	bytesSpec.StdinStream = false
	if _, _, err := s.RequestExec(ctx, dev, j, bytesSpec, nil); !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "spec.stdin") {
		t.Fatalf("a retry without the stream: %v, want AlreadyExists naming spec.stdin", err)
	}
	seen := spec
	seen.StdinSize, seen.StdinSHA256 = 5, strings.Repeat("ab", 32)
	if err := s.ObserveExec(ctx, j.ID, ExecSeen{Spec: seen, Seq: 1, Ended: true, Reason: "exited", StartedAt: time.Now(), EndedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	x, err = s.Exec(ctx, j, "fed")
	if got, _ := ExecRecordSpec(x); err != nil || !got.StdinStream || got.StdinSize != 5 || got.StdinSHA256 != seen.StdinSHA256 {
		t.Fatalf("after the ended report: %+v, %v", got, err)
	}
	if _, created, err := s.RequestExec(ctx, dev, j, spec, nil); err != nil || created {
		t.Fatalf("a retry with the stream after the end: created %v, %v", created, err)
	}
}

// TestObservingRecordsTheEndFirst: a stream's report of an exec's end is
// in the authority's record before the caller hears of it; a report of
// its start reaches the record without the caller waiting on it. (That a
// start written after the end leaves the record ended is ObserveExec's:
// TestExecRecordsInTheDomain.)
func TestObservingRecordsTheEndFirst(t *testing.T) {
	s, j, started, ended := requestedExec(t, "a")
	ctx := t.Context()
	var heard []store.ExecState
	fn := s.observing(ctx, j.ID, func(ev ExecEvent) error {
		x, err := s.Exec(ctx, j, "a")
		if err != nil {
			return err
		}
		heard = append(heard, x.State)
		return nil
	})
	if err := fn(ExecEvent{Started: true, Exec: &started}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		x, err := s.Exec(ctx, j, "a")
		if err != nil {
			t.Fatal(err)
		}
		if x.State == store.ExecRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the start never reached the record: %+v", x)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := fn(ExecEvent{Exec: &ended}); err != nil {
		t.Fatal(err)
	}
	if len(heard) != 2 || heard[1] != store.ExecEnded {
		t.Fatalf("the records when the caller heard of the start and the end: %v", heard)
	}
}

// TestObservingShortExec: an exec that ends within startObserveDelay of
// its start is recorded once, ended, and its start, dropped, never moves
// the record back to running.
func TestObservingShortExec(t *testing.T) {
	s, j, started, ended := requestedExec(t, "b")
	ctx := t.Context()
	fn := s.observing(ctx, j.ID, func(ExecEvent) error { return nil })
	if err := fn(ExecEvent{Started: true, Exec: &started}); err != nil {
		t.Fatal(err)
	}
	if x, err := s.Exec(ctx, j, "b"); err != nil || x.State != store.ExecRequested {
		t.Fatalf("just started: %+v, %v; want the record as requested (the start is held back)", x, err)
	}
	if err := fn(ExecEvent{Exec: &ended}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * startObserveDelay)
	if x, err := s.Exec(ctx, j, "b"); err != nil || x.State != store.ExecEnded || x.Seq != 1 {
		t.Fatalf("after the end and %s: %+v, %v; want ended", 3*startObserveDelay, x, err)
	}
}

// requestedExec is an exec service with exec id (`true`) requested in
// session s1 of tenant dev, and the executor's reports of its start and
// its end.
func requestedExec(t *testing.T, id string) (s *Service, j store.Job, started, ended ExecSeen) {
	t.Helper()
	s = newExecService(t)
	dev := identity.MustParse("spiffe://airlock.test/client/dev")
	j = store.Job{ID: "s1", Tenant: "dev"}
	spec := ExecSpec{ID: id, Argv: []string{"true"}}
	if _, _, err := s.RequestExec(t.Context(), dev, j, spec, nil); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	started = ExecSeen{Spec: spec, Seq: 1, ExitCode: -1, StartedAt: now}
	ended = ExecSeen{Spec: spec, Seq: 1, Ended: true, Reason: "exited", ExitCode: 0, StartedAt: now, EndedAt: now}
	return s, j, started, ended
}
