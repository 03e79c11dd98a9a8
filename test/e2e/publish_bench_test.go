//go:build linux

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// publishBench is a stack serving one repository, with clients for the
// roles a publish needs.
type publishBench struct {
	s         *stack
	client    authorityv1.AuthorityServiceClient
	alice     authorityv1.AuthorityServiceClient
	publisher publisherv1.PublisherServiceClient
}

func newPublishBench(b *testing.B) *publishBench {
	s := startStack(b, "--repo", "bench="+benchRepo(b, 3))
	return &publishBench{
		s:         s,
		client:    authorityv1.NewAuthorityServiceClient(s.dial(b, "client/dev", "authority")),
		alice:     authorityv1.NewAuthorityServiceClient(s.dial(b, "approver/alice", "authority")),
		publisher: publisherv1.NewPublisherServiceClient(s.dial(b, "pipeline/deploy", "publisher")),
	}
}

// approved runs a job that adds one line to file name and approves its
// result; it returns the approval id.
func (p *publishBench) approved(ctx context.Context, b *testing.B, name string) string {
	resp, err := p.client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{
		Tenant: "dev", IdempotencyKey: "publish-bench-" + name,
		Spec: &authorityv1.JobSpec{Repository: "bench", Revision: "main", Command: []string{"sh", "-c", "echo " + name + " >> " + name + ".txt"},
			PublishTarget: &typesv1.PublishTarget{Repository: "bench", Branch: "main"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	job := resp.GetJob().GetJobId()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		list, err := p.alice.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{States: []authorityv1.ApprovalState{authorityv1.ApprovalState_APPROVAL_STATE_PENDING}})
		if err != nil {
			b.Fatal(err)
		}
		for _, a := range list.GetApprovals() {
			if a.GetJobId() == job {
				if _, err := p.alice.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: a.GetApprovalId(), BundleDigest: a.GetBundleDigest(),
					Decision: authorityv1.Decision_DECISION_APPROVE}); err != nil {
					b.Fatal(err)
				}
				return a.GetApprovalId()
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("job %s opened no approval in time", job)
		}
	}
}

// medianMS reports the median of ds, which the mean of a latency on a
// shared machine is not.
func medianMS(b *testing.B, ds []time.Duration) {
	b.ReportMetric(float64(median(ds).Microseconds())/1000, "median-ms")
}

// BenchmarkPublish is one publish of a one-line change, timed from the
// pipeline's Publish to its answer: GetPublishSpec, fetching and
// re-hashing the bundle, its provenance and grant, a read lease and a
// fetch of the branch over HTTPS, the content scan, the commit, the
// consume, the deploy lease, the push over HTTPS and the revoke, each
// step written to the publisher's store. The job and its approval are
// made with the timer stopped.
func BenchmarkPublish(b *testing.B) {
	p := newPublishBench(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var ds []time.Duration
	b.StopTimer()
	for i := range b.N {
		approval := p.approved(ctx, b, fmt.Sprintf("p%d", i))
		b.StartTimer()
		start := time.Now()
		resp, err := p.publisher.Publish(ctx, &publisherv1.PublishRequest{ApprovalId: approval, IdempotencyKey: approval})
		ds = append(ds, time.Since(start))
		b.StopTimer()
		if err != nil || resp.GetDeployment().GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED {
			b.Fatalf("publish %s: %v %v", approval, resp.GetDeployment().GetState(), err)
		}
	}
	medianMS(b, ds)
}

// BenchmarkRawGitPublish is the baseline: the same one-line change landed
// with git alone, on the same git server over the same HTTPS: fetch the
// branch, `git apply --index`, commit, push with the deploy token.
func BenchmarkRawGitPublish(b *testing.B) {
	p := newPublishBench(b)
	token, err := os.ReadFile(filepath.Join(p.s.dir, "authority", "credentials", "bench.deploy"))
	if err != nil {
		b.Fatal(err)
	}
	header := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+strings.TrimSpace(string(token))))
	remote := p.s.repos["bench"]
	work := filepath.Join(b.TempDir(), "work")
	cfg := []string{"-c", "http.sslCAInfo=" + filepath.Join(p.s.pkiDir, "ca.crt"), "-c", "http.extraHeader=" + header,
		"-c", "user.name=bench", "-c", "user.email=bench@example.com"}
	// This machine's GIT_SSL_CAINFO would override http.sslCAInfo.
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GIT_") {
			env = append(env, e)
		}
	}
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", append(cfg, args...)...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("git %s: %v\n%s", args[0], err, out)
		}
	}
	run("", "clone", "-q", remote, work)
	var ds []time.Duration
	b.StopTimer()
	for i := range b.N {
		name := fmt.Sprintf("r%d", i)
		patch := fmt.Sprintf("diff --git a/%[1]s.txt b/%[1]s.txt\nnew file mode 100644\n--- /dev/null\n+++ b/%[1]s.txt\n@@ -0,0 +1 @@\n+%[1]s\n", name)
		patchFile := filepath.Join(b.TempDir(), "p.diff")
		if err := os.WriteFile(patchFile, []byte(patch), 0o600); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		run(work, "fetch", "-q", "origin", "main")
		run(work, "reset", "-q", "--hard", "origin/main")
		run(work, "apply", "--index", patchFile)
		run(work, "commit", "-q", "-m", "land "+name)
		run(work, "push", "-q", "origin", "HEAD:main")
		ds = append(ds, time.Since(start))
		b.StopTimer()
	}
	medianMS(b, ds)
}
