package runs

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/executor/internal/egressproxy"
	"github.com/airlockhq/airlock/services/executor/internal/jobdns"
)

// A job that floods its record with allowed decisions cannot hide what it
// does next: refusals are still written one by one after the allowed cap,
// everything past the caps is counted by name with its bytes, the report
// carries the first and the last decisions, the totals by name are exact,
// and a name as long as the job likes is cut when written.
func TestEgressLogFlood(t *testing.T) {
	dir := t.TempDir()
	l, err := openEgressLog(dir, false, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	const allowed = maxEgressRecords + 5000
	for range allowed {
		l.query(jobdns.QueryDecision{Time: now, Proto: "udp", Name: "flood.test", Type: 1, Allowed: true, Reason: "allowed by flood.test"})
	}
	l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeConnect, Name: "secret.test", Port: 443, Allowed: true, Reason: "allowed by secret.test", BytesOut: 1 << 20})
	for range 3 {
		l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeConnect, Name: "evil.test", Port: 443, Reason: "evil.test is not in the policy"})
	}
	l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeTransparent, Name: strings.Repeat("x", 60000), Port: 443, Reason: "SNI: " + strings.Repeat("x", 60000)})
	l.close()

	first, last, total, names, _, ok := egressOf(filepath.Join(dir, bundle.EgressFile), slog.New(slog.DiscardHandler))
	if !ok {
		t.Fatal("no record")
	}
	counts := map[string][2]int{}
	for _, n := range names {
		counts[n.Name] = [2]int{n.Allowed, n.Refused}
	}
	if got := counts["flood.test"]; got != [2]int{allowed, 0} {
		t.Errorf("flood.test counted %v, want %d allowed", got, allowed)
	}
	if got := counts["secret.test"]; got != [2]int{1, 0} {
		t.Errorf("secret.test, allowed past the cap, counted %v", got)
	}
	if got := counts["evil.test"]; got != [2]int{0, 3} {
		t.Errorf("evil.test's refusals counted %v", got)
	}
	for _, n := range names {
		if n.Name == "secret.test" && n.BytesOut != 1<<20 {
			t.Errorf("secret.test's bytes: %+v", n)
		}
	}
	// The refusals after the flood are in the file one by one, and in the
	// report's last part.
	var tail []string
	for _, r := range last {
		if !r.Allowed {
			tail = append(tail, r.Name)
		}
		if len(r.Name) > 1024 || len(r.Reason) > 1024 {
			t.Errorf("a record of %d and %d bytes: not cut", len(r.Name), len(r.Reason))
		}
	}
	if len(tail) != 4 || tail[0] != "evil.test" {
		t.Errorf("refusals among the last decisions: %d %v", len(tail), tail)
	}
	if len(first) != reviewEgress/2 || len(last) != reviewEgress/2 {
		t.Errorf("%d first and %d last decisions, want %d each", len(first), len(last), reviewEgress/2)
	}
	if want := maxEgressRecords + 4 + 2; total != want { // the lines, and two summary lines
		t.Errorf("total %d lines, want %d", total, want)
	}
}

// Refusals do not use up the allowed decisions' room: after 20,000 of
// them an allowed connection still has its own line.
func TestEgressLogRefusalsLeaveRoomForAllowed(t *testing.T) {
	dir := t.TempDir()
	l, err := openEgressLog(dir, false, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxEgressRecords {
		l.query(jobdns.QueryDecision{Time: time.Now(), Proto: "udp", Name: fmt.Sprintf("junk%d.test", i), Type: 1, Reason: "not in the policy"})
	}
	l.connection(egressproxy.Decision{Time: time.Now(), Mode: egressproxy.ModeConnect, Name: "used.test", Port: 443, Allowed: true, Reason: "allowed by used.test"})
	l.close()
	_, last, _, _, _, _ := egressOf(filepath.Join(dir, bundle.EgressFile), slog.New(slog.DiscardHandler))
	if n := last[len(last)-1]; n.Name != "used.test" || !n.Allowed || n.Suppressed != 0 {
		t.Errorf("the last record is %+v, want used.test's own line", n)
	}
}

// Request lines are written with what the request was and the credential
// it carried, past the cap are counted for their credential (never for
// their name, whose connection lines count its bytes), and the report's
// summary by credential is exact. (After merge, the proxy's request
// decisions reach this through egressLog.connection; requestOf stands in.)
func TestEgressLogRequestLines(t *testing.T) {
	dir := t.TempDir()
	l, err := openEgressLog(dir, false, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	d := egressproxy.Decision{Time: now, Mode: egressproxy.ModeRequest, Name: "api.test", Port: 443, Reason: "credential gh", BytesIn: 100, BytesOut: 10, Duration: time.Millisecond}
	const n = maxEgressRecords + 7
	for range n {
		l.write(requestRecord(d, &egressproxy.Request{Method: "GET", Path: "/v1/x", Status: 200, Credential: "gh", Allowed: true}))
	}
	l.write(requestRecord(d, &egressproxy.Request{Method: "POST", Path: "/v1/y", Credential: "gh"}))
	l.close()
	first, _, _, names, creds, ok := egressOf(filepath.Join(dir, bundle.EgressFile), slog.New(slog.DiscardHandler))
	if !ok {
		t.Fatal("no record")
	}
	r := first[0]
	if r.Via != egress.ViaRequest || r.Method != "GET" || r.Path != "/v1/x" || r.Status != 200 || r.Credential != "gh" || !r.Allowed || r.BytesIn != 100 || r.DurationMS != 1 {
		t.Errorf("request line %+v", r)
	}
	if len(names) != 0 {
		t.Errorf("request lines counted by name: %+v", names)
	}
	want := []egress.CredentialSummary{{Name: "gh", Requests: n, Refused: 1, BytesIn: 100 * (n + 1), BytesOut: 10 * (n + 1)}}
	if !slices.Equal(creds, want) {
		t.Errorf("credentials %+v, want %+v", creds, want)
	}
}

// egressBytes totals a job's connections from its record: sent is what
// went out of the job (bytes_out), received what came in (bytes_in); a
// request line's bytes are its connection's and count once; DNS and
// refusals carry none; no record is zero.
func TestEgressBytes(t *testing.T) {
	dir := t.TempDir()
	l, err := openEgressLog(dir, false, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	l.query(jobdns.QueryDecision{Time: now, Proto: "udp", Name: "a.test", Type: 1, Allowed: true, Reason: "allowed by a.test"})
	l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeConnect, Name: "a.test", Port: 443, Allowed: true, BytesOut: 300, BytesIn: 5000})
	l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeTransparent, Name: "b.test", Port: 80, Allowed: true, BytesOut: 20, BytesIn: 7})
	l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeConnect, Name: "evil.test", Port: 443, Reason: "evil.test is not in the policy"})
	d := egressproxy.Decision{Time: now, Mode: egressproxy.ModeRequest, Name: "a.test", Port: 443, BytesIn: 100, BytesOut: 10}
	l.write(requestRecord(d, &egressproxy.Request{Method: "GET", Path: "/x", Status: 200, Credential: "gh", Allowed: true}))
	l.close()
	sent, received := egressBytes(filepath.Join(dir, bundle.EgressFile))
	if sent != 320 || received != 5007 {
		t.Fatalf("egressBytes = %d sent, %d received; want 320 and 5007", sent, received)
	}
	if s, r := egressBytes(filepath.Join(t.TempDir(), bundle.EgressFile)); s != 0 || r != 0 {
		t.Fatalf("no record: %d, %d", s, r)
	}
}

// A session kept across an executor restart goes on with its egress
// record: what the previous process wrote stays (a line it left half
// written is ended, not glued to the next), and its bytes add up; a new
// run's record starts empty.
func TestEgressLogKept(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, bundle.EgressFile)
	now := time.Now()
	l, err := openEgressLog(dir, false, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeConnect, Name: "a.test", Port: 443, Allowed: true, BytesOut: 300, BytesIn: 5000})
	l.close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"time":"2026-12-05T09:00:00Z","via":"con`); err != nil { // killed mid-line
		t.Fatal(err)
	}
	f.Close()

	l, err = openEgressLog(dir, true, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.connection(egressproxy.Decision{Time: now, Mode: egressproxy.ModeConnect, Name: "b.test", Port: 443, Allowed: true, BytesOut: 20, BytesIn: 7})
	l.close()
	if sent, received := egressBytes(path); sent != 320 || received != 5007 {
		t.Fatalf("kept: %d sent, %d received; want 320 and 5007 (both processes' bytes)", sent, received)
	}

	l, err = openEgressLog(dir, false, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.close()
	if sent, received := egressBytes(path); sent != 0 || received != 0 {
		t.Fatalf("a new run's record: %d sent, %d received; want none", sent, received)
	}
}

// egressBytes totals what a run's egress record (egress.jsonl) says its
// connections carried: sent is from the job (bytes_out), received to it
// (bytes_in). DNS carries none, and a request line's bytes are its
// connection's already (egress.Summary counts them once); no record is
// zero.
func egressBytes(path string) (sent, received int64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	var sum egress.Summary
	_, _ = egress.ScanRecords(f, sum.Add)
	for _, n := range sum.Names() {
		sent += n.BytesOut
		received += n.BytesIn
	}
	return sent, received
}
