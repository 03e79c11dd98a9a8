package checkpoints_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	_ "modernc.org/sqlite"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/logging/logtest"
	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
	"github.com/airlockhq/airlock/services/authority/internal/checkpoints"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
	"github.com/airlockhq/airlock/test/audittamper"
)

// fixture is a real SQLite store, a key and a checkpoint file in a
// temporary directory, and a clock the test moves.
type fixture struct {
	t    *testing.T
	dir  string
	key  ed25519.PrivateKey
	st   *sqlite.Store
	now  time.Time
	logs *logtest.Buffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, dir: t.TempDir(), key: key, now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), logs: &logtest.Buffer{}}
	f.openStore()
	return f
}

func (f *fixture) openStore() {
	st, err := sqlite.Open(context.Background(), filepath.Join(f.dir, "authority.db"))
	if err != nil {
		f.t.Fatal(err)
	}
	f.st = st
	f.t.Cleanup(func() { st.Close() })
}

func (f *fixture) file() string { return filepath.Join(f.dir, "audit-checkpoints.jsonl") }

func (f *fixture) open(every int64) *checkpoints.Service {
	f.t.Helper()
	return f.openMeter(every, nil)
}

// openMeter is open recording the metrics on mp.
func (f *fixture) openMeter(every int64, mp metric.MeterProvider) *checkpoints.Service {
	f.t.Helper()
	s, err := checkpoints.Open(context.Background(), checkpoints.Config{
		Store: f.st, Key: f.key, File: f.file(), Every: every, Interval: time.Minute,
		Logger: slog.New(slog.NewTextHandler(f.logs, nil)), Now: func() time.Time { return f.now }, Meter: mp,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) append(n int) {
	f.t.Helper()
	for i := range n {
		if _, err := f.st.AppendAudit(context.Background(), audit.Event{Kind: audit.KindJobGranted, Caller: "spiffe://airlock.test/client/dev",
			Subject: fmt.Sprintf("job-%d", i), Tenant: "dev", Outcome: "allowed", Reason: "test"}); err != nil {
			f.t.Fatal(err)
		}
	}
}

// rewrite rewrites entry seq of the log, as an attacker with the
// database would, chain and head included.
func (f *fixture) rewrite(seq int64) {
	f.t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(f.dir, "authority.db"))
	if err != nil {
		f.t.Fatal(err)
	}
	defer db.Close()
	if err := audittamper.Rewrite(db, seq, "nothing happened"); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) tick(s *checkpoints.Service, final bool) {
	f.t.Helper()
	if err := s.Tick(context.Background(), final); err != nil {
		f.t.Fatal(err)
	}
}

func sequences(p checkpoints.Page) []int64 {
	var out []int64
	for _, c := range p.Checkpoints {
		out = append(out, c.Sequence)
	}
	return out
}

func list(t *testing.T, s *checkpoints.Service) checkpoints.Page {
	t.Helper()
	p, err := s.List(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheckpointsEveryNEntriesIntervalAndShutdown(t *testing.T) {
	f := newFixture(t)
	s := f.open(5)
	f.append(12)
	f.tick(s, false)
	if got := fmt.Sprint(sequences(list(t, s))); got != "[5 10]" {
		t.Fatalf("after 12 entries with every=5: checkpoints %s, want [5 10]", got)
	}
	// Entries 11 and 12 wait for the interval…
	f.now = f.now.Add(30 * time.Second)
	f.tick(s, false)
	if got := fmt.Sprint(sequences(list(t, s))); got != "[5 10]" {
		t.Fatalf("30 s later: %s, want no new checkpoint yet", got)
	}
	f.now = f.now.Add(31 * time.Second)
	f.tick(s, false)
	if got := fmt.Sprint(sequences(list(t, s))); got != "[5 10 12]" {
		t.Fatalf("past the interval: %s, want the head (12) too", got)
	}
	// …or for shutdown.
	f.append(1)
	f.tick(s, true)
	p := list(t, s)
	if got := fmt.Sprint(sequences(p)); got != "[5 10 12 13]" {
		t.Fatalf("at shutdown: %s, want the head (13) too", got)
	}
	if p.Halted != "" || p.KeyID == "" || !bytes.Equal(p.PublicKey, f.key.Public().(ed25519.PublicKey)) {
		t.Errorf("page: halted %q, key %q", p.Halted, p.KeyID)
	}

	// The file holds the same, each line signed, and they anchor the log.
	data, err := os.ReadFile(f.file())
	if err != nil {
		t.Fatal(err)
	}
	cps, torn, err := audit.ReadCheckpoints(bytes.NewReader(data))
	if err != nil || torn || len(cps) != 4 {
		t.Fatalf("file: %d checkpoints, torn %v, %v", len(cps), torn, err)
	}
	a, err := audit.NewAnchors(cps, f.key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	events, err := f.st.ListAudit(context.Background(), storeAll)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if err := a.Entry(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.End(); err != nil || a.Matched() != 4 {
		t.Fatalf("anchors: matched %d, %v", a.Matched(), err)
	}
	if !strings.Contains(f.logs.String(), `"audit checkpoint"`) && !strings.Contains(f.logs.String(), "audit checkpoint") {
		t.Errorf("checkpoints are not on the service log:\n%s", f.logs.String())
	}

	// Paging.
	page, err := s.List(5, 2)
	if err != nil || fmt.Sprint(sequences(page)) != "[10 12]" || !page.More {
		t.Errorf("List(after 5, 2) = %v more=%v, %v", sequences(page), page.More, err)
	}
	if _, err := s.List(0, 1001); err == nil || !strings.Contains(err.Error(), "page_size") {
		t.Errorf("page size 1001: %v", err)
	}
}

func TestCheckpointsSurviveRestartAndATornLine(t *testing.T) {
	f := newFixture(t)
	s := f.open(3)
	f.append(7)
	f.tick(s, true)
	// A crash in the middle of the next append leaves half a line.
	fd, err := os.OpenFile(f.file(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fd.WriteString(`{"sequence":9,"hash":"ab`)
	fd.Close()

	s = f.open(3)
	if got := fmt.Sprint(sequences(list(t, s))); got != "[3 6 7]" {
		t.Fatalf("after restart: %s, want [3 6 7]", got)
	}
	if !strings.Contains(f.logs.String(), "torn last line") {
		t.Error("the torn line was cut off without a word")
	}
	f.append(2)
	f.tick(s, false)
	if got := fmt.Sprint(sequences(list(t, s))); got != "[3 6 7 9]" {
		t.Fatalf("after 2 more: %s, want [3 6 7 9]", got)
	}
	data, _ := os.ReadFile(f.file())
	if _, torn, err := audit.ReadCheckpoints(bytes.NewReader(data)); err != nil || torn {
		t.Errorf("the file after the repair: torn %v, %v", torn, err)
	}
}

func TestCheckpointFileOfAnotherKeyIsRefused(t *testing.T) {
	f := newFixture(t)
	s := f.open(2)
	f.append(2)
	f.tick(s, false)
	_, f.key, _ = ed25519.GenerateKey(rand.Reader)
	_, err := checkpoints.Open(context.Background(), checkpoints.Config{Store: f.st, Key: f.key, File: f.file(), Logger: slog.New(slog.NewTextHandler(f.logs, nil))})
	if err == nil || !strings.Contains(err.Error(), "not the pinned key") || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("a checkpoint file signed by another key: %v", err)
	}
}

// TestRewrittenLogIsNeverSignedOver is the attack of issue 9 §6 against the
// authority: an entry is changed and every later hash recomputed with the
// project's own code. At the next start the authority finds the log
// disagreeing with its last checkpoint, says which checkpoint first
// disagrees, and signs nothing more on top of the rewritten log.
func TestRewrittenLogIsNeverSignedOver(t *testing.T) {
	f := newFixture(t)
	s := f.open(4)
	f.append(10)
	f.tick(s, true) // 4, 8, 10
	f.st.Close()

	f.rewrite(6)
	f.openStore()
	events, err := f.st.ListAudit(context.Background(), storeAll)
	if err != nil {
		t.Fatal(err)
	}
	if i, err := audit.Verify(events); err != nil {
		t.Fatalf("the rewritten chain should verify on its own (break at %d: %v)", i, err)
	}

	s = f.open(4)
	p := list(t, s)
	if !strings.Contains(p.Halted, "checkpoint at sequence 8") {
		t.Fatalf("halted = %q, want the first disagreeing checkpoint (8) named", p.Halted)
	}
	if !strings.Contains(f.logs.String(), "AUDIT LOG TAMPERED") {
		t.Errorf("no error on the service log:\n%s", f.logs.String())
	}
	f.append(10)
	f.now = f.now.Add(time.Hour)
	f.tick(s, true)
	if got := fmt.Sprint(sequences(list(t, s))); got != "[4 8 10]" {
		t.Errorf("checkpoints after the rewrite: %s, want none new", got)
	}
}

// TestRewriteWhileRunningHaltsSigning: the same attack on a running
// authority is caught before the next checkpoint.
func TestRewriteWhileRunningHaltsSigning(t *testing.T) {
	f := newFixture(t)
	s := f.open(4)
	f.append(4)
	f.tick(s, false)
	f.rewrite(2)
	f.append(4)
	f.tick(s, false)
	p := list(t, s)
	if fmt.Sprint(sequences(p)) != "[4]" || !strings.Contains(p.Halted, "entry 4 no longer has the hash") {
		t.Errorf("checkpoints %v, halted %q: want [4] and the rewrite named", sequences(p), p.Halted)
	}
}

var storeAll = store.AuditFilter{Limit: 10000}

// TestEntryRemovedSinceTheLastCheckpointHaltsSigning: the entries after
// the last checkpoint are checked to chain before a new checkpoint signs
// them; one deleted there is not signed over.
func TestEntryRemovedSinceTheLastCheckpointHaltsSigning(t *testing.T) {
	f := newFixture(t)
	s := f.open(4)
	f.append(4)
	f.tick(s, false)
	f.append(3)
	db, err := sql.Open("sqlite", filepath.Join(f.dir, "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{"DROP TRIGGER IF EXISTS audit_log_no_delete", "DELETE FROM audit_log WHERE seq = 6"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	f.now = f.now.Add(time.Hour)
	f.tick(s, true)
	p := list(t, s)
	if fmt.Sprint(sequences(p)) != "[4]" || !strings.Contains(p.Halted, "broken") {
		t.Errorf("checkpoints %v, halted %q: want [4] and the break named", sequences(p), p.Halted)
	}
}

// TestMetrics: the gauges follow the log's head, the last checkpoint and
// a rewrite that halts signing.
func TestMetrics(t *testing.T) {
	rd := metricstest.NewReader(t)
	f := newFixture(t)
	s := f.openMeter(4, rd.Provider)
	want := func(name string, v float64) {
		t.Helper()
		got := rd.Collect(t)
		if n, ok := got.Value(name, map[string]string{}); !ok || n != v {
			t.Errorf("%s = %v (recorded %v), want %v\n%s", name, n, ok, v, got.Points(name))
		}
	}
	want("airlock.authority.audit.halted", 0)
	want("airlock.authority.audit.checkpoint.sequence", 0)
	f.append(5)
	f.tick(s, false)
	want("airlock.authority.audit.entries", 5)
	want("airlock.authority.audit.checkpoint.sequence", 4)
	want("airlock.authority.audit.halted", 0)

	f.rewrite(2)
	f.append(4)
	f.tick(s, false)
	want("airlock.authority.audit.entries", 9)
	want("airlock.authority.audit.checkpoint.sequence", 4)
	want("airlock.authority.audit.halted", 1)
}
