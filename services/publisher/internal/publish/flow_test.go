package publish_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/provenance"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// These tests drive the real publish.Service over the real SQLite store
// and real git repositories. Its two peers are fakes at the
// publish.Authority and publish.Executor interfaces: the real authority
// and executor are exercised end to end by test/e2e/publish_test.go, but
// behind mTLS they cannot be made to stop or fail one call at one moment
// (right after the consume, right after the push, a revoke that fails
// once), which is what each test here needs.

// Short enough that a test sees a claim outlive its TTL and a retry come
// round; long enough that a run renews its claim under -race.
const (
	claimTTL   = 600 * time.Millisecond
	retryEvery = 200 * time.Millisecond
)

const pipeline = "spiffe://airlock.test/pipeline/deploy"

// fakeAuthority keeps one approval and the leases of its job as the
// authority does: the approval is consumed once, a deploy lease is issued
// only after the consume and only when the tenant has a deploy
// credential. Each replica talks to it through its own connection (as),
// so a test can tell who called.
type fakeAuthority struct {
	mu   sync.Mutex
	spec publish.Spec
	// noDeployCredential: the tenant has no deploy credential for the
	// target, so a deploy lease is refused.
	noDeployCredential bool
	consumed           int // consumes that spent the approval
	leases             map[string]*fakeLease
	calls              map[string]int // "replica/Method" -> calls
	// fault, when set, runs first in every call, outside the lock: an
	// error it returns is the call's answer. A test stops or fails the
	// publisher with it at the call it aims at.
	fault func(replica, method string) error
}

type fakeLease struct {
	purpose string
	active  bool
}

// as is replica's connection to the authority.
func (a *fakeAuthority) as(replica string) publish.Authority {
	return authorityConn{a: a, replica: replica}
}

func (a *fakeAuthority) enter(replica, method string) error {
	a.mu.Lock()
	a.calls[replica+"/"+method]++
	fault := a.fault
	a.mu.Unlock()
	if fault != nil {
		return fault(replica, method)
	}
	return nil
}

func (a *fakeAuthority) setFault(f func(replica, method string) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fault = f
}

func (a *fakeAuthority) setState(state string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.spec.State = state
}

// count is how often replica called method ("" method: any).
func (a *fakeAuthority) count(replica, method string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for k, v := range a.calls {
		r, m, _ := strings.Cut(k, "/")
		if r == replica && (method == "" || m == method) {
			n += v
		}
	}
	return n
}

func (a *fakeAuthority) consumes() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.consumed
}

// deployLeases is how many deploy leases were issued.
func (a *fakeAuthority) deployLeases() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, l := range a.leases {
		if l.purpose == publish.LeaseDeploy {
			n++
		}
	}
	return n
}

func (a *fakeAuthority) active() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id, l := range a.leases {
		if l.active {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

type authorityConn struct {
	a       *fakeAuthority
	replica string
}

func (c authorityConn) Spec(ctx context.Context, approvalID string) (publish.Spec, error) {
	if err := c.a.enter(c.replica, "Spec"); err != nil {
		return publish.Spec{}, err
	}
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	if approvalID != c.a.spec.ApprovalID {
		return publish.Spec{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, approvalID)
	}
	spec := c.a.spec
	spec.DeployCredential = !c.a.noDeployCredential
	return spec, nil
}

func (c authorityConn) Consume(ctx context.Context, approvalID, jobID, digest, repo, branch string) error {
	if err := c.a.enter(c.replica, "Consume"); err != nil {
		return err
	}
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	s := &c.a.spec
	switch {
	case approvalID != s.ApprovalID || jobID != s.JobID || digest != s.BundleDigest || repo != s.Repo || branch != s.Branch:
		return fmt.Errorf("%w: not what approval %s approved", errdefs.ErrFailedPrecondition, s.ApprovalID)
	case s.State != publish.ApprovalApproved:
		return fmt.Errorf("%w: approval %s is %s", errdefs.ErrFailedPrecondition, s.ApprovalID, s.State)
	}
	s.State = publish.ApprovalConsumed
	c.a.consumed++
	return nil
}

func (c authorityConn) Lease(ctx context.Context, purpose, jobID, repo string) (publish.Lease, error) {
	if err := c.a.enter(c.replica, "Lease"); err != nil {
		return publish.Lease{}, err
	}
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	switch {
	case jobID != c.a.spec.JobID || repo != c.a.spec.Repo:
		return publish.Lease{}, fmt.Errorf("%w: not job %s's target", errdefs.ErrPermissionDenied, jobID)
	case purpose == publish.LeaseDeploy && c.a.spec.State != publish.ApprovalConsumed:
		return publish.Lease{}, fmt.Errorf("%w: the approval of job %s is %s, not consumed", errdefs.ErrFailedPrecondition, jobID, c.a.spec.State)
	case purpose == publish.LeaseDeploy && c.a.noDeployCredential:
		return publish.Lease{}, fmt.Errorf("%w: tenant %s has no deploy credential for %s", errdefs.ErrFailedPrecondition, c.a.spec.Tenant, repo)
	}
	id := fmt.Sprintf("lease-%d", len(c.a.leases)+1)
	c.a.leases[id] = &fakeLease{purpose: purpose, active: true}
	return publish.Lease{ID: id, Secret: []byte("token-" + id)}, nil
}

func (c authorityConn) Use(ctx context.Context, leaseID, jobID, repo string) error {
	if err := c.a.enter(c.replica, "Use"); err != nil {
		return err
	}
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	if l := c.a.leases[leaseID]; l == nil || !l.active {
		return fmt.Errorf("%w: lease %s is not active", errdefs.ErrFailedPrecondition, leaseID)
	}
	return nil
}

func (c authorityConn) Revoke(ctx context.Context, leaseID, reason string) error {
	if err := c.a.enter(c.replica, "Revoke"); err != nil {
		return err
	}
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	l := c.a.leases[leaseID]
	if l == nil {
		return fmt.Errorf("%w: lease %s", errdefs.ErrNotFound, leaseID)
	}
	l.active = false
	return nil
}

func (c authorityConn) ActiveLeases(ctx context.Context, jobID string) ([]string, error) {
	if err := c.a.enter(c.replica, "ActiveLeases"); err != nil {
		return nil, err
	}
	return c.a.active(), nil
}

// fakeExecutorAddress is where the authority says the job's executor is.
const fakeExecutorAddress = "10.0.0.7:7402"

// fakeExecutor serves the job's bundle as the executor keeps it; a test
// makes it fail, or serve a damaged copy, for a number of calls.
type fakeExecutor struct {
	mu               sync.Mutex
	jobID, digest    string
	bundle, envelope []byte
	calls            int
	failNext         int
	failWith         error
	damagedNext      int
}

func (e *fakeExecutor) Artifact(ctx context.Context, executor identity.ID, address, jobID, digest string, w io.Writer) ([]byte, error) {
	e.mu.Lock()
	e.calls++
	b, err := e.bundle, error(nil)
	switch {
	case executor != executorID || address != fakeExecutorAddress:
		err = fmt.Errorf("%w: asked executor %s at %q, not the job's", errdefs.ErrUnavailable, executor, address)
	case jobID != e.jobID || digest != e.digest:
		err = fmt.Errorf("%w: no bundle %s of job %s", errdefs.ErrNotFound, digest, jobID)
	case e.failNext > 0:
		e.failNext--
		err = e.failWith
	case e.damagedNext > 0:
		e.damagedNext--
		b = bytes.Clone(b)
		b[len(b)/2] ^= 1
	}
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	return e.envelope, nil
}

// fail makes the next n calls fail with err.
func (e *fakeExecutor) fail(n int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failNext, e.failWith = n, err
}

// damage makes the next n calls serve the bundle with one byte changed.
func (e *fakeExecutor) damage(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.damagedNext = n
}

func (e *fakeExecutor) fetches() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

// harness is one approved job of tenant acme on repository demo: its
// bundle signed as the executor signs it, the target's bare repository,
// the fakes of both peers, and the store every replica shares.
type harness struct {
	t      *testing.T
	remote *remote
	trust  publish.Trust
	auth   *fakeAuthority
	exec   *fakeExecutor
	store  *store.Store
	// meter, if set, records the services' metrics.
	meter metric.MeterProvider
}

// newHarness makes a job whose result writes files (path -> content) on
// the remote's base commit.
func newHarness(t *testing.T, files map[string]string) *harness {
	t.Helper()
	return newHarnessOn(t, nil, files)
}

// newHarnessOn is newHarness on a base that also writes base (path ->
// content).
func newHarnessOn(t *testing.T, base, files map[string]string) *harness {
	t.Helper()
	w := newWorld(t)
	rm := newRemote(t)
	if base != nil {
		rm.rebase(base)
	}
	patch := rm.patchOf(files)
	inBase := strings.Split(run(t, rm.bare, "ls-tree", "--name-only", rm.base), "\n")
	var list []bundle.FileChange
	for path, content := range files {
		fc := bundle.FileChange{Path: path, Status: bundle.FileAdded, NewMode: 0o100644, Size: int64(len(content))}
		if slices.Contains(inBase, path) {
			fc.Status, fc.OldMode = bundle.FileModified, 0o100644
		}
		list = append(list, fc)
	}
	slices.SortFunc(list, func(a, b bundle.FileChange) int { return strings.Compare(a.Path, b.Path) })

	sg := signedGrant(t, w.grantKey, "job-1", "acme")
	raw, err := proto.Marshal(sg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bundle.tar")
	res, err := bundle.Write(path, bundle.Input{Meta: map[string]string{"job_id": "job-1"}, Grant: raw, Files: list,
		Patch: patch, StdoutPath: os.DevNull, StderrPath: os.DevNull})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := w.ca.Issue(executorID, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	envelope, err := provenance.Sign("bundle.tar", res.Digest, provenance.Run{JobID: "job-1", Tenant: "acme", GrantDigest: grant.Digest(sg),
		Executor: executorID.String(), StartedOn: time.Now().Add(-time.Second), FinishedOn: time.Now()}, key, []*x509.Certificate{kp.Cert})
	if err != nil {
		t.Fatal(err)
	}

	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "publisher.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &harness{t: t, remote: rm, trust: w.trust(), store: st,
		exec: &fakeExecutor{jobID: "job-1", digest: res.Digest, bundle: data, envelope: envelope},
		auth: &fakeAuthority{leases: map[string]*fakeLease{}, calls: map[string]int{}, spec: publish.Spec{
			ApprovalID: "appr-1", JobID: "job-1", Tenant: "acme", BundleDigest: res.Digest, Repo: "demo", Branch: "main",
			State: publish.ApprovalApproved, URL: rm.bare, Base: rm.base, Approvers: []string{"spiffe://airlock.test/approver/alice"},
			ApprovedAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), OnMoved: publish.OnMovedReapply, PolicyDigest: "sha256:policy",
			Executor: executorID, ExecutorAddress: fakeExecutorAddress,
		}}}
}

// service starts a publisher replica named owner. It shares only the
// store with other replicas (its own work directory, as on another host)
// and stops at the test's end; stop stops it sooner, as a crash would.
func (h *harness) service(owner string) (s *publish.Service, stop context.CancelFunc) {
	h.t.Helper()
	checker, err := contentcheck.New(contentcheck.Config{})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err = publish.New(ctx, publish.Config{Store: h.store, Authority: h.auth.as(owner), Executor: h.exec, Checker: checker,
		Trust: h.trust, Dir: h.t.TempDir(), Logger: slog.New(slog.NewTextHandler(testLog{h.t, owner}, nil)),
		Owner: owner, ClaimTTL: claimTTL, RetryEvery: retryEvery, Meter: h.meter})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		cancel()
		s.Wait()
	})
	return s, cancel
}

// publish is the pipeline's request for the approval, with key.
func (h *harness) publish(s *publish.Service, key string) (store.Deployment, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return s.Publish(ctx, pipeline, publish.Request{ApprovalID: "appr-1", IdempotencyKey: key})
}

// deployment is the one deployment the store holds.
func (h *harness) deployment() store.Deployment {
	h.t.Helper()
	list, _, err := h.store.List(context.Background(), "", "", 10, "")
	if err != nil || len(list) != 1 {
		h.t.Fatalf("the store holds %d deployments (%v), want 1", len(list), err)
	}
	return list[0]
}

// landed lists the commits on main past the base, newest first, as
// "id subject".
func (h *harness) landed() []string {
	h.t.Helper()
	out := run(h.t, h.remote.bare, "log", "--format=%H %s", h.remote.base+"..main")
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// airlockCommits lists the landed commits the publisher made.
func (h *harness) airlockCommits() []string {
	var out []string
	for _, c := range h.landed() {
		if strings.Contains(c, " Airlock: land job job-1") {
			out = append(out, c)
		}
	}
	return out
}

// push is someone else pushing a commit to main that writes path;
// message may carry trailers.
func (h *harness) push(path, content, message string) string {
	h.t.Helper()
	r := h.remote
	run(h.t, r.other, "pull", "-q", "--ff-only", "origin", "main")
	r.write(path, content)
	run(h.t, r.other, "add", "--", path)
	run(h.t, r.other, "commit", "-q", "-m", message)
	run(h.t, r.other, "push", "-q", "origin", "HEAD:main")
	return run(h.t, r.other, "rev-parse", "HEAD")
}

// waitFor polls the deployment until ok or the deadline.
func (h *harness) waitFor(ok func(store.Deployment) bool, within time.Duration) store.Deployment {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		d := h.deployment()
		if ok(d) || time.Now().After(deadline) {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantState checks a deployment's state and step.
func wantState(t *testing.T, d store.Deployment, state store.State, step store.Step) {
	t.Helper()
	if d.State != state || d.Step != step {
		t.Fatalf("deployment is %s at %s (%q), want %s at %s", d.State, d.Step, d.Message, state, step)
	}
}

// wantLanded checks that main holds exactly one commit of the publisher's
// and nothing else past the base.
func (h *harness) wantLanded() {
	h.t.Helper()
	if got := h.landed(); len(got) != 1 || len(h.airlockCommits()) != 1 {
		h.t.Fatalf("main past the base: %q, want one Airlock commit", got)
	}
}

type testLog struct {
	t       *testing.T
	replica string
}

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(l.replica + ": " + strings.TrimSpace(string(p)))
	return len(p), nil
}

var approvedChange = map[string]string{"a.txt": "one\nTWO\nthree\n"}

// Two replicas share the store: while one runs a deployment (held in its
// consume), the other neither resumes it nor runs it when the pipeline's
// retry reaches it, also after the claim's TTL (the runner renews it).
func TestOneReplicaRunsADeploymentAtATime(t *testing.T) {
	h := newHarness(t, approvedChange)
	held, release := make(chan struct{}), make(chan struct{})
	releaseA := sync.OnceFunc(func() { close(release) })
	defer releaseA()
	var hold sync.Once
	h.auth.setFault(func(replica, method string) error {
		if replica == "a" && method == "Consume" {
			hold.Do(func() { close(held); <-release })
		}
		return nil
	})
	a, _ := h.service("a")
	b, _ := h.service("b")
	type result struct {
		d   store.Deployment
		err error
	}
	published := make(chan result, 1)
	go func() {
		d, err := h.publish(a, "k")
		published <- result{d, err}
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("replica a never reached the consume")
	}

	for _, when := range []string{"while a runs it", "after the claim's TTL"} {
		if n, err := b.Resume(context.Background()); err != nil || n != 0 {
			t.Errorf("%s: replica b resumed %d deployments (%v), want 0", when, n, err)
		}
		b.Wait()
		d, err := h.publish(b, "k")
		if err != nil || d.State != store.InProgress || d.Owner != "a" {
			t.Errorf("%s: the retry on replica b: %s owned by %q (%v), want in progress, owned by a", when, d.State, d.Owner, err)
		}
		time.Sleep(claimTTL)
	}
	if n := h.auth.count("b", ""); n != 0 {
		t.Errorf("replica b called the authority %d times while a ran the deployment", n)
	}

	releaseA()
	res := <-published
	if res.err != nil {
		t.Fatal(res.err)
	}
	wantState(t, h.deployment(), store.Succeeded, store.StepRevoked)
	h.wantLanded()
	if n := h.auth.count("a", "Consume") + h.auth.count("b", "Consume"); n != 1 || h.auth.consumes() != 1 {
		t.Errorf("%d consume calls, %d consumes; want 1 and 1", n, h.auth.consumes())
	}
	if n, active := h.auth.deployLeases(), h.auth.active(); n != 1 || len(active) != 0 {
		t.Errorf("%d deploy leases, active %v; want 1, none active", n, active)
	}
}

// A publisher stops right after the consume; someone who may push writes
// a commit with the approval's trailer. The resumed deployment refuses it
// instead of taking it for the commit an earlier attempt landed.
func TestForgedTrailerIsNotTakenAsLanded(t *testing.T) {
	h := newHarness(t, approvedChange)
	a, stopA := h.service("a")
	h.auth.setFault(func(replica, method string) error {
		if method == "Consume" {
			stopA() // the consume itself goes through; its record does not
		}
		return nil
	})
	h.publish(a, "k")
	a.Wait()
	h.auth.setFault(nil)
	d := h.deployment()
	wantState(t, d, store.InProgress, store.StepPrepared)
	if h.auth.consumes() != 1 {
		t.Fatalf("%d consumes before the stop, want 1", h.auth.consumes())
	}

	forged := h.push("b.txt", "whatever the forger wants\n", "looks approved\n\nAirlock-Approval: appr-1")
	b, _ := h.service("b")
	if _, err := b.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.Wait()

	d = h.deployment()
	if d.State != store.Failed || !strings.Contains(d.Message, "is not the commit its approval makes") {
		t.Fatalf("deployment is %s (%q), want failed: the trailer's commit is not the approval's", d.State, d.Message)
	}
	if d.Commit == forged {
		t.Errorf("the deployment records the forged commit %s as its own", forged)
	}
	if got := h.landed(); len(got) != 1 || !strings.HasPrefix(got[0], forged) {
		t.Errorf("main past the base: %q, want only the forged commit", got)
	}
	if n := h.auth.deployLeases(); n != 0 {
		t.Errorf("%d deploy leases, want none", n)
	}
}

// A failure that is no refusal (the bundle's stream breaks off, a plain
// error) pauses the deployment instead of failing it, and Run takes it up
// again at its start and every RetryEvery until it passes.
func TestFailureThatIsNoRefusalPausesAndIsRetried(t *testing.T) {
	h := newHarness(t, approvedChange)
	h.exec.fail(2, errors.New("executor: the bundle's stream broke off"))
	s, _ := h.service("a")
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, d, store.InProgress, store.StepAccepted)
	if !strings.HasPrefix(d.Message, "waiting: ") || h.auth.consumes() != 0 {
		t.Fatalf("message %q with %d consumes, want waiting with none", d.Message, h.auth.consumes())
	}

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		s.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	d = h.waitFor(func(d store.Deployment) bool { return d.State.Terminal() }, 5*time.Second)
	wantState(t, d, store.Succeeded, store.StepRevoked)
	h.wantLanded()
	// The publish, Run's start (the second failure), one retry after it.
	if n := h.exec.fetches(); n != 3 {
		t.Errorf("%d fetches of the bundle, want 3", n)
	}
}

// A deployment that failed before it spent its approval (the executor
// served a damaged bundle) runs again when the pipeline asks again.
func TestFailureBeforeTheConsumeRunsAgainWhenAsked(t *testing.T) {
	h := newHarness(t, approvedChange)
	h.exec.damage(1000)
	s, _ := h.service("a")
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.Failed || !strings.Contains(d.Message, "the approval was not spent") || h.auth.consumes() != 0 {
		t.Fatalf("deployment is %s (%q), %d consumes; want failed, not spent", d.State, d.Message, h.auth.consumes())
	}

	h.exec.damage(0)
	d, err = h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, d, store.Succeeded, store.StepRevoked)
	h.wantLanded()
	if h.auth.consumes() != 1 {
		t.Errorf("%d consumes, want 1", h.auth.consumes())
	}
}

// A copy of the bundle that does not verify is fetched once more before
// the deployment is refused.
func TestBundleThatDoesNotVerifyIsFetchedAgainOnce(t *testing.T) {
	h := newHarness(t, approvedChange)
	h.exec.damage(1)
	s, _ := h.service("a")
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, d, store.Succeeded, store.StepRevoked)
	h.wantLanded()
	if n := h.exec.fetches(); n != 2 {
		t.Errorf("%d fetches, want 2", n)
	}
}

// The branch moved past the base to a tip that adds C.txt; the job adds
// c.txt. Re-applied on the tip the patch applies, but the content checks
// run again on the tip's tree and refuse the case collision, before the
// consume.
func TestReappliedCommitIsCheckedOnTheTipTree(t *testing.T) {
	h := newHarness(t, map[string]string{"c.txt": "lower\n"})
	tip := h.push("C.txt", "upper\n", "upper")
	s, _ := h.service("a")
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.Failed || !strings.Contains(d.Message, "the approval was not spent") {
		t.Fatalf("deployment is %s (%q), want failed, not spent", d.State, d.Message)
	}
	if len(d.Findings) != 1 || d.Findings[0].Rule != contentcheck.RulePathCaseCollision {
		t.Errorf("findings %+v, want one %s", d.Findings, contentcheck.RulePathCaseCollision)
	}
	if got := run(t, h.remote.bare, "rev-parse", "main"); got != tip || h.auth.consumes() != 0 {
		t.Errorf("main is %s with %d consumes, want %s with none", got, h.auth.consumes(), tip)
	}
}

// The authority cannot revoke the deploy lease after the push: the
// deployment stays in progress at pushed, lease active, until a retry
// revokes it.
func TestFailedRevokeKeepsTheDeploymentAtPushed(t *testing.T) {
	h := newHarness(t, approvedChange)
	h.auth.setFault(func(replica, method string) error {
		if method == "Revoke" {
			return fmt.Errorf("%w: authority: connection refused", errdefs.ErrUnavailable)
		}
		return nil
	})
	s, _ := h.service("a")
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, d, store.InProgress, store.StepPushed)
	h.wantLanded()
	if active := h.auth.active(); len(active) != 1 || !strings.HasPrefix(d.Message, "waiting: ") {
		t.Fatalf("active leases %v, message %q; want the deploy lease, waiting", active, d.Message)
	}

	h.auth.setFault(nil)
	if _, err := s.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Wait()
	wantState(t, h.deployment(), store.Succeeded, store.StepRevoked)
	if active := h.auth.active(); len(active) != 0 {
		t.Errorf("active leases %v after the retry, want none", active)
	}
}

// A publisher stops right after the push was recorded. Another replica,
// with no copy of the bundle and an executor that no longer serves it,
// only revokes the lease and finishes: it needs neither spec nor bundle.
func TestPushedDeploymentOnlyRevokesAndFinishes(t *testing.T) {
	h := newHarness(t, approvedChange)
	a, stopA := h.service("a")
	pushed := false
	h.auth.setFault(func(replica, method string) error {
		switch {
		case method == "Use":
			pushed = true // the deploy lease's use comes right before the push
		case method == "ActiveLeases" && pushed:
			stopA()
			return errors.New("the publisher stopped")
		}
		return nil
	})
	h.publish(a, "k")
	a.Wait()
	h.auth.setFault(nil)
	d := h.deployment()
	wantState(t, d, store.InProgress, store.StepPushed)
	h.wantLanded()
	if active := h.auth.active(); len(active) != 1 {
		t.Fatalf("active leases %v after the stop, want the deploy lease", active)
	}

	fetched := h.exec.fetches()
	h.exec.fail(1000, fmt.Errorf("%w: the executor keeps no bundle of job-1 any more", errdefs.ErrNotFound))
	b, _ := h.service("b")
	if _, err := b.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.Wait()
	wantState(t, h.deployment(), store.Succeeded, store.StepRevoked)
	if active := h.auth.active(); len(active) != 0 {
		t.Errorf("active leases %v, want none", active)
	}
	if n, specs := h.exec.fetches()-fetched, h.auth.count("b", "Spec"); n != 0 || specs != 0 {
		t.Errorf("replica b fetched the bundle %d times and read the spec %d times, want neither", n, specs)
	}
	h.wantLanded()
}

// A retry with a key already recorded is answered from the store: the
// authority, down meanwhile, is not asked.
func TestRecordedKeyIsAnsweredWithoutTheAuthority(t *testing.T) {
	h := newHarness(t, approvedChange)
	s, _ := h.service("a")
	first, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, first, store.Succeeded, store.StepRevoked)
	specs := h.auth.count("a", "Spec")
	h.auth.setFault(func(replica, method string) error {
		return fmt.Errorf("%w: authority: connection refused", errdefs.ErrUnavailable)
	})
	d, err := h.publish(s, "k")
	if err != nil || d.ID != first.ID || d.State != store.Succeeded {
		t.Fatalf("retry: %s %s (%v), want deployment %s, succeeded", d.ID, d.State, err, first.ID)
	}
	if n := h.auth.count("a", "Spec") - specs; n != 0 {
		t.Errorf("the retry read the spec %d times, want none", n)
	}
}

// A request that names another job, digest or target than its approval's,
// or comes before the approval is approved, is refused and leaves no
// deployment: the right request afterwards, even with the same key,
// publishes.
func TestRequestNotMatchingItsApprovalRecordsNothing(t *testing.T) {
	h := newHarness(t, approvedChange)
	s, _ := h.service("a")
	other := "sha256:" + strings.Repeat("0", 64)
	for _, tc := range []struct {
		name  string
		r     publish.Request
		state string
		says  string
	}{
		{"another job", publish.Request{JobID: "job-2"}, publish.ApprovalApproved, "job_id: approval appr-1 is for job job-1"},
		{"another digest", publish.Request{BundleDigest: other}, publish.ApprovalApproved, "bundle_digest: approval appr-1 is for"},
		{"another target", publish.Request{Repo: "demo", Branch: "mian"}, publish.ApprovalApproved, "target: approval appr-1 is for demo:main"},
		{"not yet approved", publish.Request{}, "pending", "approval appr-1 is pending, not approved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.auth.setState(tc.state)
			r := tc.r
			r.ApprovalID, r.IdempotencyKey = "appr-1", "k"
			_, err := s.Publish(context.Background(), pipeline, r)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want FailedPrecondition saying %q", err, tc.says)
			}
			if list, _, err := h.store.List(context.Background(), "", "", 10, ""); err != nil || len(list) != 0 {
				t.Fatalf("the store holds %d deployments (%v), want none", len(list), err)
			}
		})
	}
	h.auth.setState(publish.ApprovalApproved)
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, d, store.Succeeded, store.StepRevoked)
	h.wantLanded()
}

// A tenant without a deploy credential for the target is refused before
// the approval is spent, not by the deploy lease after the consume.
func TestNoDeployCredentialIsRefusedBeforeTheConsume(t *testing.T) {
	h := newHarness(t, approvedChange)
	h.auth.noDeployCredential = true
	s, _ := h.service("a")
	d, err := h.publish(s, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.Failed || !strings.Contains(d.Message, "no deploy credential") || !strings.Contains(d.Message, "the approval was not spent") {
		t.Fatalf("deployment is %s (%q), want failed for the credential, not spent", d.State, d.Message)
	}
	if n, consumes := h.auth.count("a", "Consume"), h.auth.consumes(); n != 0 || consumes != 0 {
		t.Errorf("%d consume calls, %d consumes; want none", n, consumes)
	}
	if n, got := h.auth.deployLeases(), h.landed(); n != 0 || len(got) != 0 {
		t.Errorf("%d deploy leases, main past the base %q; want none", n, got)
	}
}
