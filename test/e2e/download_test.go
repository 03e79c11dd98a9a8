//go:build linux

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDownloadBundleVerifiesOffline: a client downloads a finished job's
// bundle and provenance envelope (airlock job download), byte for byte what
// the executor holds and named by the digest the authority recorded; the
// envelope verifies with docs/verify-provenance.sh (openssl and jq, no
// Airlock code) against the dev CA and the executor's SPIFFE ID, and the
// same script refuses the bundle with one byte changed and another signer.
// The tenant's approver may download it too, a pipeline may not; and a
// bundle altered on the executor's disk leaves nothing behind, not even
// over an earlier download.
func TestDownloadBundleVerifiesOffline(t *testing.T) {
	for _, tool := range []string{"openssl", "jq", "sha256sum", "base64"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (the offline verification in docs/auditing.md needs it)", tool, err)
		}
	}
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "-o", "json", "--", "sh", "-c", "echo audited >> README.md; echo out > /out/report.txt")
	if res.code != 0 {
		t.Fatalf("job: exit %d\n%s", res.code, res.stderr)
	}
	var submitted struct {
		JobID string `json:"jobId"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &submitted); err != nil || submitted.JobID == "" {
		t.Fatalf("job JSON: %v\n%s", err, res.stdout)
	}
	jobID := submitted.JobID
	job := s.job(t, jobID)
	digest := job.GetResult().GetBundleDigest()
	if digest == "" {
		t.Fatalf("job %s has no bundle digest: %v", jobID, job)
	}
	held, err := os.ReadFile(filepath.Join(s.dir, "executor", "data", "runs", jobID, "bundle.tar"))
	if err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(t.TempDir(), "audit")
	res = s.airlock(t, "job", "download", jobID, "--out", dir)
	if res.code != 0 {
		t.Fatalf("job download: exit %d\n%s", res.code, res.stderr)
	}
	got, err := os.ReadFile(filepath.Join(dir, "bundle.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(got); "sha256:"+hex.EncodeToString(sum[:]) != digest || !bytes.Equal(got, held) {
		t.Fatalf("downloaded %d bytes, sha256 %x; want the executor's %d bytes, %s", len(got), sum, len(held), digest)
	}
	if !strings.Contains(res.stdout, digest+", ") || !strings.Contains(res.stdout, "verified") {
		t.Errorf("job download printed:\n%s", res.stdout)
	}

	script, err := filepath.Abs(filepath.Join("..", "..", "docs", "verify-provenance.sh"))
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(s.dir, "pki", "ca.crt")
	executor := "spiffe://" + trustDomain + "/service/executor"
	verify := func(signer, dir string) result {
		return runCommand(t, nil, "sh", script, ca, signer, dir)
	}
	if v := verify(executor, dir); v.code != 0 || !strings.Contains(v.stdout, "verified: ") || !strings.Contains(v.stdout, `"job_id": "`+jobID+`"`) {
		t.Fatalf("verify-provenance.sh: exit %d\nstdout:\n%s\nstderr:\n%s", v.code, v.stdout, v.stderr)
	}
	if v := verify("spiffe://"+trustDomain+"/client/dev", dir); v.code != 1 || !strings.Contains(v.stderr, "NOT VERIFIED: the signing certificate is "+executor) {
		t.Errorf("verify-provenance.sh with another signer: exit %d\n%s", v.code, v.stderr)
	}
	altered := filepath.Join(t.TempDir(), "altered")
	if err := os.MkdirAll(altered, 0o755); err != nil {
		t.Fatal(err)
	}
	changed := bytes.Clone(got)
	changed[len(changed)/2] ^= 1
	env, err := os.ReadFile(filepath.Join(dir, "provenance.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"bundle.tar": changed, "provenance.json": env} {
		if err := os.WriteFile(filepath.Join(altered, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if v := verify(executor, altered); v.code != 1 || !strings.Contains(v.stderr, "NOT VERIFIED: ") || !strings.Contains(v.stderr, "the statement is about") {
		t.Errorf("verify-provenance.sh on a changed bundle: exit %d\n%s", v.code, v.stderr)
	}
	// The statement changed (another exit status), the bundle as it was.
	var e map[string]any
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	payload, err := base64.StdEncoding.DecodeString(e["payload"].(string))
	if err != nil {
		t.Fatal(err)
	}
	e["payload"] = base64.StdEncoding.EncodeToString(bytes.Replace(payload, []byte(`"exit_code":0`), []byte(`"exit_code":1`), 1))
	forged, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"bundle.tar": got, "provenance.json": forged} {
		if err := os.WriteFile(filepath.Join(altered, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if v := verify(executor, altered); v.code != 1 || !strings.Contains(v.stderr, "NOT VERIFIED: the signature does not verify") {
		t.Errorf("verify-provenance.sh on a changed statement: exit %d\n%s", v.code, v.stderr)
	}

	if res := s.airlock(t, "--as", "approver/alice", "job", "download", jobID, "--out", t.TempDir()); res.code != 0 {
		t.Errorf("the tenant's approver: exit %d\n%s", res.code, res.stderr)
	}
	pipelineDir := t.TempDir()
	if res := s.airlock(t, "--as", "pipeline/deploy", "job", "download", jobID, "--out", pipelineDir); res.code == 0 || !strings.Contains(res.stderr, "permission denied") {
		t.Errorf("a pipeline: exit %d\n%s", res.code, res.stderr)
	}
	checkNothingWritten(t, pipelineDir)

	// The executor's copy altered on its disk: the download fails and
	// neither replaces what an earlier one wrote nor leaves a file of its
	// own.
	if err := os.WriteFile(filepath.Join(s.dir, "executor", "data", "runs", jobID, "bundle.tar"), changed, 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := t.TempDir()
	if res := s.airlock(t, "job", "download", jobID, "--out", fresh); res.code == 0 {
		t.Errorf("a bundle altered on the executor: exit 0\n%s", res.stdout)
	} else {
		t.Logf("a bundle altered on the executor: %s", strings.TrimSpace(res.stderr))
	}
	checkNothingWritten(t, fresh)
	if res := s.airlock(t, "job", "download", jobID, "--out", dir); res.code == 0 {
		t.Errorf("a bundle altered on the executor, over an earlier download: exit 0")
	}
	if again, err := os.ReadFile(filepath.Join(dir, "bundle.tar")); err != nil || !bytes.Equal(again, got) {
		t.Errorf("the earlier download was replaced (%v)", err)
	}
	if v := verify(executor, dir); v.code != 0 {
		t.Errorf("the earlier download no longer verifies: %s", v.stderr)
	}
}

// checkNothingWritten fails t when dir holds any file.
func checkNothingWritten(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("%s was left in %s", e.Name(), dir)
	}
}
