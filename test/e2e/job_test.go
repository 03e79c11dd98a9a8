//go:build linux

package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"github.com/airlockhq/airlock/test/gittest"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/provenance"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// sampleRepo makes a small git repository whose test checks a greeting.
func sampleRepo(t testing.TB) (dir, commit string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "sample")
	files := map[string]string{
		"README.md":     "# sample\n",
		"lib/greet.txt": "hello\n",
		"test.sh":       "#!/bin/sh\nset -e\ngot=$(cat lib/greet.txt)\n[ \"$got\" = \"hello, airlock\" ] || { echo \"FAIL: greeting is '$got'\"; exit 3; }\necho PASS\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	git(t, dir, "init", "-q", "-b", "main")
	git(t, dir, "add", "-A")
	git(t, dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "sample")
	return dir, strings.TrimSpace(git(t, dir, "rev-parse", "HEAD"))
}

// git runs git in dir in gittest's sealed environment (fixed identity and
// dates, nobody's configuration) and returns its standard output.
func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	return gittest.Run(t, dir, args...)
}

// submit runs `airlock job submit` with args and returns the result.
func (s *stack) airlock(t testing.TB, args ...string) result {
	t.Helper()
	return runCommand(t, s.env(), bin("airlock"), args...)
}

func (s *stack) job(t testing.TB, id string) *authorityv1.Job {
	t.Helper()
	res := s.airlock(t, "job", "get", id, "-o", "json")
	if res.code != 0 {
		t.Fatalf("job get %s: exit %d: %s", id, res.code, res.stderr)
	}
	job := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
		t.Fatalf("job get -o json: %v\n%s", err, res.stdout)
	}
	return job
}

func TestJobEditsRepoRunsTestsAndReturnsAnApplicablePatch(t *testing.T) {
	repo, base := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)

	// First the job as checked in: its test fails with status 3, and the
	// CLI exits with the job's own status.
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--wait", "--", "./test.sh")
	if res.code != 3 || !strings.Contains(res.stdout, "FAIL: greeting is 'hello'") {
		t.Fatalf("unedited test: exit %d, want 3\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}

	// Then the useful work: edit, run the tests, see them pass.
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--wait", "-o", "json", "--",
		"sh", "-c", `printf 'hello, airlock\n' > lib/greet.txt && echo new > NEW.txt && ./test.sh`)
	if res.code != 0 {
		t.Fatalf("edit and test: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stderr, "PASS") {
		t.Errorf("the job's output (on stderr with -o json) lacks PASS:\n%s", res.stderr)
	}
	job := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
		t.Fatalf("final job JSON: %v\n%s", err, res.stdout)
	}
	r := job.GetResult()
	if job.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || r.GetReason() != typesv1.TerminationReason_TERMINATION_REASON_EXITED || r.GetExitCode() != 0 {
		t.Fatalf("job %s: state %v reason %v exit %d", job.GetJobId(), job.GetState(), r.GetReason(), r.GetExitCode())
	}
	if job.GetCommit() != base {
		t.Errorf("commit %s, want main's %s", job.GetCommit(), base)
	}
	if ds := r.GetDiffStat(); ds.GetFilesChanged() != 2 || ds.GetInsertions() != 2 || ds.GetDeletions() != 1 {
		t.Errorf("diff stat %+v, want 2 files +2 -1", ds)
	}
	if r.GetRuntimeVersion() == "" || r.GetTemplateVersion() == "" || r.GetUsage().GetWallTime().AsDuration() <= 0 {
		t.Errorf("result lacks runtime/template version or usage: %+v", r)
	}

	// The publisher's view: fetch the bundle, check digest and provenance,
	// and apply its patch to the base commit.
	bundleBytes, header := fetchArtifact(t, s, job.GetJobId(), r.GetBundleDigest())
	roots, err := pkiRoots(s.pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := provenance.Verify(header.GetProvenance(), r.GetBundleDigest(), roots, identity.Service("airlock.local", identity.ServiceExecutor))
	if err != nil {
		t.Fatalf("provenance: %v", err)
	}
	if v.Statement.Predicate.JobID != job.GetJobId() || v.Statement.Predicate.BaseCommit != base {
		t.Errorf("provenance predicate %+v does not describe the job", v.Statement.Predicate)
	}
	patch := tarEntry(t, bundleBytes, "patch.diff")
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, filepath.Dir(clone), "clone", "-q", repo, clone)
	git(t, clone, "checkout", "-q", base)
	if err := os.WriteFile(filepath.Join(clone, "job.patch"), patch, 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, clone, "apply", "--index", "job.patch")
	if got, _ := os.ReadFile(filepath.Join(clone, "lib", "greet.txt")); string(got) != "hello, airlock\n" {
		t.Errorf("after applying the patch greet.txt is %q", got)
	}

	// The retained source was not touched by the job: the same commit
	// again fails its test exactly as before.
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--rev", base, "--wait", "--", "./test.sh")
	if res.code != 3 {
		t.Fatalf("rerun on the base commit: exit %d, want 3 (the retained source must be unchanged)\n%s", res.code, res.stdout)
	}
}

func fetchArtifact(t *testing.T, s *stack, jobID, digest string) ([]byte, *executorv1.ArtifactHeader) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := executorv1.NewExecutorServiceClient(s.dial(t, "service/publisher", "executor")).GetArtifact(ctx,
		&executorv1.GetArtifactRequest{JobId: jobID, BundleDigest: digest})
	if err != nil {
		t.Fatal(err)
	}
	var header *executorv1.ArtifactHeader
	var buf bytes.Buffer
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("GetArtifact: %v", err)
		}
		if h := msg.GetHeader(); h != nil {
			header = h
		}
		buf.Write(msg.GetChunk())
	}
	if header == nil || header.GetBundleDigest() != digest || header.GetSize() != int64(buf.Len()) {
		t.Fatalf("artifact header %+v for %d bytes, want digest %s", header, buf.Len(), digest)
	}
	return buf.Bytes(), header
}

func tarEntry(t *testing.T, data []byte, name string) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("bundle has no %s: %v", name, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

func pkiRoots(dir string) (*x509.CertPool, error) {
	data, err := os.ReadFile(pki.CAPath(dir))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("no CA certificate")
	}
	return pool, nil
}

func TestSubmitIsIdempotentAndPolicyErrorsNameTheField(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	var ids []string
	for range 2 {
		res := s.airlock(t, "job", "submit", "--repo", "sample", "--idempotency-key", "same-key", "-o", "json", "--", "true")
		if res.code != 0 {
			t.Fatalf("submit: exit %d: %s", res.code, res.stderr)
		}
		var j struct {
			JobID string `json:"jobId"`
		}
		if err := json.Unmarshal([]byte(res.stdout), &j); err != nil || j.JobID == "" {
			t.Fatalf("submit -o json: %v\n%s", err, res.stdout)
		}
		ids = append(ids, j.JobID)
	}
	if ids[0] != ids[1] {
		t.Fatalf("one idempotency key gave two jobs: %v", ids)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--repo", "nope"}, "spec.repository"},
		{[]string{"--repo", "sample", "--rev", "no-such-branch"}, "spec.revision"},
		{[]string{"--repo", "sample", "--memory", "64GiB"}, "spec.resources.memory_bytes"},
		{[]string{"--repo", "sample", "--env", "GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789"}, "spec.env"},
		{[]string{"--repo", "sample", "--tenant", "other"}, "tenant"},
	} {
		res := s.airlock(t, append(append([]string{"job", "submit"}, tc.args...), "--", "true")...)
		if res.code == 0 || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("submit %v: exit %d, stderr %q; want a refusal naming %s", tc.args, res.code, res.stderr, tc.want)
		}
	}
}
