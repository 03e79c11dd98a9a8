//go:build linux

package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/test/audittamper"
)

// TestAuditRecordsDecisionsAndDetectsTampering runs the real stack, makes
// decisions of every kind the authority records so far, reads them back as
// an approver, verifies the chain, and then alters one row directly in the
// database, as someone with access to the file could: verify must fail
// there.
func TestAuditRecordsDecisionsAndDetectsTampering(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	if res := s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "--", "true"); res.code != 0 {
		t.Fatalf("job: exit %d\n%s", res.code, res.stderr)
	}
	if res := s.airlock(t, "job", "submit", "--repo", "nope", "--", "true"); res.code == 0 {
		t.Fatal("a job on an unknown repository was accepted")
	}
	// A client may not read the log; the refusal itself is logged.
	if res := s.airlock(t, "audit", "list"); res.code == 0 || !strings.Contains(res.stderr, "permission denied") {
		t.Fatalf("client/dev reading the audit log: exit %d\n%s", res.code, res.stderr)
	}

	res := s.airlock(t, "audit", "list", "--as", "approver/alice", "-o", "json")
	if res.code != 0 {
		t.Fatalf("audit list: exit %d\n%s", res.code, res.stderr)
	}
	var list struct {
		Events []struct {
			Sequence string `json:"sequence"`
			Kind     string `json:"kind"`
			Caller   string `json:"caller"`
			Outcome  string `json:"outcome"`
			Reason   string `json:"reason"`
		} `json:"events"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &list); err != nil {
		t.Fatalf("audit list -o json: %v\n%s", err, res.stdout)
	}
	want := map[string]string{
		"job.granted":     "spiffe://airlock.local/client/dev",
		"source.fetched":  "spiffe://airlock.local/service/executor",
		"result.recorded": "spiffe://airlock.local/service/executor",
		"job.refused":     "spiffe://airlock.local/client/dev",
		"rpc.denied":      "spiffe://airlock.local/client/dev",
	}
	for _, e := range list.Events {
		if caller, ok := want[e.Kind]; ok && caller == e.Caller {
			delete(want, e.Kind)
		}
	}
	if len(want) != 0 {
		t.Errorf("missing audit events (kind: caller): %v\nin: %s", want, res.stdout)
	}

	if res := s.airlock(t, "audit", "verify", "--as", "approver/alice"); res.code != 0 || !strings.Contains(res.stdout, "unbroken") {
		t.Fatalf("verify of an untouched log: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	export := filepath.Join(t.TempDir(), "audit.jsonl")
	if res := s.airlock(t, "audit", "export", "--as", "approver/alice", "--out", export); res.code != 0 {
		t.Fatalf("export: exit %d\n%s", res.code, res.stderr)
	}
	data, err := os.ReadFile(export)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(data), "\n"); lines < len(list.Events) {
		t.Errorf("export has %d lines, the log had at least %d events", lines, len(list.Events))
	}

	// Someone with the database file alters the second entry's reason
	// (the store's own triggers refuse updates, so they drop them first).
	db, err := sql.Open("sqlite", filepath.Join(s.dir, "authority", "data", "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{"DROP TRIGGER audit_log_no_update", "UPDATE audit_log SET reason = 'nothing happened' WHERE seq = 2"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	res = s.airlock(t, "audit", "verify", "--as", "approver/alice")
	if res.code != 1 || !strings.Contains(res.stdout, "BROKEN at sequence 2") {
		t.Fatalf("verify after altering row 2: exit %d, want 1 naming sequence 2\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// TestAuditRewriteWithRecomputedHashesIsCaught is issue 9 §6 against the
// running stack: someone with write access to the database and the source
// changes an entry and recomputes every later hash and the head with the
// project's own hashing code, and restarts the authority. The chain alone
// verifies — but `audit verify` checks it against the signed checkpoints
// and names the first one that disagrees, online and offline.
func TestAuditRewriteWithRecomputedHashesIsCaught(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	for range 3 {
		if res := s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "--", "true"); res.code != 0 {
			t.Fatalf("job: exit %d\n%s", res.code, res.stderr)
		}
	}
	data := filepath.Join(s.dir, "authority", "data")
	kept := filepath.Join(t.TempDir(), "kept-checkpoints.jsonl")
	cleanExport := filepath.Join(t.TempDir(), "clean.jsonl")
	var head int
	s.restartServiceAfter(t, "authority", func() {
		// Stopped: the authority signed its head on the way down. A
		// monitor's copy of the checkpoints, and the honest log.
		cps, err := os.ReadFile(filepath.Join(data, "audit-checkpoints.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(kept, cps, 0o600); err != nil {
			t.Fatal(err)
		}
		head = strings.Count(string(cps), "\n")
		if head == 0 {
			t.Fatal("no checkpoint was signed at shutdown")
		}
	})
	if res := s.airlock(t, "audit", "export", "--as", "approver/alice", "--out", cleanExport); res.code != 0 {
		t.Fatalf("export: exit %d\n%s", res.code, res.stderr)
	}
	res := s.airlock(t, "audit", "verify", "--file", cleanExport, "--checkpoints", kept, "--key", filepath.Join(data, "audit-checkpoint.key.pub"))
	if res.code != 0 || !strings.Contains(res.stdout, "agrees with") {
		t.Fatalf("offline verify of the honest log: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := s.airlock(t, "audit", "verify", "--as", "approver/alice"); res.code != 0 || !strings.Contains(res.stdout, "agrees with") {
		t.Fatalf("online verify of the honest log: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// A non-auditor approver may not verify the whole log.
	if res := s.airlock(t, "audit", "verify", "--as", "approver/bob"); res.code == 0 || !strings.Contains(res.stderr, "auditors") {
		t.Fatalf("bob verifying the whole log: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	s.restartServiceAfter(t, "authority", func() {
		db, err := sql.Open("sqlite", filepath.Join(data, "authority.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := audittamper.Rewrite(db, 2, "nothing happened"); err != nil {
			t.Fatal(err)
		}
	})
	// Online: the chain is self-consistent, the checkpoints are not.
	res = s.airlock(t, "audit", "verify", "--as", "approver/alice", "-o", "json")
	var rep struct {
		Unbroken  bool   `json:"unbroken"`
		Disagrees string `json:"disagrees"`
		Halted    string `json:"halted"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("verify -o json: %v\n%s%s", err, res.stdout, res.stderr)
	}
	if res.code != 1 || !strings.Contains(rep.Disagrees, "checkpoint at sequence") || rep.Halted == "" {
		t.Fatalf("online verify after the rewrite: exit %d, report %+v\n%s", res.code, rep, res.stderr)
	}
	// Offline, against the checkpoints a monitor kept: the same.
	forged := filepath.Join(t.TempDir(), "forged.jsonl")
	if res := s.airlock(t, "audit", "export", "--as", "approver/alice", "--out", forged); res.code != 0 {
		t.Fatalf("export: exit %d\n%s", res.code, res.stderr)
	}
	pub := filepath.Join(data, "audit-checkpoint.key.pub")
	res = s.airlock(t, "audit", "verify", "--file", forged, "--checkpoints", kept, "--key", pub)
	if res.code != 1 || !strings.Contains(res.stdout, "REWRITTEN") || !strings.Contains(res.stdout, "checkpoint at sequence") {
		t.Fatalf("offline verify of the rewritten log: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// Offline, a key must be pinned: the forger can sign checkpoints of
	// its own for the rewritten log, and they do not pass for the
	// authority's.
	if res := s.airlock(t, "audit", "verify", "--file", forged, "--checkpoints", kept); res.code != 2 || !strings.Contains(res.stderr, "--key") {
		t.Fatalf("offline verify without --key: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	forgedCps := filepath.Join(t.TempDir(), "forged-checkpoints.jsonl")
	writeForgedCheckpoint(t, forged, forgedCps)
	res = s.airlock(t, "audit", "verify", "--file", forged, "--checkpoints", forgedCps, "--key", pub)
	if res.code != 1 || !strings.Contains(res.stderr+res.stdout, "not the pinned key") {
		t.Fatalf("offline verify against the forger's own checkpoint: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// The authority signed nothing over the rewritten log and said so.
	log, _ := os.ReadFile(filepath.Join(s.dir, "authority", "authority.log"))
	if !strings.Contains(string(log), "AUDIT LOG TAMPERED") {
		t.Errorf("the authority's log does not report the rewrite")
	}
}

// writeForgedCheckpoint signs, with a fresh key, a checkpoint of the last
// entry of the export at exportPath, as a forger would for its rewrite.
func writeForgedCheckpoint(t *testing.T, exportPath, out string) {
	t.Helper()
	data, err := os.ReadFile(exportPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var last struct {
		Sequence string `json:"sequence"`
		Hash     string `json:"hash"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	seq, err := strconv.ParseInt(last.Sequence, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c, err := audit.SignCheckpoint(key, audit.Event{Sequence: seq, Hash: last.Hash}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	line, err := c.MarshalLine()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, line, 0o600); err != nil {
		t.Fatal(err)
	}
}
