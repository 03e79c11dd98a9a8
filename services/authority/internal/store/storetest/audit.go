package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// ReadAudit returns the whole audit log, oldest first, read in pages.
func ReadAudit(t *testing.T, s store.Store) []audit.Event {
	t.Helper()
	var all []audit.Event
	for {
		after := int64(0)
		if len(all) > 0 {
			after = all[len(all)-1].Sequence
		}
		page, err := s.ListAudit(context.Background(), store.AuditFilter{AfterSequence: after, Limit: 500})
		if err != nil {
			t.Fatalf("ListAudit: %v", err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
	}
}

// VerifyAudit reads the whole audit log page by page, checking each page
// as it comes the way an auditor would, and fails t if the chain breaks.
func VerifyAudit(t *testing.T, s store.Store) []audit.Event {
	t.Helper()
	v := audit.NewVerifier()
	var all []audit.Event
	for {
		after, _ := v.Next()
		page, err := s.ListAudit(context.Background(), store.AuditFilter{AfterSequence: after - 1, Limit: 97})
		if err != nil {
			t.Fatalf("ListAudit: %v", err)
		}
		if len(page) == 0 {
			return all
		}
		if i, err := v.Check(page); err != nil {
			t.Fatalf("audit chain broken at sequence %d: %v", page[i].Sequence, err)
		}
		all = append(all, page...)
	}
}

func equalEvents(a, b audit.Event) error {
	if !a.Time.Equal(b.Time) || a.Time.Location() != b.Time.Location() {
		return fmt.Errorf("time %v != %v", a.Time, b.Time)
	}
	a.Time, b.Time = time.Time{}, time.Time{}
	if a != b {
		return fmt.Errorf("%+v != %+v", a, b)
	}
	return nil
}

func testAuditAppend(t *testing.T, open Opener) {
	s := open(t)
	if seq, hash, err := s.AuditHead(ctx(t)); err != nil || seq != 0 || hash != audit.GenesisHash {
		t.Fatalf("head of an empty log: %d %q %v", seq, hash, err)
	}
	before := time.Now().UTC().Truncate(time.Microsecond)
	// The store assigns sequence and hashes whatever the caller put there.
	e1, err := s.AppendAudit(ctx(t), audit.Event{
		Kind: "job.submitted", Caller: "spiffe://airlock.test/client/dev", Subject: "job/j1", Tenant: "dev", JobID: "j1",
		Outcome: "allowed", Reason: "ok", Sequence: 99, PrevHash: "junk", Hash: "junk",
	})
	if err != nil {
		t.Fatal(err)
	}
	if e1.Sequence != 1 || e1.PrevHash != audit.GenesisHash {
		t.Fatalf("first entry: sequence %d, prev %s", e1.Sequence, e1.PrevHash)
	}
	if h, _ := e1.ComputeHash(); e1.Hash != h {
		t.Fatalf("first entry's hash %s, want %s", e1.Hash, h)
	}
	if e1.Time.Before(before) || e1.Time.After(time.Now()) || e1.Time.Location() != time.UTC || !e1.Time.Equal(audit.Normalize(e1.Time)) {
		t.Fatalf("assigned time %v is not now in UTC microseconds", e1.Time)
	}
	given := time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.FixedZone("CEST", 2*3600))
	e2, err := s.AppendAudit(ctx(t), audit.Event{Kind: audit.KindJobCancelled, Time: given})
	if err != nil {
		t.Fatal(err)
	}
	if e2.Sequence != 2 || e2.PrevHash != e1.Hash || !e2.Time.Equal(given.Truncate(time.Microsecond)) || e2.Time.Location() != time.UTC {
		t.Fatalf("second entry: %+v", e2)
	}
	if seq, hash, err := s.AuditHead(ctx(t)); err != nil || seq != 2 || hash != e2.Hash {
		t.Fatalf("head after two entries: %d %q %v, want 2 %q", seq, hash, err, e2.Hash)
	}
	got := VerifyAudit(t, s)
	if len(got) != 2 {
		t.Fatalf("listed %d entries, want 2", len(got))
	}
	for i, want := range []audit.Event{e1, e2} {
		if err := equalEvents(got[i], want); err != nil {
			t.Fatalf("entry %d as read differs from as appended: %v", i+1, err)
		}
	}
}

func testAuditInvalid(t *testing.T, open Opener) {
	s := open(t)
	for name, e := range map[string]audit.Event{
		"no kind":      {Reason: "r"},
		"NUL":          {Kind: "k", Reason: "a\x00b"},
		"invalid UTF8": {Kind: "k", Caller: "\xff\xfe"},
	} {
		if _, err := s.AppendAudit(ctx(t), e); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: AppendAudit = %v, want ErrInvalidArgument", name, err)
		}
	}
	if got := ReadAudit(t, s); len(got) != 0 {
		t.Fatalf("refused events were stored: %+v", got)
	}
	if e, err := s.AppendAudit(ctx(t), audit.Event{Kind: "k"}); err != nil || e.Sequence != 1 {
		t.Fatalf("first good append: %d, %v; want sequence 1", e.Sequence, err)
	}
	if _, err := s.ListAudit(ctx(t), store.AuditFilter{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("ListAudit without a limit = %v, want ErrInvalidArgument", err)
	}
}

// testAuditConcurrent appends 200 events at once through two stores on one
// database, as two replicas would: one chain must come out.
func testAuditConcurrent(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t)}
	const n = 200
	var wg sync.WaitGroup
	appended := make([]audit.Event, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			appended[i], errs[i] = stores[i%2].AppendAudit(ctx(t), audit.Event{Kind: "concurrent", Reason: fmt.Sprint(i)})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got := VerifyAudit(t, stores[1])
	if len(got) != n {
		t.Fatalf("%d entries after %d appends", len(got), n)
	}
	reasons := map[string]bool{}
	for i, e := range appended {
		if e.Sequence < 1 || e.Sequence > n {
			t.Fatalf("append %d got sequence %d", i, e.Sequence)
		}
		if err := equalEvents(got[e.Sequence-1], e); err != nil {
			t.Fatalf("append %d returned what was not stored: %v", i, err)
		}
		reasons[e.Reason] = true
	}
	if len(reasons) != n {
		t.Fatalf("%d distinct entries, want %d", len(reasons), n)
	}
}

func testAuditList(t *testing.T, open Opener) {
	s := open(t)
	var all []audit.Event
	for i := range 12 {
		e, err := s.AppendAudit(ctx(t), audit.Event{
			Kind: []string{"job.submitted", "rpc.denied"}[i%2], Caller: fmt.Sprintf("spiffe://airlock.test/client/c%d", i%3),
			Tenant: []string{"dev", "ops"}[i%2], JobID: fmt.Sprintf("j%d", i%4), Time: base.Add(time.Duration(i) * time.Second),
		})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
	}
	at := func(i int) time.Time { return base.Add(time.Duration(i) * time.Second) }
	for _, tc := range []struct {
		name string
		f    store.AuditFilter
		keep func(e audit.Event) bool
	}{
		{"all", store.AuditFilter{}, func(audit.Event) bool { return true }},
		{"job", store.AuditFilter{JobID: "j1"}, func(e audit.Event) bool { return e.JobID == "j1" }},
		{"tenant", store.AuditFilter{Tenant: "ops"}, func(e audit.Event) bool { return e.Tenant == "ops" }},
		{"caller", store.AuditFilter{Caller: "spiffe://airlock.test/client/c2"}, func(e audit.Event) bool { return strings.HasSuffix(e.Caller, "c2") }},
		{"kind", store.AuditFilter{Kind: audit.KindRpcDenied}, func(e audit.Event) bool { return e.Kind == "rpc.denied" }},
		{"since inclusive", store.AuditFilter{Since: at(3)}, func(e audit.Event) bool { return e.Sequence >= 4 }},
		{"until exclusive", store.AuditFilter{Until: at(5)}, func(e audit.Event) bool { return e.Sequence <= 5 }},
		// Bounds between two microseconds round the right way.
		{"since after an event by 1ns", store.AuditFilter{Since: at(3).Add(time.Nanosecond)}, func(e audit.Event) bool { return e.Sequence >= 5 }},
		{"until after an event by 1ns", store.AuditFilter{Until: at(5).Add(time.Nanosecond)}, func(e audit.Event) bool { return e.Sequence <= 6 }},
		{"combined", store.AuditFilter{Tenant: "dev", Caller: "spiffe://airlock.test/client/c0", Since: at(1), Until: at(11)},
			func(e audit.Event) bool {
				return e.Tenant == "dev" && strings.HasSuffix(e.Caller, "c0") && e.Sequence >= 2 && e.Sequence <= 11
			}},
		{"after sequence", store.AuditFilter{AfterSequence: 9}, func(e audit.Event) bool { return e.Sequence > 9 }},
		{"past the end", store.AuditFilter{AfterSequence: 12}, func(audit.Event) bool { return false }},
	} {
		var want, got []int64
		for _, e := range all {
			if tc.keep(e) {
				want = append(want, e.Sequence)
			}
		}
		tc.f.Limit = 100
		events, err := s.ListAudit(ctx(t), tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, e := range events {
			got = append(got, e.Sequence)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: listed %v, want %v", tc.name, got, want)
		}
	}
	// Pages of 5 through the log's own filter give every entry once.
	var paged []int64
	after := int64(0)
	for range 10 {
		page, err := s.ListAudit(ctx(t), store.AuditFilter{Tenant: "dev", AfterSequence: after, Limit: 5})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			paged = append(paged, e.Sequence)
		}
		after = page[len(page)-1].Sequence
	}
	if fmt.Sprint(paged) != "[1 3 5 7 9 11]" {
		t.Fatalf("paged = %v", paged)
	}
}

func testAuditRestart(t *testing.T, open Opener) {
	s := open(t)
	for range 3 {
		if _, err := s.AppendAudit(ctx(t), audit.Event{Kind: "before"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t)
	e, err := s.AppendAudit(ctx(t), audit.Event{Kind: "after"})
	if err != nil || e.Sequence != 4 {
		t.Fatalf("append after reopening: sequence %d, %v; want 4", e.Sequence, err)
	}
	if got := VerifyAudit(t, s); len(got) != 4 {
		t.Fatalf("%d entries, want 4", len(got))
	}
}

func testCreateJobAudited(t *testing.T, open Opener) {
	s := open(t)
	j := NewJob("dev", "j1", 0)
	got, created, err := s.CreateJobAudited(ctx(t), j, audit.Event{Kind: "job.submitted", Caller: j.Requester, Outcome: "allowed"})
	if err != nil || !created || got.Version != 1 {
		t.Fatalf("CreateJobAudited = created %v, version %d, %v", created, got.Version, err)
	}
	events := VerifyAudit(t, s)
	if len(events) != 1 || events[0].JobID != "j1" || events[0].Tenant != "dev" || events[0].Kind != "job.submitted" {
		t.Fatalf("events = %+v; want one job.submitted for dev's j1", events)
	}

	// A retry with the same key changes nothing, so records nothing.
	dup := NewJob("dev", "j2", 1)
	dup.IdempotencyKey = j.IdempotencyKey
	got, created, err = s.CreateJobAudited(ctx(t), dup, audit.Event{Kind: "job.submitted"})
	if err != nil || created || got.ID != "j1" {
		t.Fatalf("duplicate key: created %v, id %s, %v; want the existing j1", created, got.ID, err)
	}
	// A bad event stops the job too.
	bad := NewJob("dev", "j3", 2)
	if _, _, err := s.CreateJobAudited(ctx(t), bad, audit.Event{Kind: "job.submitted", Reason: "\x00"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad event: %v, want ErrInvalidArgument", err)
	}
	if _, err := s.GetJob(ctx(t), "j3"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("job of a refused event was stored: %v", err)
	}
	// Explicit JobID and Tenant are kept.
	other := NewJob("dev", "j4", 3)
	if _, _, err := s.CreateJobAudited(ctx(t), other, audit.Event{Kind: "job.submitted", JobID: "x", Tenant: "y"}); err != nil {
		t.Fatal(err)
	}
	events = VerifyAudit(t, s)
	if len(events) != 2 || events[1].JobID != "x" || events[1].Tenant != "y" {
		t.Fatalf("events = %+v", events)
	}
}

func testUpdateJobAudited(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	got, err := s.UpdateJobAudited(ctx(t), "j1", func(j *store.Job) (audit.Event, error) {
		j.State = store.StateRunning
		return audit.Event{Kind: "job.started", Reason: "dispatched"}, nil
	})
	if err != nil || got.Version != 2 || got.State != store.StateRunning {
		t.Fatalf("UpdateJobAudited = version %d, state %s, %v", got.Version, got.State, err)
	}
	// The event's defaults come from the job as stored, whatever update
	// did to the identity fields.
	if _, err := s.UpdateJobAudited(ctx(t), "j1", func(j *store.Job) (audit.Event, error) {
		j.Tenant, j.ID, j.Message = "evil", "other", "noted"
		return audit.Event{Kind: "job.noted"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	events := VerifyAudit(t, s)
	if len(events) != 2 || events[0].Kind != "job.started" || events[0].Reason != "dispatched" {
		t.Fatalf("events = %+v", events)
	}
	for _, e := range events {
		if e.JobID != "j1" || e.Tenant != "dev" {
			t.Fatalf("event %d is about %s/%s, want dev/j1", e.Sequence, e.Tenant, e.JobID)
		}
	}
	if _, err := s.UpdateJobAudited(ctx(t), "nope", func(*store.Job) (audit.Event, error) {
		return audit.Event{Kind: "x"}, nil
	}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown job: %v, want ErrNotFound", err)
	}
	if got := ReadAudit(t, s); len(got) != 2 {
		t.Fatalf("%d events after updating an unknown job, want 2", len(got))
	}
}

// testUpdateJobAuditedFailures: whenever an audited update fails after its
// event was prepared, neither the job change nor the event is written.
func testUpdateJobAuditedFailures(t *testing.T, open Opener) {
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	refusal := fmt.Errorf("%w: no", errdefs.ErrFailedPrecondition)
	for _, tc := range []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		update func(cancel context.CancelFunc) func(j *store.Job) (audit.Event, error)
		is     error
	}{
		{"update refuses", nil, func(context.CancelFunc) func(j *store.Job) (audit.Event, error) {
			return func(j *store.Job) (audit.Event, error) {
				j.State = store.StateRunning
				return audit.Event{Kind: "job.started"}, refusal
			}
		}, errdefs.ErrFailedPrecondition},
		{"invalid state", nil, func(context.CancelFunc) func(j *store.Job) (audit.Event, error) {
			return func(j *store.Job) (audit.Event, error) {
				j.State = "bogus"
				return audit.Event{Kind: "job.bogus"}, nil
			}
		}, nil},
		{"invalid event", nil, func(context.CancelFunc) func(j *store.Job) (audit.Event, error) {
			return func(j *store.Job) (audit.Event, error) {
				j.State = store.StateRunning
				return audit.Event{Kind: "job.started", Reason: "bad\x00"}, nil
			}
		}, errdefs.ErrInvalidArgument},
		{"no event", nil, func(context.CancelFunc) func(j *store.Job) (audit.Event, error) {
			return func(j *store.Job) (audit.Event, error) {
				j.State = store.StateRunning
				return audit.Event{}, nil
			}
		}, errdefs.ErrInvalidArgument},
		{"context cancelled before the writes", func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx(t)) },
			func(cancel context.CancelFunc) func(j *store.Job) (audit.Event, error) {
				return func(j *store.Job) (audit.Event, error) {
					cancel()
					j.State = store.StateRunning
					return audit.Event{Kind: "job.started"}, nil
				}
			}, nil},
	} {
		c, cancel := ctx(t), context.CancelFunc(func() {})
		if tc.ctx != nil {
			c, cancel = tc.ctx()
		}
		_, err := s.UpdateJobAudited(c, "j1", tc.update(cancel))
		cancel()
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("%s: UpdateJobAudited = %v, want an error wrapping %v", tc.name, err, tc.is)
		}
		if got, _ := s.GetJob(ctx(t), "j1"); got.Version != 1 || got.State != store.StateQueued {
			t.Fatalf("%s: the job was written: version %d, state %s", tc.name, got.Version, got.State)
		}
		if got := ReadAudit(t, s); len(got) != 0 {
			t.Fatalf("%s: the event was written: %+v", tc.name, got)
		}
	}
	// And the chain starts cleanly afterwards.
	if e, err := s.AppendAudit(ctx(t), audit.Event{Kind: "k"}); err != nil || e.Sequence != 1 || e.PrevHash != audit.GenesisHash {
		t.Fatalf("append after failures: %+v, %v", e, err)
	}
}

func testConcurrentAuditedUpdates(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t)}
	mustCreate(t, stores[0], NewJob("dev", "j1", 0))
	const n = 16
	var wg sync.WaitGroup
	for i := range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i%2]
			var err error
			if i < n {
				_, err = s.UpdateJobAudited(ctx(t), "j1", func(j *store.Job) (audit.Event, error) {
					j.Message += "x"
					return audit.Event{Kind: "job.updated", Reason: fmt.Sprint(len(j.Message))}, nil
				})
			} else {
				_, err = s.AppendAudit(ctx(t), audit.Event{Kind: "other"})
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, _ := stores[0].GetJob(ctx(t), "j1")
	if len(got.Message) != n || got.Version != n+1 {
		t.Fatalf("lost updates: message %q, version %d", got.Message, got.Version)
	}
	events := VerifyAudit(t, stores[1])
	if len(events) != 2*n {
		t.Fatalf("%d events, want %d", len(events), 2*n)
	}
	// Each update's event records the message length it wrote, so in chain
	// order they must count up: the event is ordered with its update.
	next := 1
	for _, e := range events {
		if e.Kind == "job.updated" {
			if e.Reason != fmt.Sprint(next) {
				t.Fatalf("update event %d says %s, want %d", e.Sequence, e.Reason, next)
			}
			next++
		}
	}
}

// testAuditFailedWrite puts a row straight into audit_log at the next
// sequence, so that the store's next audit write fails in the database
// itself (a duplicate key) after the job row of the same transaction was
// written: the job change must be rolled back with it.
func testAuditFailedWrite(t *testing.T, b Backend) {
	open, exec := b.New(t)
	s := open(t)
	mustCreate(t, s, NewJob("dev", "j1", 0))
	if err := exec(`INSERT INTO audit_log (seq, occurred_at, kind, caller, subject, tenant, job_id, outcome, reason, prev_hash, hash)
		VALUES (1, 0, 'planted', '', '', '', '', '', '', '', '')`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateJobAudited(ctx(t), "j1", func(j *store.Job) (audit.Event, error) {
		j.State, j.Message = store.StateRunning, "should not stick"
		return audit.Event{Kind: "job.started"}, nil
	}); err == nil {
		t.Fatal("UpdateJobAudited succeeded over a conflicting audit row")
	}
	if got, _ := s.GetJob(ctx(t), "j1"); got.Version != 1 || got.State != store.StateQueued || got.Message != "" {
		t.Fatalf("the job change outlived its failed audit entry: %+v", got)
	}
	if _, _, err := s.CreateJobAudited(ctx(t), NewJob("dev", "j2", 1), audit.Event{Kind: "job.submitted"}); err == nil {
		t.Fatal("CreateJobAudited succeeded over a conflicting audit row")
	}
	if _, err := s.GetJob(ctx(t), "j2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the job outlived its failed audit entry: %v", err)
	}
	if got := ReadAudit(t, s); len(got) != 1 || got[0].Kind != "planted" {
		t.Fatalf("audit log = %+v, want only the planted row", got)
	}
}

func appendN(t *testing.T, s store.Store, n int) {
	t.Helper()
	for i := range n {
		if _, err := s.AppendAudit(ctx(t), audit.Event{Kind: "k", Reason: fmt.Sprint("entry ", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
}

func testAuditGuards(t *testing.T, b Backend) {
	open, exec := b.New(t)
	s := open(t)
	appendN(t, s, 3)
	for _, q := range []string{
		`UPDATE audit_log SET reason = 'changed' WHERE seq = 2`,
		`DELETE FROM audit_log WHERE seq = 3`,
	} {
		if err := exec(q); err == nil {
			t.Errorf("%s: allowed", q)
		}
	}
	if got := VerifyAudit(t, s); len(got) != 3 || got[1].Reason != "entry 2" {
		t.Fatalf("log changed: %+v", got)
	}
}

// testAuditTamper changes the log behind the store's back, as someone with
// write access to the database could, and checks that verification points
// at the first entry affected.
func testAuditTamper(t *testing.T, b Backend) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, s store.Store, exec Exec)
		// at is the sequence verification must stop at.
		at     int64
		reason string
	}{
		{"reason altered", func(t *testing.T, s store.Store, exec Exec) {
			mustExec(t, exec, `UPDATE audit_log SET reason = 'nothing happened' WHERE seq = 4`)
		}, 4, "hash does not match"},
		{"row deleted", func(t *testing.T, s store.Store, exec Exec) {
			mustExec(t, exec, `DELETE FROM audit_log WHERE seq = 5`)
		}, 6, "missing"},
		{"rows reordered", func(t *testing.T, s store.Store, exec Exec) {
			mustExec(t, exec, `UPDATE audit_log SET seq = -3 WHERE seq = 3`)
			mustExec(t, exec, `UPDATE audit_log SET seq = 3 WHERE seq = 4`)
			mustExec(t, exec, `UPDATE audit_log SET seq = 4 WHERE seq = -3`)
		}, 3, "prev hash"},
		{"hash replaced", func(t *testing.T, s store.Store, exec Exec) {
			mustExec(t, exec, `UPDATE audit_log SET hash = '`+strings.Repeat("ab", 32)+`' WHERE seq = 6`)
		}, 6, "hash does not match"},
		{"entry forged and rehashed", func(t *testing.T, s store.Store, exec Exec) {
			e := ReadAudit(t, s)[2]
			e.Reason = "forged"
			h, err := e.ComputeHash()
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, exec, `UPDATE audit_log SET reason = 'forged', hash = '`+h+`' WHERE seq = 3`)
		}, 4, "prev hash"},
		{"last entry deleted", func(t *testing.T, s store.Store, exec Exec) {
			mustExec(t, exec, `DELETE FROM audit_log WHERE seq = 8`)
			// The head still knows entry 8, so the next append shows the gap.
			if e, err := s.AppendAudit(ctx(t), audit.Event{Kind: "k"}); err != nil || e.Sequence != 9 {
				t.Fatalf("append after the deletion: %d, %v; want sequence 9", e.Sequence, err)
			}
		}, 9, "missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open, exec := b.New(t)
			s := open(t)
			appendN(t, s, 8)
			VerifyAudit(t, s)
			mustExec(t, exec, b.DropAuditGuards)
			tc.tamper(t, s, exec)
			events := ReadAudit(t, s)
			i, err := audit.NewVerifier().Check(events)
			if err == nil {
				t.Fatal("tampering went unnoticed")
			}
			if events[i].Sequence != tc.at || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("break reported at sequence %d (%v); want %d (%s)", events[i].Sequence, err, tc.at, tc.reason)
			}
		})
	}
}

func mustExec(t *testing.T, exec Exec, query string) {
	t.Helper()
	if err := exec(query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
