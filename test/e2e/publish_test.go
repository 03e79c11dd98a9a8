//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/pkg/authz"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// The publish tests take the attacker's side of the publisher: a job that
// writes what should never land, a pipeline that asks for what was not
// approved or asks twice at once, a caller that is not a pipeline, and a
// branch that moves under an approval. Each one looks at what an outsider
// would see: the served repository on disk, the approval, the leases.

// pubTarget is where every job of these tests asks to be published.
const pubTarget = "sample:main"

// pubPipeline and pubAlice are the SPIFFE IDs the publisher and the commit
// name for the dev stack's pipeline and approver.
const (
	pubPipeline = "spiffe://" + trustDomain + "/pipeline/deploy"
	pubAlice    = "spiffe://" + trustDomain + "/approver/alice"
)

// landedSteps are the steps of a publish that landed, in order.
var landedSteps = []string{"accepted", "verified", "validated", "prepared", "consumed", "leased", "pushed", "revoked"}

// publishStack is a dev stack serving the sample repository.
type publishStack struct {
	*stack
	// bare is the served repository on disk: what anyone cloning it gets.
	bare string
	// base is the sample's one commit, main's tip at the start.
	base string
	// authority is the authority as approver/alice; publisher the
	// publisher as pipeline/deploy.
	authority authorityv1.AuthorityServiceClient
	publisher publisherv1.PublisherServiceClient
}

func startPublishStack(t *testing.T) *publishStack {
	t.Helper()
	repo, base := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	if s.git == nil {
		t.Fatal("dev up started no git server")
	}
	p := &publishStack{
		stack: s, bare: filepath.Join(s.git.DataDir, "sample.git"), base: base,
		authority: authorityv1.NewAuthorityServiceClient(s.dial(t, "approver/alice", "authority")),
		publisher: publisherv1.NewPublisherServiceClient(s.dial(t, "pipeline/deploy", "publisher")),
	}
	if tip := p.tip(t); tip != base {
		t.Fatalf("the served main is %s, want the sample's %s", tip, base)
	}
	return p
}

// bareGit runs git on the served repository and returns its stdout.
func (p *publishStack) bareGit(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"--git-dir=" + p.bare}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s on the served repository: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// tip is the served main's commit.
func (p *publishStack) tip(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(p.bareGit(t, "rev-parse", "--verify", "refs/heads/main^{commit}"))
}

// submitJob runs script (sh -c) in a job on main asking to be published to
// sample:main, waits for it to finish, and returns the job, its approval
// (pending) and what the job printed.
func (p *publishStack) submitJob(t *testing.T, script string) (job *authorityv1.Job, approvalID, output string) {
	t.Helper()
	res := p.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--publish-to", pubTarget,
		"--wait", "-o", "json", "--", "sh", "-c", script)
	job = &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil || res.code != 0 {
		t.Fatalf("job submit: exit %d, %v\nstdout:\n%s\nstderr:\n%s", res.code, err, res.stdout, res.stderr)
	}
	if job.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || job.GetResult().GetExitCode() != 0 || job.GetResult().GetBundleDigest() == "" {
		t.Fatalf("job %s: %v, exit %d, bundle %q; want finished with status 0 and a bundle\n%s",
			job.GetJobId(), job.GetState(), job.GetResult().GetExitCode(), job.GetResult().GetBundleDigest(), res.stderr)
	}
	return job, p.approvalOf(t, job), res.stderr
}

// approvalOf returns the publish approval opened for job's result, which
// opens just after the result is recorded.
func (p *publishStack) approvalOf(t *testing.T, job *authorityv1.Job) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		resp, err := p.authority.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{PageSize: 500})
		if err != nil {
			t.Fatalf("list approvals: %v", err)
		}
		for _, a := range resp.GetApprovals() {
			if a.GetJobId() != job.GetJobId() {
				continue
			}
			if a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING || a.GetBundleDigest() != job.GetResult().GetBundleDigest() ||
				a.GetTarget().GetRepository() != "sample" || a.GetTarget().GetBranch() != "main" ||
				a.GetKind() != authorityv1.ApprovalKind_APPROVAL_KIND_PUBLISH {
				t.Fatalf("job %s's approval is %v, want a pending publish approval of bundle %s to %s", job.GetJobId(), a, job.GetResult().GetBundleDigest(), pubTarget)
			}
			return a.GetApprovalId()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no approval opened for job %s", job.GetJobId())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// approve approves id as approver/alice.
func (p *publishStack) approve(t *testing.T, id string) {
	t.Helper()
	res := p.airlock(t, "approval", "approve", id, "--as", "approver/alice", "--comment", "reviewed")
	if res.code != 0 || !strings.Contains(res.stdout, "approved") {
		t.Fatalf("approve %s as alice: exit %d\n%s%s", id, res.code, res.stdout, res.stderr)
	}
}

// approvalState reads approval id as alice.
func (p *publishStack) approvalState(t *testing.T, id string) authorityv1.ApprovalState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := p.authority.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: id})
	if err != nil {
		t.Fatalf("get approval %s: %v", id, err)
	}
	return resp.GetApproval().GetState()
}

// publish runs `airlock publish APPROVAL -o json` (as pipeline/deploy, the
// CLI's default) and returns the run and the deployment it printed, which
// it prints for a refusal too.
func (p *publishStack) publish(t *testing.T, approvalID string, args ...string) (result, *publisherv1.Deployment) {
	t.Helper()
	res := p.airlock(t, append([]string{"publish", approvalID, "-o", "json"}, args...)...)
	d := &publisherv1.Deployment{}
	if err := protojson.Unmarshal([]byte(res.stdout), d); err != nil {
		t.Fatalf("publish %s %v: exit %d, no deployment printed (%v)\nstdout:\n%s\nstderr:\n%s", approvalID, args, res.code, err, res.stdout, res.stderr)
	}
	return res, d
}

// leases returns every lease issued for job, active or not, as alice
// reads them.
func (p *publishStack) leases(t *testing.T, jobID string) []*authorityv1.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := p.authority.ListLeases(ctx, &authorityv1.ListLeasesRequest{JobId: jobID, IncludeInactive: true, PageSize: 500})
	if err != nil {
		t.Fatalf("list leases of %s: %v", jobID, err)
	}
	return resp.GetLeases()
}

// checkNoActiveLease fails if any lease of job is still usable, or if
// one was held by another than the publisher, and returns how many deploy
// leases were ever issued for it.
func (p *publishStack) checkNoActiveLease(t *testing.T, jobID string) (deploy int) {
	t.Helper()
	for _, l := range p.leases(t, jobID) {
		if l.GetRevokedAt() == nil && l.GetExpiresAt().AsTime().After(time.Now()) {
			t.Errorf("lease %s (%v) of job %s is still active", l.GetLeaseId(), l.GetPurpose(), jobID)
		}
		if l.GetHolder() != "spiffe://"+trustDomain+"/service/publisher" {
			t.Errorf("lease %s of job %s is held by %s", l.GetLeaseId(), jobID, l.GetHolder())
		}
		if l.GetPurpose() == authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY {
			deploy++
		}
	}
	return deploy
}

// deploymentsOf lists job's deployments as pipeline/deploy.
func (p *publishStack) deploymentsOf(t *testing.T, jobID string) []*publisherv1.Deployment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := p.publisher.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{JobId: jobID, PageSize: 500})
	if err != nil {
		t.Fatalf("list deployments of %s: %v", jobID, err)
	}
	return resp.GetDeployments()
}

// pushByHand commits content to path on the served main as a maintainer
// would, outside Airlock: a clone of the repository on disk, a commit, a
// fast-forward push. It returns the new tip.
func (p *publishStack) pushByHand(t *testing.T, path, content, message string) string {
	t.Helper()
	clone := filepath.Join(t.TempDir(), "by-hand")
	git(t, filepath.Dir(clone), "clone", "-q", "--branch", "main", p.bare, clone)
	if err := os.WriteFile(filepath.Join(clone, path), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, clone, "add", "--", path)
	git(t, clone, "-c", "user.name=Maintainer", "-c", "user.email=maintainer@example.com", "commit", "-q", "-m", message)
	git(t, clone, "push", "-q", "origin", "HEAD:refs/heads/main")
	want := strings.TrimSpace(git(t, clone, "rev-parse", "HEAD"))
	if tip := p.tip(t); tip != want {
		t.Fatalf("after the push by hand main is %s, want %s", tip, want)
	}
	return want
}

// gitLines splits git's output into its non-empty lines.
func gitLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// pubStepNames are the names of d's steps, in the order given.
func pubStepNames(d *publisherv1.Deployment) []string {
	var out []string
	for _, s := range d.GetSteps() {
		out = append(out, s.GetStep())
	}
	return out
}

// checkUnspentRefusal checks what a refused publish of approvalID must
// leave: a failed deployment that spent nothing, the approval approved,
// main at tip, and no lease of job usable and no deploy lease issued.
func (p *publishStack) checkUnspentRefusal(t *testing.T, d *publisherv1.Deployment, job *authorityv1.Job, approvalID, tip string) {
	t.Helper()
	if d.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_FAILED || d.GetCommit() != "" ||
		!strings.Contains(d.GetMessage(), "the approval was not spent") {
		t.Errorf("deployment %s: %v, commit %q, message %q; want failed, no commit, the approval not spent",
			d.GetDeploymentId(), d.GetState(), d.GetCommit(), d.GetMessage())
	}
	if steps := pubStepNames(d); slices.Contains(steps, "consumed") || slices.Contains(steps, "leased") || slices.Contains(steps, "pushed") {
		t.Errorf("deployment %s recorded steps %v, want none that spends", d.GetDeploymentId(), steps)
	}
	if st := p.approvalState(t, approvalID); st != authorityv1.ApprovalState_APPROVAL_STATE_APPROVED {
		t.Errorf("approval %s is %v after the refusal, want still approved (unspent)", approvalID, st)
	}
	if got := p.tip(t); got != tip {
		t.Errorf("main moved to %s after a refused publish, want it at %s", got, tip)
	}
	if n := p.checkNoActiveLease(t, job.GetJobId()); n != 0 {
		t.Errorf("%d deploy leases were issued for job %s, whose publish was refused", n, job.GetJobId())
	}
}

// TestPublishLandsExactlyTheApprovedCommit: an approved result lands as
// one commit on its base, with its trailers and Airlock's name, spending
// the approval and leaving no lease; asking again (with any key) returns
// the same deployment, and a key reused for another approval is refused.
func TestPublishLandsExactlyTheApprovedCommit(t *testing.T) {
	t.Parallel()
	p := startPublishStack(t)

	// The job fixes the greeting and also plants what a checkout would
	// run: a hook in its own .git (the disposable repository every job's
	// /work is) and a nested repository's config. The executor leaves
	// every .git entry out of the patch, saying so of those the job made
	// itself; no job can hand the publisher one.
	job, approvalID, _ := p.submitJob(t, `printf 'hello, airlock\n' > lib/greet.txt &&
mkdir -p .git/hooks sub/.git &&
printf '#!/bin/sh\ntouch /tmp/airlock-e2e-pwned\n' > .git/hooks/post-checkout &&
printf '[core]\n\tfsmonitor = touch /tmp/airlock-e2e-pwned\n' > sub/.git/config`)
	if msg := job.GetResult().GetMessage(); !strings.Contains(msg, "left out of the patch: 1 .git entries (sub/.git)") {
		t.Errorf("job message %q, want it to say the nested .git was left out", msg)
	}
	if job.GetCommit() != p.base {
		t.Fatalf("job ran on %s, want main's %s", job.GetCommit(), p.base)
	}
	digest := job.GetResult().GetBundleDigest()
	p.approve(t, approvalID)

	res, d := p.publish(t, approvalID)
	if res.code != 0 || d.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED {
		t.Fatalf("publish: exit %d, %v %q\n%s", res.code, d.GetState(), d.GetMessage(), res.stderr)
	}
	commit := d.GetCommit()

	// The served branch: one new commit, on the job's base, changing the
	// one file the job changed, in the name of Airlock, with its trailers.
	if tip := p.tip(t); tip != commit {
		t.Fatalf("main is %s, want the deployment's commit %s", tip, commit)
	}
	if got := gitLines(p.bareGit(t, "rev-list", "--parents", p.base+".."+commit)); len(got) != 1 || got[0] != commit+" "+p.base {
		t.Errorf("commits on top of the base (with parents): %q, want exactly %s with parent %s", got, commit, p.base)
	}
	if got := p.bareGit(t, "diff-tree", "-r", "--no-commit-id", "--no-renames", "--name-status", p.base, commit); got != "M\tlib/greet.txt\n" {
		t.Errorf("the commit changes %q, want only lib/greet.txt modified", got)
	}
	if got := p.bareGit(t, "show", commit+":lib/greet.txt"); got != "hello, airlock\n" {
		t.Errorf("lib/greet.txt in the commit is %q", got)
	}
	if got := gitLines(p.bareGit(t, "ls-tree", "-r", "--name-only", commit)); !slices.Equal(got, []string{"README.md", "lib/greet.txt", "test.sh"}) {
		t.Errorf("the commit's tree holds %q, want the sample's three files and nothing of .git", got)
	}
	if got := p.bareGit(t, "log", "-1", "--format=%an <%ae>%n%cn <%ce>%n%s", commit); got != "Airlock <airlock@localhost>\nAirlock <airlock@localhost>\nAirlock: land job "+job.GetJobId()+"\n" {
		t.Errorf("author, committer and subject:\n%s", got)
	}
	wantTrailers := []string{
		"Airlock-Job: " + job.GetJobId(),
		"Airlock-Bundle: " + digest,
		"Airlock-Approval: " + approvalID,
		"Approved-by: " + pubAlice,
	}
	if got := gitLines(p.bareGit(t, "log", "-1", "--format=%(trailers:only,unfold)", commit)); !slices.Equal(got, wantTrailers) {
		t.Errorf("trailers %q, want %q", got, wantTrailers)
	}

	// The deployment as the pipeline reads it back.
	res = p.airlock(t, "deployment", "get", d.GetDeploymentId(), "-o", "json")
	got := &publisherv1.Deployment{}
	if err := protojson.Unmarshal([]byte(res.stdout), got); err != nil || res.code != 0 {
		t.Fatalf("deployment get: exit %d, %v\n%s%s", res.code, err, res.stdout, res.stderr)
	}
	sum := sha256.Sum256([]byte("lib/greet.txt\x00"))
	for _, c := range []struct{ what, got, want string }{
		{"id", got.GetDeploymentId(), d.GetDeploymentId()},
		{"state", got.GetState().String(), "DEPLOYMENT_STATE_SUCCEEDED"},
		{"job", got.GetJobId(), job.GetJobId()},
		{"approval", got.GetApprovalId(), approvalID},
		{"bundle", got.GetBundleDigest(), digest},
		{"target", got.GetTarget().GetRepository() + ":" + got.GetTarget().GetBranch(), pubTarget},
		{"commit", got.GetCommit(), commit},
		{"base", got.GetBaseCommit(), p.base},
		{"parent", got.GetParentCommit(), p.base},
		{"approvers", strings.Join(got.GetApprovers(), ","), pubAlice},
		{"requester", got.GetRequester(), pubPipeline},
		{"tenant", got.GetTenant(), "dev"},
		{"idempotency key", got.GetIdempotencyKey(), "approval:" + approvalID},
		{"files digest", got.GetFilesDigest(), "sha256:" + hex.EncodeToString(sum[:])},
		{"message", got.GetMessage(), ""},
		{"steps", strings.Join(pubStepNames(got), " "), strings.Join(landedSteps, " ")},
	} {
		if c.got != c.want {
			t.Errorf("deployment %s: %q, want %q", c.what, c.got, c.want)
		}
	}
	for i := 1; i < len(got.GetSteps()); i++ {
		if got.GetSteps()[i].GetDoneAt().AsTime().Before(got.GetSteps()[i-1].GetDoneAt().AsTime()) {
			t.Errorf("step %s done before the step it follows: %v", got.GetSteps()[i].GetStep(), got.GetSteps())
		}
	}
	if len(got.GetFindings()) != 0 {
		t.Errorf("a landed deployment has findings: %v", got.GetFindings())
	}
	// The policy it was checked under is the one the authority gives for
	// the approval.
	spec, err := authorityv1.NewAuthorityServiceClient(p.dial(t, "service/publisher", "authority")).GetPublishSpec(context.Background(),
		&authorityv1.GetPublishSpecRequest{ApprovalId: approvalID})
	if err != nil {
		t.Fatalf("GetPublishSpec: %v", err)
	}
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(got.GetPolicyDigest()) || got.GetPolicyDigest() != spec.GetPolicyDigest() {
		t.Errorf("policy digest %q, want the authority's %q", got.GetPolicyDigest(), spec.GetPolicyDigest())
	}

	// Spent, and no credential left out.
	if st := p.approvalState(t, approvalID); st != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
		t.Errorf("approval is %v after the publish, want consumed", st)
	}
	res = p.airlock(t, "lease", "list", "--as", "approver/alice", "--job", job.GetJobId(), "-o", "json")
	active := &authorityv1.ListLeasesResponse{}
	if err := protojson.Unmarshal([]byte(res.stdout), active); err != nil || res.code != 0 || len(active.GetLeases()) != 0 {
		t.Errorf("lease list (active) for the job: exit %d, %v, want none\n%s%s", res.code, err, res.stdout, res.stderr)
	}
	if n := p.checkNoActiveLease(t, job.GetJobId()); n != 1 {
		t.Errorf("%d deploy leases issued for one push, want 1", n)
	}

	// Again, with the same key and with another: the same deployment,
	// and the branch stays where it is.
	for _, args := range [][]string{nil, {"--idempotency-key", "another-pipeline-run"}} {
		res, again := p.publish(t, approvalID, args...)
		if res.code != 0 || again.GetDeploymentId() != d.GetDeploymentId() || again.GetCommit() != commit ||
			again.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED {
			t.Errorf("publish again %v: exit %d, deployment %s %v commit %s; want %s succeeded with %s\n%s",
				args, res.code, again.GetDeploymentId(), again.GetState(), again.GetCommit(), d.GetDeploymentId(), commit, res.stderr)
		}
	}
	if tip := p.tip(t); tip != commit {
		t.Errorf("publishing again moved main to %s", tip)
	}
	if n := len(p.deploymentsOf(t, job.GetJobId())); n != 1 {
		t.Errorf("%d deployments for the job, want 1", n)
	}
	if n := p.checkNoActiveLease(t, job.GetJobId()); n != 1 {
		t.Errorf("%d deploy leases after publishing again, want still 1", n)
	}

	// The first approval's key with another approval: refused, naming the
	// key, and nothing of the other approval spent.
	job2, approval2, _ := p.submitJob(t, `printf 'second\n' > NEW.txt`)
	p.approve(t, approval2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = p.publisher.Publish(ctx, &publisherv1.PublishRequest{ApprovalId: approval2, IdempotencyKey: "approval:" + approvalID})
	if st := status.Convert(err); st.Code() != codes.AlreadyExists || !strings.Contains(st.Message(), "idempotency_key") {
		t.Errorf("another approval under a used key: %v, want AlreadyExists naming idempotency_key", err)
	}
	res = p.airlock(t, "publish", approval2, "--idempotency-key", "approval:"+approvalID)
	if res.code != 1 || !strings.Contains(res.stderr, "already exists") || !strings.Contains(res.stderr, "idempotency_key") {
		t.Errorf("airlock publish under a used key: exit %d, stderr %q; want 1 and already exists naming idempotency_key", res.code, res.stderr)
	}
	if st := p.approvalState(t, approval2); st != authorityv1.ApprovalState_APPROVAL_STATE_APPROVED {
		t.Errorf("the second approval is %v, want approved", st)
	}
	if n := len(p.deploymentsOf(t, job2.GetJobId())); n != 0 {
		t.Errorf("%d deployments for the refused second job, want 0", n)
	}
	if tip := p.tip(t); tip != commit {
		t.Errorf("main moved to %s", tip)
	}
}

// hostileScript prefixes every hostile job: gen ALPHABET N prints N
// random characters of ALPHABET. The jobs make their fake secrets in the
// sandbox, so neither this file nor any job's command holds one, and print
// them as SECRET=..., so the test can check no output repeats them.
const hostileScript = `gen() { tr -dc "$1" </dev/urandom | head -c "$2"; }
`

// TestPublishRefusesHostileResults: each result a job can make that must
// never land, approved all the same, is refused with its finding; the
// approval stays unspent, main does not move, no deploy lease is issued.
func TestPublishRefusesHostileResults(t *testing.T) {
	t.Parallel()
	p := startPublishStack(t)
	secretLine := regexp.MustCompile(`(?m)^SECRET=(\S+)$`)
	deploymentLine := regexp.MustCompile(`(?m)^deployment:\s+(\S+)$`)
	for _, tc := range []struct {
		name, script string
		// rule and path name the finding the refusal must carry; line is
		// its line when not 0, and message a part of its message.
		rule, path string
		line       int32
		message    string
		// shown is the path as the text output must show it.
		shown string
	}{
		{name: "symlink to /etc/shadow", script: `ln -s /etc/shadow shadow`,
			rule: "symlink.escapes", path: "shadow", message: "absolute path"},
		{name: "symlink out of the repository", script: `mkdir -p lib/deep && ln -s ../../../etc/passwd lib/deep/up`,
			rule: "symlink.escapes", path: "lib/deep/up", message: "out of the repository"},
		{name: "symlink into .git", script: `ln -s .git/config x`,
			rule: "symlink.into-git", path: "x"},
		{name: ".gitattributes as a symlink", script: `ln -s /etc/passwd .gitattributes`,
			rule: "symlink.gitmeta", path: ".gitattributes"},
		{name: "case-colliding paths", script: `printf 'upper\n' > lib/A.txt && printf 'lower\n' > lib/a.txt`,
			rule: "path.case-collision", path: "lib/A.txt", message: `"lib/a.txt"`},
		{name: "control characters in a path", script: `printf 'x\n' > "$(printf 'evil\033[2Jname')"`,
			rule: "path.control", path: "evil\x1b[2Jname", shown: `evil⟦\x1b⟧[2Jname`},
		// The tenant's cap is the default 10 MiB; the sandbox's disk (1 GiB)
		// holds the file, and the executor's diff passes it on.
		{name: "50 MB file", script: `yes 'a line of padding that makes this file far too large' | head -c 52428800 > big.txt`,
			rule: "file.too-large", path: "big.txt", message: "52428800 bytes"},
		{name: "binary file", script: `printf '\000\001\002binary\n' > blob.bin`,
			rule: "file.binary", path: "blob.bin"},
		{name: "AWS access key in an added line", script: `k=AKIA$(gen A-Z2-7 16)
printf 'import os\nKEY = "%s"\n' "$k" > config.py; echo "SECRET=$k"`,
			rule: "secret.aws-access-token", path: "config.py", line: 2},
		{name: "PEM private key", script: `kind="RSA PRIV""ATE KEY"; mkdir -p deploy
{ echo "-----BEGIN $kind-----"; for i in 1 2 3 4 5 6 7 8 9 10 11 12; do gen 'A-Za-z0-9+/' 64; echo; done; echo "-----END $kind-----"; } > deploy/id_rsa
echo "SECRET=$(sed -n 4p deploy/id_rsa)"`,
			rule: "secret.private-key", path: "deploy/id_rsa", line: 1},
		{name: "GitHub token", script: `tok=ghp_$(gen A-Za-z0-9 36)
printf 'package main\n\nconst token = "%s"\n' "$tok" > main.go; echo "SECRET=$tok"`,
			rule: "secret.github-pat", path: "main.go", line: 3},
		// A job writes /out through the sandbox's /out mount; the executor
		// puts those files in the bundle beside the patch, which is empty
		// here.
		{name: "AWS access key only in an /out file", script: `k=AKIA$(gen A-Z2-7 16)
printf '[default]\naws_access_key_id = %s\n' "$k" > /out/aws.ini; echo "SECRET=$k"`,
			rule: "secret.aws-access-token", path: "/out/aws.ini", line: 2},
		{name: "base64-wrapped token", script: `tok=ghp_$(gen A-Za-z0-9 36)
printf 'data: %s\n' "$(printf 'token=%s' "$tok" | base64 -w0)" > blob.txt; echo "SECRET=$tok"`,
			rule: "secret.github-pat", path: "blob.txt", line: 1, message: "found after decoding base64"},
		{name: "token base64-wrapped twice", script: `tok=ghp_$(gen A-Za-z0-9 36)
printf 'data: %s\n' "$(printf 'token=%s' "$tok" | base64 -w0 | base64 -w0)" > blob.txt; echo "SECRET=$tok"`,
			rule: "secret.github-pat", path: "blob.txt", line: 1, message: "found after decoding base64"},
		{name: "token with gitleaks:allow beside it", script: `tok=ghp_$(gen A-Za-z0-9 36)
printf 'var t = "%s" // gitleaks:allow\n' "$tok" > a.go; echo "SECRET=$tok"`,
			rule: "secret.github-pat", path: "a.go", line: 1},
		{name: "a workflow", script: `mkdir -p .github/workflows && printf 'on: push\njobs: {}\n' > .github/workflows/x.yml`,
			rule: "path.protected", path: ".github/workflows/x.yml"},
		{name: "the workflow directory as a symlink", script: `mkdir -p .github ci && printf 'on: push\n' > ci/x.yml && ln -s ../ci .github/workflows`,
			rule: "path.protected", path: ".github/workflows"},
		{name: "the scanner's own config", script: `printf '[allowlist]\npaths = [".*"]\n' > .gitleaks.toml`,
			rule: "path.protected", path: ".gitleaks.toml"},
		{name: "CODEOWNERS", script: `mkdir -p docs && printf '* @someone-else\n' > docs/CODEOWNERS`,
			rule: "path.protected", path: "docs/CODEOWNERS"},
		{name: ".gitmodules with a url that is an option", script: `printf '[submodule "x"]\n\tpath = x\n\turl = -upload-pack=touch /tmp/airlock-e2e-pwned\n' > .gitmodules`,
			rule: "gitmodules", path: ".gitmodules", message: "starts with '-'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, approvalID, output := p.submitJob(t, hostileScript+tc.script)
			secret := ""
			if m := secretLine.FindStringSubmatch(output); m != nil {
				secret = m[1]
			} else if strings.HasPrefix(tc.rule, "secret.") {
				t.Fatalf("the job printed no SECRET= line:\n%s", output)
			}
			p.approve(t, approvalID)

			// As a person at a terminal sees it: the refusal, its rule and
			// path (escaped), and that nothing was spent.
			res := p.airlock(t, "publish", approvalID)
			shown := tc.shown
			if shown == "" {
				shown = tc.path
			}
			if res.code != 1 || !strings.Contains(res.stdout, tc.rule) || !strings.Contains(res.stdout, shown) ||
				!strings.Contains(res.stdout, "nothing was spent") || !strings.Contains(res.stderr, "failed precondition") {
				t.Fatalf("publish: exit %d, want 1 with finding %s on %s\nstdout:\n%s\nstderr:\n%s", res.code, tc.rule, shown, res.stdout, res.stderr)
			}
			if strings.ContainsRune(res.stdout+res.stderr, '\x1b') {
				t.Errorf("the refusal printed a raw escape character to the terminal:\n%q", res.stdout)
			}
			m := deploymentLine.FindStringSubmatch(res.stdout)
			if m == nil {
				t.Fatalf("the refusal names no deployment:\n%s", res.stdout)
			}

			// Again as JSON: the same deployment, still refused.
			again, d := p.publish(t, approvalID)
			if again.code != 1 || d.GetDeploymentId() != m[1] {
				t.Errorf("publish again: exit %d, deployment %s; want 1 and the same deployment %s", again.code, d.GetDeploymentId(), m[1])
			}
			var found *publisherv1.Finding
			for _, f := range d.GetFindings() {
				if f.GetRule() == tc.rule && f.GetPath() == tc.path {
					found = f
				}
			}
			switch {
			case found == nil:
				t.Errorf("no %s finding on %q among %v", tc.rule, tc.path, d.GetFindings())
			case tc.line != 0 && found.GetLine() != tc.line:
				t.Errorf("%s at line %d, want %d", tc.rule, found.GetLine(), tc.line)
			case !strings.Contains(found.GetMessage(), tc.message):
				t.Errorf("%s message %q, want it to say %q", tc.rule, found.GetMessage(), tc.message)
			case secret != "" && found.GetRedacted() == "":
				t.Errorf("%s has no redaction", tc.rule)
			}
			if secret != "" {
				for what, out := range map[string]string{"text": res.stdout + res.stderr, "json": again.stdout + again.stderr} {
					if strings.Contains(out, secret) || strings.Contains(out, secret[6:14]) {
						t.Errorf("the %s refusal repeats (part of) the secret", what)
					}
				}
			}
			p.checkUnspentRefusal(t, d, job, approvalID, p.base)
		})
	}
}

// landedAndApproved publishes one job's result (job1, approval1, its
// deployment d1) and leaves a second one approved and unpublished (job2,
// approval2).
func (p *publishStack) landedAndApproved(t *testing.T) (job1 *authorityv1.Job, approval1 string, d1 *publisherv1.Deployment, job2 *authorityv1.Job, approval2 string) {
	t.Helper()
	job1, approval1, _ = p.submitJob(t, `printf 'hello, airlock\n' > lib/greet.txt`)
	p.approve(t, approval1)
	res, d1 := p.publish(t, approval1)
	if res.code != 0 || d1.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED {
		t.Fatalf("publish as the pipeline: exit %d, %v\n%s", res.code, d1.GetState(), res.stderr)
	}
	job2, approval2, _ = p.submitJob(t, `printf 'more\n' > MORE.txt`)
	p.approve(t, approval2)
	return job1, approval1, d1, job2, approval2
}

// deniedByTable fails unless err is the authorization table's refusal of method
// to the dev identity as.
func deniedByTable(t *testing.T, err error, method, as string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.PermissionDenied || !strings.HasPrefix(st.Message(), authz.DeniedPrefix) ||
		!strings.Contains(st.Message(), method) || !strings.Contains(st.Message(), "spiffe://"+trustDomain+"/"+as) {
		t.Errorf("%s as %s: %v, want PermissionDenied from the table naming the method and the caller", method, as, err)
	}
}

// TestPublishAuthorization, over mTLS with the stack's certificates: only
// a pipeline publishes; pipelines and approvers read deployments, and
// neither the requester nor a service does.
func TestPublishAuthorization(t *testing.T) {
	t.Parallel()
	p := startPublishStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	job1, _, d1, job2, approval2 := p.landedAndApproved(t)
	tip := p.tip(t)

	t.Run("only a pipeline publishes", func(t *testing.T) {
		// A complete and correct request for an approved result, so that
		// nothing but the caller is wrong with it.
		req := &publisherv1.PublishRequest{ApprovalId: approval2, JobId: job2.GetJobId(), BundleDigest: job2.GetResult().GetBundleDigest(),
			Target: &typesv1.PublishTarget{Repository: "sample", Branch: "main"}}
		for _, as := range []string{"client/dev", "approver/alice", "approver/bob", "approver/dev", "service/executor", "service/authority", "service/publisher"} {
			req.IdempotencyKey = "as-" + as
			_, err := publisherv1.NewPublisherServiceClient(p.dial(t, as, "publisher")).Publish(ctx, req)
			deniedByTable(t, err, publisherv1.PublisherService_Publish_FullMethodName, as)
		}
		if res := p.airlock(t, "publish", approval2, "--as", "client/dev"); res.code == 0 || !strings.Contains(res.stderr, "permission denied") {
			t.Errorf("airlock publish --as client/dev: exit %d\n%s", res.code, res.stderr)
		}
		if st := p.approvalState(t, approval2); st != authorityv1.ApprovalState_APPROVAL_STATE_APPROVED {
			t.Errorf("approval is %v after the refused callers, want approved", st)
		}
		if n := len(p.deploymentsOf(t, job2.GetJobId())); n != 0 {
			t.Errorf("refused callers left %d deployments", n)
		}
		if n := len(p.leases(t, job2.GetJobId())); n != 0 {
			t.Errorf("refused callers had %d leases issued", n)
		}
		if got := p.tip(t); got != tip {
			t.Errorf("main moved to %s", got)
		}
	})

	t.Run("pipelines and approvers read deployments, nobody else", func(t *testing.T) {
		for _, as := range []string{"pipeline/deploy", "approver/alice", "approver/bob"} {
			c := publisherv1.NewPublisherServiceClient(p.dial(t, as, "publisher"))
			got, err := c.GetDeployment(ctx, &publisherv1.GetDeploymentRequest{DeploymentId: d1.GetDeploymentId()})
			if err != nil || got.GetDeployment().GetCommit() != d1.GetCommit() || got.GetDeployment().GetJobId() != job1.GetJobId() {
				t.Errorf("GetDeployment as %s: %v, %v; want deployment %s with commit %s", as, got.GetDeployment(), err, d1.GetDeploymentId(), d1.GetCommit())
			}
			list, err := c.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{})
			if err != nil || !slices.ContainsFunc(list.GetDeployments(), func(d *publisherv1.Deployment) bool { return d.GetDeploymentId() == d1.GetDeploymentId() }) {
				t.Errorf("ListDeployments as %s: %v, %v; want it to hold %s", as, list.GetDeployments(), err, d1.GetDeploymentId())
			}
			if _, err := c.GetDeployment(ctx, &publisherv1.GetDeploymentRequest{DeploymentId: "no-such-deployment"}); status.Code(err) != codes.NotFound {
				t.Errorf("GetDeployment of an unknown id as %s: %v, want NotFound", as, err)
			}
		}
		for _, as := range []string{"client/dev", "service/executor", "service/authority"} {
			c := publisherv1.NewPublisherServiceClient(p.dial(t, as, "publisher"))
			_, err := c.GetDeployment(ctx, &publisherv1.GetDeploymentRequest{DeploymentId: d1.GetDeploymentId()})
			deniedByTable(t, err, publisherv1.PublisherService_GetDeployment_FullMethodName, as)
			_, err = c.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{})
			deniedByTable(t, err, publisherv1.PublisherService_ListDeployments_FullMethodName, as)
		}
		// An approver the tenant does not list sees none of its
		// deployments, as it sees none of its approvals.
		if res := p.airlock(t, "pki", "issue", "--dir", p.pkiDir, "--id", "approver/eve"); res.code != 0 {
			t.Fatalf("pki issue approver/eve: exit %d\n%s", res.code, res.stderr)
		}
		eve := publisherv1.NewPublisherServiceClient(p.dial(t, "approver/eve", "publisher"))
		if _, err := eve.GetDeployment(ctx, &publisherv1.GetDeploymentRequest{DeploymentId: d1.GetDeploymentId()}); status.Code(err) != codes.NotFound {
			t.Errorf("GetDeployment of dev's deployment as approver/eve: %v, want NotFound", err)
		}
		if list, err := eve.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{}); err != nil || len(list.GetDeployments()) != 0 {
			t.Errorf("ListDeployments as approver/eve: %v, %v; want none", list.GetDeployments(), err)
		}
		if res := p.airlock(t, "deployment", "get", d1.GetDeploymentId(), "--as", "approver/alice"); res.code != 0 || !strings.Contains(res.stdout, d1.GetCommit()) {
			t.Errorf("airlock deployment get --as approver/alice: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		if res := p.airlock(t, "deployment", "list", "--as", "client/dev"); res.code == 0 || !strings.Contains(res.stderr, "permission denied") {
			t.Errorf("airlock deployment list --as client/dev: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
	})
}

// TestPublishBindsTheRequestToTheApproval holds the publisher to its
// API's promise (publisher.proto, PublishRequest): what a pipeline names
// (job, digest, target) must be the approval's, whether or not the
// approval landed already; and a mistaken request is refused before
// anything is recorded, so it spends nothing, not even the approval's
// chance to be published.
func TestPublishBindsTheRequestToTheApproval(t *testing.T) {
	t.Parallel()
	p := startPublishStack(t)
	_, approval1, d1, job2, approval2 := p.landedAndApproved(t)
	tip := p.tip(t)

	t.Run("another job, digest or target for an approval that landed", func(t *testing.T) {
		for _, tc := range []struct {
			args  []string
			field string
		}{
			{[]string{"--digest", "sha256:" + strings.Repeat("0", 64)}, "bundle_digest"},
			{[]string{"--job", job2.GetJobId()}, "job_id"},
			{[]string{"--to", "sample:release"}, "target"},
		} {
			res := p.airlock(t, append([]string{"publish", approval1, "-o", "json", "--idempotency-key", "other-" + tc.field}, tc.args...)...)
			if res.code != 1 || !strings.Contains(res.stderr, tc.field+": approval "+approval1+" is for") || strings.Contains(res.stdout, d1.GetDeploymentId()) {
				t.Errorf("publish %s %v (it landed as %s): exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 1 naming %s and no deployment",
					approval1, tc.args, d1.GetDeploymentId(), res.code, res.stdout, res.stderr, tc.field)
			}
		}
		if got := p.tip(t); got != tip {
			t.Errorf("main moved to %s", got)
		}
	})

	t.Run("the right request after a mistaken one", func(t *testing.T) {
		res := p.airlock(t, "publish", approval2, "-o", "json", "--idempotency-key", "typo", "--to", "sample:mian")
		if res.code != 1 || !strings.Contains(res.stderr, "target: approval "+approval2+" is for sample:main, not sample:mian") || strings.TrimSpace(res.stdout) != "" {
			t.Fatalf("publish to the wrong branch: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 1 naming the target and no deployment", res.code, res.stdout, res.stderr)
		}
		if st := p.approvalState(t, approval2); st != authorityv1.ApprovalState_APPROVAL_STATE_APPROVED {
			t.Errorf("approval %s is %v after the mistaken request, want still approved", approval2, st)
		}
		if n := p.checkNoActiveLease(t, job2.GetJobId()); n != 0 {
			t.Errorf("%d deploy leases were issued for the mistaken request", n)
		}
		if got := p.tip(t); got != tip {
			t.Errorf("main moved to %s after a refused publish", got)
		}
		// Published before it is decided: refused, nothing recorded, and
		// it publishes once approved.
		job3, approval3, _ := p.submitJob(t, `printf 'third\n' > lib/third.txt`)
		if res := p.airlock(t, "publish", approval3); res.code != 1 || !strings.Contains(res.stderr, "is pending, not approved") {
			t.Errorf("publish of a pending approval: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		p.approve(t, approval3)
		if res, d := p.publish(t, approval3); res.code != 0 || d.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED || d.GetJobId() != job3.GetJobId() {
			t.Errorf("publish once approved: exit %d, %v %q\n%s", res.code, d.GetState(), d.GetMessage(), res.stderr)
		}
		tip = p.tip(t)
		res, d := p.publish(t, approval2)
		if res.code != 0 || d.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED || p.tip(t) == tip {
			t.Errorf("the right request: exit %d, deployment %s %v %q (idempotency key %q); want it published\n%s",
				res.code, d.GetDeploymentId(), d.GetState(), d.GetMessage(), d.GetIdempotencyKey(), res.stderr)
		}
	})
}

// TestPublishRaces: two pipelines publishing one approval at once land one
// commit; a branch moved by hand under an approval gets the patch
// re-applied on its tip, a conflicting or rewritten one refuses it with the
// approval unspent.
func TestPublishRaces(t *testing.T) {
	t.Parallel()
	p := startPublishStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Two pipelines publish one approval at once, each with its own key.
	if res := p.airlock(t, "pki", "issue", "--dir", p.pkiDir, "--id", "pipeline/nightly"); res.code != 0 {
		t.Fatalf("pki issue pipeline/nightly: exit %d\n%s", res.code, res.stderr)
	}
	job, approvalID, _ := p.submitJob(t, `printf 'hello, airlock\n' > lib/greet.txt`)
	p.approve(t, approvalID)
	pipelines := []publisherv1.PublisherServiceClient{p.publisher, publisherv1.NewPublisherServiceClient(p.dial(t, "pipeline/nightly", "publisher"))}
	got := make([]*publisherv1.Deployment, len(pipelines))
	errs := make([]error, len(pipelines))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range pipelines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := c.Publish(ctx, &publisherv1.PublishRequest{ApprovalId: approvalID, IdempotencyKey: fmt.Sprintf("pipeline-%d", i)})
			got[i], errs[i] = resp.GetDeployment(), err
		}()
	}
	close(start)
	wg.Wait()
	for i := range pipelines {
		if errs[i] != nil || got[i].GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED {
			t.Fatalf("pipeline %d: %v, %v", i, got[i].GetState(), errs[i])
		}
	}
	if got[0].GetDeploymentId() != got[1].GetDeploymentId() || got[0].GetCommit() != got[1].GetCommit() {
		t.Errorf("two pipelines got deployments %s (%s) and %s (%s), want one", got[0].GetDeploymentId(), got[0].GetCommit(),
			got[1].GetDeploymentId(), got[1].GetCommit())
	}
	first := p.tip(t)
	if c := gitLines(p.bareGit(t, "rev-list", p.base+"..main")); len(c) != 1 || c[0] != got[0].GetCommit() {
		t.Errorf("commits landed: %q, want only %s", c, got[0].GetCommit())
	}
	if n := len(p.deploymentsOf(t, job.GetJobId())); n != 1 {
		t.Errorf("%d deployments, want 1", n)
	}
	if n := p.checkNoActiveLease(t, job.GetJobId()); n != 1 {
		t.Errorf("%d deploy leases for one push, want 1", n)
	}

	// After the approval, before the publish, a maintainer pushes a change
	// to another file: the patch is re-applied on the new tip.
	job, approvalID, _ = p.submitJob(t, `printf 'hello again\n' > lib/greet.txt`)
	if job.GetCommit() != first {
		t.Fatalf("job ran on %s, want main's %s", job.GetCommit(), first)
	}
	p.approve(t, approvalID)
	moved := p.pushByHand(t, "README.md", "# sample\n\nedited by hand\n", "docs: edit by hand")
	res, d := p.publish(t, approvalID)
	if res.code != 0 || d.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED {
		t.Fatalf("publish on a moved branch: exit %d, %v %q\n%s", res.code, d.GetState(), d.GetMessage(), res.stderr)
	}
	if d.GetBaseCommit() != first || d.GetParentCommit() != moved || d.GetParentCommit() == d.GetBaseCommit() {
		t.Errorf("deployment base %s, parent %s; want base %s and parent the new tip %s", d.GetBaseCommit(), d.GetParentCommit(), first, moved)
	}
	if c := gitLines(p.bareGit(t, "rev-list", "--parents", moved+"..main")); len(c) != 1 || c[0] != d.GetCommit()+" "+moved {
		t.Errorf("commits on top of the hand-pushed one (with parents): %q, want only %s on %s", c, d.GetCommit(), moved)
	}
	if c := p.bareGit(t, "diff-tree", "-r", "--no-commit-id", "--name-status", moved, d.GetCommit()); c != "M\tlib/greet.txt\n" {
		t.Errorf("the re-applied commit changes %q, want only lib/greet.txt", c)
	}
	if readme, greet := p.bareGit(t, "show", "main:README.md"), p.bareGit(t, "show", "main:lib/greet.txt"); readme != "# sample\n\nedited by hand\n" || greet != "hello again\n" {
		t.Errorf("main holds README.md %q and lib/greet.txt %q, want both changes", readme, greet)
	}
	if trailer := strings.TrimSpace(p.bareGit(t, "log", "-1", "--format=%(trailers:key=Airlock-Approval,valueonly)", "main")); trailer != approvalID {
		t.Errorf("the re-applied commit's Airlock-Approval is %q, want %s", trailer, approvalID)
	}

	// A maintainer's change to the same lines: the patch no longer
	// applies, and the refusal names the path.
	job, approvalID, _ = p.submitJob(t, `printf 'hello for the third time\n' > lib/greet.txt`)
	p.approve(t, approvalID)
	conflict := p.pushByHand(t, "lib/greet.txt", "a greeting edited by hand\n", "edit the greeting by hand")
	res, d = p.publish(t, approvalID)
	if res.code != 1 || !strings.Contains(d.GetMessage(), "does not apply") || !strings.Contains(d.GetMessage(), "lib/greet.txt") ||
		!strings.Contains(res.stderr, "lib/greet.txt") {
		t.Errorf("publish over a conflicting change: exit %d, message %q; want 1, naming lib/greet.txt\n%s", res.code, d.GetMessage(), res.stderr)
	}
	p.checkUnspentRefusal(t, d, job, approvalID, conflict)

	// Main rewritten under an approval (its base no longer on the branch):
	// refused, nothing spent.
	job, approvalID, _ = p.submitJob(t, `printf 'new\n' > NEW.txt`)
	p.approve(t, approvalID)
	rewritten := strings.TrimSpace(p.bareGit(t, "-c", "user.name=Maintainer", "-c", "user.email=maintainer@example.com",
		"commit-tree", "main^{tree}", "-p", "main~1", "-m", "rewritten by hand"))
	p.bareGit(t, "update-ref", "refs/heads/main", rewritten, conflict)
	res, d = p.publish(t, approvalID)
	if res.code != 1 || !strings.Contains(d.GetMessage(), "rewritten") {
		t.Errorf("publish on a rewritten branch: exit %d, message %q; want 1, saying the branch was rewritten", res.code, d.GetMessage())
	}
	p.checkUnspentRefusal(t, d, job, approvalID, rewritten)
}
