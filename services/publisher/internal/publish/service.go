package publish

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/airlockhq/airlock/pkg/identity"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// The publish flow, in the order of the steps the store records. Nothing
// that spends (the approval, a deploy credential) happens before every
// check that can refuse without a side effect has passed:
//
//	accepted   the request is recorded (idempotency key, approval: unique)
//	verified   the bundle fetched, re-hashed, its provenance and grant checked
//	validated  its content checked against the tenant's policy: no findings
//	prepared   the commit made on the fetched branch, not pushed
//	consumed   the approval spent, once
//	leased     the deploy credential leased
//	pushed     the commit on the branch (never forced)
//	revoked    the lease ended; the deployment succeeded
//
// Each step is recorded before the next starts. One process at a time
// runs a deployment, whichever replica: it claims it in the store and
// renews the claim while it runs. A publisher that crashes anywhere
// resumes from the record (at its start, every RetryEvery, or when the
// pipeline retries): before it makes a commit it looks on the branch for
// the one an earlier attempt pushed (the approval's trailer, and the same
// commit id when made again), and a lease a crash left active is revoked
// before a new one is taken.
//
// A refusal (a sentinel error of the flow's own checks) ends the
// deployment as failed; anything else (a peer or the remote unreachable,
// a disk full) leaves it in progress, to be retried. A deployment that
// failed before its approval was spent runs again when it is asked for
// again: the approval is not lost to one failed attempt.

// Authority is what the publisher asks of the authority.
type Authority interface {
	// Spec returns what approval id publishes and how.
	Spec(ctx context.Context, approvalID string) (Spec, error)
	// Consume spends the approval for exactly this job, digest and target.
	Consume(ctx context.Context, approvalID, jobID, digest, repo, branch string) error
	// Lease leases a credential (LeaseRead or LeaseDeploy) for the job's
	// target repository and returns it opened.
	Lease(ctx context.Context, purpose, jobID, repo string) (Lease, error)
	// Use announces the use of a lease right before it.
	Use(ctx context.Context, leaseID, jobID, repo string) error
	// Revoke ends a lease.
	Revoke(ctx context.Context, leaseID, reason string) error
	// ActiveLeases returns the ids of the job's active leases the
	// publisher holds.
	ActiveLeases(ctx context.Context, jobID string) ([]string, error)
}

// Lease purposes.
const (
	LeaseRead   = "read"
	LeaseDeploy = "deploy"
)

// Lease is a leased credential, opened. Secret is cleared after use.
type Lease struct {
	ID     string
	Secret []byte
}

// Approval states as the spec reports them.
const (
	ApprovalApproved = "approved"
	ApprovalConsumed = "consumed"
)

// Spec is what one approval publishes, from the authority.
type Spec struct {
	ApprovalID, JobID, Tenant, BundleDigest string
	Repo, Branch                            string
	// State is the approval's: ApprovalApproved, ApprovalConsumed or
	// another word (pending, denied, expired) that refuses.
	State string
	// URL is the repository's fetch and push URL; CA its server's PEM CA
	// bundle when a private CA issued it; ReadCredential whether fetching
	// needs the repository's source credential (a read lease).
	URL            string
	CA             []byte
	ReadCredential bool
	// DeployCredential says whether the tenant has a deploy credential
	// for the target: without one, nothing is spent.
	DeployCredential bool
	Base             string
	Approvers        []string
	ApprovedAt       time.Time
	Policy           contentcheck.Policy
	OnMoved          string
	PolicyDigest     string
	// TenantApprovers are the approvers the tenant lists ("approver/NAME";
	// empty: any): the approvers who may read the deployment.
	TenantApprovers []string
	// Executor is the executor the job ran on, which keeps its bundle and
	// signed its provenance; ExecutorAddress is where it is reached now
	// ("" while the fleet has lost it).
	Executor        identity.ID
	ExecutorAddress string
}

// Executor is what the publisher asks of the executors.
type Executor interface {
	// Artifact writes job's bundle with digest, kept by executor at
	// address, to w and returns its provenance envelope.
	Artifact(ctx context.Context, executor identity.ID, address, jobID, digest string, w io.Writer) ([]byte, error)
}

// Request is a pipeline's publish request.
type Request struct {
	JobID, ApprovalID, BundleDigest string
	Repo, Branch                    string
	IdempotencyKey                  string
}

// Config configures a Service.
type Config struct {
	Store     *store.Store
	Authority Authority
	Executor  Executor
	Checker   *contentcheck.Checker
	Trust     Trust
	// Dir is the publisher's work directory: bundles, the scratch
	// repositories, CA files.
	Dir    string
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Owner names this process in the claims it takes: the same name
	// after a restart takes its claims up at once (default: a random id,
	// whose claims a restart waits out); ClaimTTL is how long a claim
	// lasts unrenewed (default 2m).
	Owner    string
	ClaimTTL time.Duration
	// RetryEvery is how often unfinished deployments are taken up again
	// (default 30s).
	RetryEvery time.Duration
	// Meter makes the publish metrics (metrics.go); nil is the global
	// meter provider.
	Meter metric.MeterProvider
}

// Service runs publishes; safe for concurrent use.
type Service struct {
	cfg Config
	ctx context.Context

	mu      sync.Mutex
	running map[string]chan struct{} // deployment id -> closed when its run ends
	repoMu  map[string]*sync.Mutex   // scratch repository dir -> its lock
	wg      sync.WaitGroup
	metrics *metrics
	dryRuns chan struct{} // one token per dry run in progress, maxDryRuns at most
}

// New returns a Service whose runs live as long as ctx.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Authority == nil || cfg.Executor == nil || cfg.Checker == nil || cfg.Dir == "" {
		return nil, errors.New("publish: store, authority, executor, checker and dir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Owner == "" {
		host, _ := os.Hostname()
		cfg.Owner = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), ids.New()[:8])
	}
	if cfg.ClaimTTL <= 0 {
		cfg.ClaimTTL = 2 * time.Minute
	}
	if cfg.RetryEvery <= 0 {
		cfg.RetryEvery = 30 * time.Second
	}
	for _, d := range []string{"bundles", "repos", "ca"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	removeDryRunLeftovers(cfg.Dir, cfg.Logger)
	m, err := newMetrics(cfg.Meter)
	if err != nil {
		return nil, fmt.Errorf("publish: metrics: %w", err)
	}
	return &Service{cfg: cfg, ctx: ctx, running: map[string]chan struct{}{}, repoMu: map[string]*sync.Mutex{}, metrics: m,
		dryRuns: make(chan struct{}, maxDryRuns)}, nil
}

// Wait waits for every run to end (after the context ends).
func (s *Service) Wait() { s.wg.Wait() }

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

const (
	maxIDBytes     = 128
	maxKeyBytes    = 256
	maxBranchBytes = 255
)

// check validates a request, naming the field. Only the approval and the
// key are required; what else the pipeline names must match the approval.
func (r Request) check() error {
	for _, f := range []struct{ name, v string }{
		{"job_id", r.JobID}, {"approval_id", r.ApprovalID}, {"bundle_digest", r.BundleDigest},
		{"target.repository", r.Repo}, {"target.branch", r.Branch}, {"idempotency_key", r.IdempotencyKey},
	} {
		if f.v == "" {
			if f.name == "approval_id" || f.name == "idempotency_key" {
				return fmt.Errorf("%w: %s: required", errdefs.ErrInvalidArgument, f.name)
			}
			continue
		}
		limit := maxIDBytes
		switch f.name {
		case "idempotency_key":
			limit = maxKeyBytes
		case "target.branch":
			limit = maxBranchBytes
		}
		if len(f.v) > limit {
			return fmt.Errorf("%w: %s: at most %d bytes", errdefs.ErrInvalidArgument, f.name, limit)
		}
		for _, c := range f.v {
			if c < 0x20 || c == 0x7f {
				return fmt.Errorf("%w: %s: control characters are not allowed", errdefs.ErrInvalidArgument, f.name)
			}
		}
	}
	if (r.Repo == "") != (r.Branch == "") {
		return fmt.Errorf("%w: target: give both repository and branch, or neither", errdefs.ErrInvalidArgument)
	}
	if r.BundleDigest != "" && (!strings.HasPrefix(r.BundleDigest, "sha256:") || len(r.BundleDigest) != len("sha256:")+64) {
		return fmt.Errorf("%w: bundle_digest: want sha256:<64 hex digits>", errdefs.ErrInvalidArgument)
	}
	return nil
}

// matches checks the fields the request names against the approval's.
func (r Request) matches(spec Spec) error {
	switch {
	case r.JobID != "" && r.JobID != spec.JobID:
		return fmt.Errorf("%w: job_id: approval %s is for job %s, not %s", errdefs.ErrFailedPrecondition, r.ApprovalID, spec.JobID, r.JobID)
	case r.BundleDigest != "" && r.BundleDigest != spec.BundleDigest:
		return fmt.Errorf("%w: bundle_digest: approval %s is for %s, not %s", errdefs.ErrFailedPrecondition, r.ApprovalID, spec.BundleDigest, r.BundleDigest)
	case r.Repo != "" && (r.Repo != spec.Repo || r.Branch != spec.Branch):
		return fmt.Errorf("%w: target: approval %s is for %s:%s, not %s:%s", errdefs.ErrFailedPrecondition, r.ApprovalID, spec.Repo, spec.Branch, r.Repo, r.Branch)
	}
	return nil
}

// digest names the request's fields: the same key with another request
// is refused.
func (r Request) digest() string {
	sum := sha256.Sum256([]byte(strings.Join([]string{r.JobID, r.ApprovalID, r.BundleDigest, r.Repo, r.Branch}, "\x00")))
	return hex.EncodeToString(sum[:])
}

// Publish records the request (or finds the deployment it already has)
// and runs it to its end, or until ctx ends: then it returns the
// deployment as it is, still in progress, and the run goes on.
func (s *Service) Publish(ctx context.Context, requester string, r Request) (store.Deployment, error) {
	if err := r.check(); err != nil {
		return store.Deployment{}, err
	}
	key := r.digest()
	// A key seen before answers without the authority: a retry of a
	// finished publish needs nothing else.
	d, err := s.cfg.Store.ByKey(ctx, r.IdempotencyKey)
	switch {
	case err == nil && d.RequestDigest != key:
		return store.Deployment{}, fmt.Errorf("%w: idempotency_key: %q was used for another request (deployment %s)", errdefs.ErrAlreadyExists, r.IdempotencyKey, d.ID)
	case err == nil:
	case !errors.Is(err, errdefs.ErrNotFound):
		return store.Deployment{}, err
	default:
		if d, err = s.create(ctx, requester, r, key); err != nil {
			return store.Deployment{}, err
		}
	}
	if d.State == store.Failed && !d.Reached(store.StepConsumed) && d.Owner == "" {
		// Nothing was spent: asked again, it runs again (a conflict
		// resolved, an executor back), and refuses again if the result
		// still breaks a rule.
		if d, err = s.cfg.Store.Update(ctx, d.ID, func(d *store.Deployment) error {
			if d.State != store.Failed || d.Reached(store.StepConsumed) {
				return nil
			}
			d.State, d.Step, d.Message, d.Findings = store.InProgress, store.StepAccepted, "", nil
			d.UpdatedAt = s.now()
			return nil
		}); err != nil {
			return store.Deployment{}, err
		}
		s.cfg.Logger.InfoContext(ctx, "deployment asked for again after a failure that spent nothing", "deployment", d.ID)
	}
	if d.State.Terminal() {
		return d, nil
	}
	done := s.start(d.ID)
	select {
	case <-done:
	case <-ctx.Done():
	}
	return s.cfg.Store.Get(context.WithoutCancel(ctx), d.ID)
}

// create checks a new request against its approval, before anything is
// recorded (a mistaken or early request leaves no deployment that would
// stand for the approval), and records it; another key for an approval
// that has a deployment gets that deployment.
func (s *Service) create(ctx context.Context, requester string, r Request, key string) (store.Deployment, error) {
	spec, err := s.cfg.Authority.Spec(ctx, r.ApprovalID)
	if err != nil {
		return store.Deployment{}, err
	}
	if err := r.matches(spec); err != nil {
		return store.Deployment{}, err
	}
	if spec.State != ApprovalApproved && spec.State != ApprovalConsumed {
		return store.Deployment{}, fmt.Errorf("%w: approval %s is %s, not approved", errdefs.ErrFailedPrecondition, r.ApprovalID, spec.State)
	}
	now := s.now()
	d, created, err := s.cfg.Store.Create(ctx, store.Deployment{
		ID: ids.New(), IdempotencyKey: r.IdempotencyKey, RequestDigest: key, Requester: requester,
		JobID: spec.JobID, ApprovalID: r.ApprovalID, BundleDigest: spec.BundleDigest, TargetRepo: spec.Repo, TargetBranch: spec.Branch,
		State: store.InProgress, Step: store.StepAccepted, Steps: map[store.Step]time.Time{store.StepAccepted: now},
		Readers: readersOf(spec), CreatedAt: now, UpdatedAt: now,
	})
	if err != nil || !created {
		return d, err
	}
	s.cfg.Logger.InfoContext(ctx, "deployment accepted", "deployment", d.ID, "job", d.JobID, "approval", d.ApprovalID, "requester", requester)
	if spec.State == ApprovalConsumed {
		// Spent, and not by a deployment of this store: never push on an
		// approval this publisher did not consume.
		return s.cfg.Store.Update(ctx, d.ID, func(d *store.Deployment) error {
			d.State, d.Message = store.Failed, "approval "+d.ApprovalID+" was consumed by a deployment this publisher does not know"
			d.UpdatedAt = s.now()
			return nil
		})
	}
	return d, nil
}

// readersOf is who, beside pipelines, may read a deployment of spec's
// approval: the tenant's approvers, or every approver when it lists none.
func readersOf(spec Spec) []string {
	if len(spec.TenantApprovers) == 0 {
		return []string{store.AnyApprover}
	}
	return slices.Clone(spec.TenantApprovers)
}

// Run takes up every unfinished deployment now and every RetryEvery,
// until ctx ends: what a crash, a stop or an outage left half done.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.RetryEvery)
	defer t.Stop()
	for {
		if n, err := s.Resume(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("resume unfinished deployments", "error", err)
		} else if n > 0 {
			s.cfg.Logger.Info("took up unfinished deployments", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Resume starts a run for every unfinished deployment no run of this
// process drives and no other process has claimed.
func (s *Service) Resume(ctx context.Context) (int, error) {
	list, err := s.cfg.Store.Unfinished(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	now := s.now()
	for _, d := range list {
		s.mu.Lock()
		_, mine := s.running[d.ID]
		s.mu.Unlock()
		if mine || (d.Owner != "" && d.Owner != s.cfg.Owner && now.Before(d.ClaimedUntil)) {
			continue
		}
		s.start(d.ID)
		n++
	}
	return n, nil
}

// start makes sure one run of this process drives deployment id and
// returns a channel closed when it ends.
func (s *Service) start(id string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.running[id]; ok {
		return ch
	}
	ch := make(chan struct{})
	s.running[id] = ch
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.running, id)
			s.mu.Unlock()
			close(ch)
		}()
		s.claimAndRun(id)
	}()
	return ch
}

// claimAndRun runs deployment id while holding its claim, renewing it;
// another process's unexpired claim means that process runs it.
func (s *Service) claimAndRun(id string) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	now := s.now()
	if _, err := s.cfg.Store.Claim(ctx, id, s.cfg.Owner, now, now.Add(s.cfg.ClaimTTL)); err != nil {
		if !errors.Is(err, store.ErrClaimed) {
			s.cfg.Logger.Warn("claim deployment", "deployment", id, "error", err)
		}
		return
	}
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(s.cfg.ClaimTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				now := s.now()
				if _, err := s.cfg.Store.Claim(ctx, id, s.cfg.Owner, now, now.Add(s.cfg.ClaimTTL)); err != nil && ctx.Err() == nil {
					// Lost: stop before another process takes over.
					s.cfg.Logger.Warn("lost the claim on a deployment; stopping its run", "deployment", id, "error", err)
					cancel()
					return
				}
			}
		}
	}()
	s.run(ctx, id)
	cancel()
	<-renewed
	if err := s.cfg.Store.Release(context.WithoutCancel(s.ctx), id, s.cfg.Owner); err != nil {
		s.cfg.Logger.Warn("release deployment", "deployment", id, "error", err)
	}
}

// refused reports whether err is a refusal of the flow's own checks (it
// ends the deployment), not a failure that may pass.
func refused(err error) bool {
	var rf *refusal
	if errors.As(err, &rf) || errors.Is(err, ErrBundle) {
		return true
	}
	for _, e := range []error{errdefs.ErrFailedPrecondition, errdefs.ErrInvalidArgument, errdefs.ErrPermissionDenied,
		errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrDataLoss} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// run drives one deployment from its last recorded step.
func (s *Service) run(ctx context.Context, id string) {
	log := s.cfg.Logger.With("deployment", id)
	d, err := s.cfg.Store.Get(ctx, id)
	if err != nil {
		log.Warn("read deployment", "error", err)
		return
	}
	if d.State.Terminal() {
		return
	}
	r := &runState{s: s, d: d, log: log}
	defer r.close()
	began := time.Now()
	err = r.drive(ctx)
	switch {
	case err == nil:
		s.metrics.ran(runSucceeded, began)
	case ctx.Err() != nil:
		s.metrics.ran(runInterrupted, began)
		log.Info("publish interrupted; it resumes later", "after_step", r.d.Step)
	case refused(err):
		log.Warn("publish refused", "after_step", r.d.Step, "error", err)
		r.fail(context.WithoutCancel(ctx), err)
		s.metrics.ran(runRefused, began)
	default:
		s.metrics.ran(runPaused, began)
		// Said to the pipeline in general terms: the error may carry paths
		// and peers' words; the log has it whole.
		log.Warn("publish paused; it is retried", "after_step", r.d.Step, "error", err)
		why := "a peer, the remote or this host failed; it is retried"
		if errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			why = errdefs.Detail(err)
		}
		if err := r.revokeAll(context.WithoutCancel(ctx), "the publish paused"); err != nil {
			log.Warn("revoke on pause", "error", err)
		}
		_, _ = s.cfg.Store.Update(context.WithoutCancel(ctx), id, func(d *store.Deployment) error {
			d.Message = waitingPrefix + why
			d.LeaseID = ""
			d.UpdatedAt = s.now()
			return nil
		})
	}
}

// waitingPrefix starts the message of a deployment paused for a retry.
const waitingPrefix = "waiting: "

// Waiting reports whether d is paused for a retry (a peer unreachable).
func Waiting(d store.Deployment) bool {
	return d.State == store.InProgress && strings.HasPrefix(d.Message, waitingPrefix)
}

// FilesDigestOf names a sorted list of paths: sha256 over each path and
// a NUL.
func FilesDigestOf(sorted []string) string {
	h := sha256.New()
	for _, p := range sorted {
		io.WriteString(h, p)
		h.Write([]byte{0})
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
