package runs

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/executor/internal/egressproxy"
)

// A watch of the egress record gets each decision once the proxy has
// recorded it, while the job runs: the record's writer wakes it, a line
// not yet whole waits, a resumed watch starts at the index it asks for,
// and a line that is not a record is counted and skipped.
func TestEgressTail(t *testing.T) {
	dir := t.TempDir()
	woken := 0
	l, err := openEgressLog(dir, false, slog.New(slog.DiscardHandler), func() { woken++ })
	if err != nil {
		t.Fatal(err)
	}
	tail := &egressTail{path: filepath.Join(dir, bundle.EgressFile)}
	var got []Event
	collect := func(ev Event) error { got = append(got, ev); return nil }
	if err := tail.send(collect); err != nil || len(got) != 0 {
		t.Fatalf("an empty record: %v, %d events", err, len(got))
	}

	failed := &egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideJob, After: 2150}
	l.connection(egressproxy.Decision{Time: time.Now(), Mode: egressproxy.ModeConnect, Name: "registry.test", Port: 443, Allowed: true,
		Reason: "allowed by registry.test", BytesIn: 2150, BytesOut: 600, End: "closed", ClosedFirst: egress.SideJob, TLS: failed})
	if woken != 1 {
		t.Errorf("the record woke watchers %d times for one decision", woken)
	}
	if err := tail.send(collect); err != nil || len(got) != 1 {
		t.Fatalf("after one decision: %v, %d events", err, len(got))
	}
	r := got[0].Egress
	if got[0].EgressIndex != 0 || r == nil || r.Name != "registry.test" || r.TLS == nil || *r.TLS != *failed || r.ClosedFirst != egress.SideJob {
		t.Fatalf("event %+v (record %+v)", got[0], r)
	}

	// The record's writer is done (it writes at its own offset); now half
	// a line after a line that is no record, then the rest.
	l.close()
	f, err := os.OpenFile(tail.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("not json\n" + `{"time":"2026-01-01T00:00:00Z","via":"dns","name":"half`)
	if err := tail.send(collect); err != nil || len(got) != 1 {
		t.Fatalf("with half a line: %v, %d events", err, len(got))
	}
	f.WriteString(`.test","allowed":false,"reason":"no"}` + "\n")
	f.WriteString(strings.Repeat("x", maxEgressLine+10) + "\n")
	last, _ := json.Marshal(egress.Record{Time: time.Now(), Via: egress.ViaDNS, Name: "last.test", QType: "A", Allowed: true, Reason: "allowed by last.test"})
	f.Write(append(last, '\n'))
	if err := tail.send(collect); err != nil || len(got) != 3 {
		t.Fatalf("after the rest: %v, %d events", err, len(got))
	}
	if got[1].EgressIndex != 2 || got[1].Egress.Name != "half.test" || got[2].EgressIndex != 4 || got[2].Egress.Name != "last.test" {
		t.Errorf("indexes %d %q, %d %q; want 2 half.test, 4 last.test", got[1].EgressIndex, got[1].Egress.Name, got[2].EgressIndex, got[2].Egress.Name)
	}

	// A watch resumed after index 2 sends the one after it only.
	resumed := &egressTail{path: tail.path, from: 3}
	var again []Event
	if err := resumed.send(func(ev Event) error { again = append(again, ev); return nil }); err != nil || len(again) != 1 || again[0].EgressIndex != 4 {
		t.Fatalf("resumed at 3: %v, %+v", err, again)
	}
}
