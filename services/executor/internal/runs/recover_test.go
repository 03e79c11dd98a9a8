package runs

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// TestRecoverReportsRestartOnce leaves a run in flight, as an executor
// killed mid-run does, and checks that Recover fails it and reports the
// restart by its reason alone: the authority words the reason for people
// ("the executor restarted while the job was in flight"), so a message
// saying it again would print it twice.
func TestRecoverReportsRestartOnce(t *testing.T) {
	h, _ := newHarness(t, false)
	id := "job-in-flight"
	if err := os.MkdirAll(h.m.runDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	h.m.mu.Lock()
	h.m.runs[id] = &entry{run: Run{JobID: id, State: Running, CreatedAt: time.Now()}, changed: make(chan struct{})}
	h.m.mu.Unlock()
	if err := h.m.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	reports := h.waitReports(t, 1)
	r := reports[0].Result
	if reports[0].JobID != id || r.Reason != ReasonExecutorRestarted || r.ExitCode != -1 {
		t.Errorf("reported %s: reason %q, exit %d; want %s: %q, exit -1", reports[0].JobID, r.Reason, r.ExitCode, id, ReasonExecutorRestarted)
	}
	if strings.Contains(r.Message, "restarted") {
		t.Errorf("message %q says again what the reason says", r.Message)
	}
}

// TestNewOldRecord: a record written before records kept the Grant gets
// it from Config.DecodeGrant, given its signed grant; one that keeps it is
// read as it is, with its signed grant beside it.
func TestNewOldRecord(t *testing.T) {
	dir := t.TempDir()
	kept := Grant{JobID: "job-new", Generation: 2, Limits: sandbox.Limits{Pids: 7}, Session: &SessionSpec{MaxConcurrentExecs: 3}}
	for _, r := range []Run{
		{JobID: "job-old", State: Finished, SignedGrant: []byte("old signed grant")},
		{JobID: "job-new", State: Finished, SignedGrant: []byte("new signed grant"), Grant: kept},
	} {
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, r.JobID), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, r.JobID, "run.json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var decoded [][]byte
	m, err := New(Config{Dir: dir, DecodeGrant: func(signed []byte) (Grant, error) {
		decoded = append(decoded, signed)
		return Grant{JobID: "job-old", Generation: 5}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(decoded) != 1 || string(decoded[0]) != "old signed grant" {
		t.Fatalf("DecodeGrant was given %q, want the old record's signed grant alone", decoded)
	}
	if r, _ := m.Get("job-old"); r.Grant.JobID != "job-old" || r.Grant.Generation != 5 {
		t.Errorf("old record's grant: %+v", r.Grant)
	}
	r, _ := m.Get("job-new")
	if r.Grant.Generation != 2 || r.Grant.Limits.Pids != 7 || r.Grant.Session == nil || r.Grant.Session.MaxConcurrentExecs != 3 || string(r.Grant.Signed) != "new signed grant" {
		t.Errorf("new record's grant: %+v", r.Grant)
	}
}
