package publish

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitcmd"
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
// Each step is recorded before the next starts. A publisher that crashes
// anywhere resumes from the record (at its start, or when the pipeline
// retries): before it makes a commit it looks on the branch for one with
// the approval's trailer, and a lease a crash left active is revoked
// before a new one is taken.

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
	Base           string
	Approvers      []string
	ApprovedAt     time.Time
	Policy         contentcheck.Policy
	OnMoved        string
	PolicyDigest   string
	// TenantApprovers are the approvers the tenant lists ("approver/NAME";
	// empty: any): the approvers who may read the deployment.
	TenantApprovers []string
}

// Executor is what the publisher asks of the executor.
type Executor interface {
	// Artifact writes job's bundle with digest to w and returns its
	// provenance envelope.
	Artifact(ctx context.Context, jobID, digest string, w io.Writer) ([]byte, error)
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
	// Hook, when set, is called after each step is recorded (tests use it
	// to crash the publisher between steps).
	Hook func(step store.Step)
}

// Service runs publishes; safe for concurrent use.
type Service struct {
	cfg Config
	ctx context.Context

	mu      sync.Mutex
	running map[string]chan struct{} // deployment id -> closed when its run ends
	repoMu  map[string]*sync.Mutex   // scratch repository dir -> its lock
	wg      sync.WaitGroup
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
	for _, d := range []string{"bundles", "repos", "ca"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	return &Service{cfg: cfg, ctx: ctx, running: map[string]chan struct{}{}, repoMu: map[string]*sync.Mutex{}}, nil
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
	// What the pipeline named must be the approval's, checked before
	// anything is recorded: a mistaken request leaves no deployment that
	// would stand for the approval. What it left out is the approval's.
	spec, err := s.cfg.Authority.Spec(ctx, r.ApprovalID)
	if err != nil {
		return store.Deployment{}, err
	}
	if err := r.matches(spec); err != nil {
		return store.Deployment{}, err
	}
	if spec.State != ApprovalApproved && spec.State != ApprovalConsumed {
		// Refused with no record, so the same approval publishes once it
		// is approved.
		return store.Deployment{}, fmt.Errorf("%w: approval %s is %s, not approved", errdefs.ErrFailedPrecondition, r.ApprovalID, spec.State)
	}
	r.JobID, r.BundleDigest, r.Repo, r.Branch = spec.JobID, spec.BundleDigest, spec.Repo, spec.Branch
	now := s.now()
	d, created, err := s.cfg.Store.Create(ctx, store.Deployment{
		ID: ids.New(), IdempotencyKey: r.IdempotencyKey, RequestDigest: key, Requester: requester,
		JobID: r.JobID, ApprovalID: r.ApprovalID, BundleDigest: r.BundleDigest, TargetRepo: r.Repo, TargetBranch: r.Branch,
		State: store.InProgress, Step: store.StepAccepted, Steps: map[store.Step]time.Time{store.StepAccepted: now},
		Readers: readersOf(spec), CreatedAt: now, UpdatedAt: now,
	})
	if err != nil {
		return store.Deployment{}, err
	}
	if created {
		s.cfg.Logger.InfoContext(ctx, "deployment accepted", "deployment", d.ID, "job", d.JobID, "approval", d.ApprovalID, "requester", requester)
		s.hook(store.StepAccepted)
		if spec.State == ApprovalConsumed {
			// Spent, and not by a deployment of this store: never push on
			// an approval this publisher did not consume.
			return s.cfg.Store.Update(ctx, d.ID, func(d *store.Deployment) error {
				d.State, d.Message = store.Failed, "approval "+d.ApprovalID+" was consumed by a deployment this publisher does not know"
				d.UpdatedAt = s.now()
				return nil
			})
		}
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

// readersOf is who, beside pipelines, may read a deployment of spec's
// approval: the tenant's approvers, or every approver when it lists none.
func readersOf(spec Spec) []string {
	if len(spec.TenantApprovers) == 0 {
		return []string{store.AnyApprover}
	}
	return slices.Clone(spec.TenantApprovers)
}

// Resume starts a run for every unfinished deployment: what a crash or a
// stop left half done.
func (s *Service) Resume(ctx context.Context) (int, error) {
	list, err := s.cfg.Store.Unfinished(ctx)
	if err != nil {
		return 0, err
	}
	for _, d := range list {
		s.cfg.Logger.InfoContext(ctx, "resuming deployment", "deployment", d.ID, "after_step", d.Step)
		s.start(d.ID)
	}
	return len(list), nil
}

// start makes sure one run drives deployment id and returns a channel
// closed when it ends.
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
		s.run(id)
	}()
	return ch
}

func (s *Service) hook(step store.Step) {
	if s.cfg.Hook != nil {
		s.cfg.Hook(step)
	}
}

// run drives one deployment from its last recorded step. A transient
// failure (a peer or the remote unreachable) leaves it in progress for a
// retry; a refusal ends it as failed.
func (s *Service) run(id string) {
	ctx := s.ctx
	log := s.cfg.Logger.With("deployment", id)
	d, err := s.cfg.Store.Get(ctx, id)
	if err != nil {
		log.Warn("read deployment", "error", err)
		return
	}
	r := &runState{s: s, d: d, log: log}
	defer r.close()
	err = r.drive(ctx)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		log.Info("publish interrupted; it resumes at the next start", "after_step", r.d.Step)
	case errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded):
		log.Warn("publish paused: a peer is unreachable; a retry resumes it", "after_step", r.d.Step, "error", err)
		_, _ = s.cfg.Store.Update(ctx, id, func(d *store.Deployment) error {
			d.Message = "waiting: " + err.Error()
			d.UpdatedAt = s.now()
			return nil
		})
	default:
		log.Warn("publish refused", "after_step", r.d.Step, "error", err)
		r.fail(ctx, err)
	}
}

// runState is one run's working state.
type runState struct {
	s    *Service
	d    store.Deployment
	log  *slog.Logger
	spec Spec
	// bundle is the verified bundle file; repo the scratch repository.
	bundle string
	repo   *Repo
	unlock func()
	// remote is the git environment for the remote: config, CA and, while
	// a credential is leased, its header.
	caFile string
	prep   Prepared
	lease  Lease
}

func (r *runState) close() {
	clear(r.lease.Secret)
	if r.unlock != nil {
		r.unlock()
	}
}

// record marks step done, applying change to the deployment in the same
// write.
func (r *runState) record(ctx context.Context, step store.Step, change func(d *store.Deployment)) error {
	d, err := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
		if d.State.Terminal() {
			return fmt.Errorf("%w: deployment %s ended meanwhile (%s)", errdefs.ErrFailedPrecondition, d.ID, d.State)
		}
		if change != nil {
			change(d)
		}
		d.Step = step
		d.Steps[step] = r.s.now()
		d.UpdatedAt = d.Steps[step]
		if strings.HasPrefix(d.Message, "waiting: ") {
			d.Message = ""
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.d = d
	r.s.hook(step)
	return nil
}

// after reports whether the deployment has recorded step (or a later one).
func (r *runState) after(step store.Step) bool {
	return slices.Index(stepOrder, r.d.Step) >= slices.Index(stepOrder, step)
}

var stepOrder = []store.Step{store.StepAccepted, store.StepVerified, store.StepValidated, store.StepPrepared,
	store.StepConsumed, store.StepLeased, store.StepPushed, store.StepRevoked}

// fail ends the deployment as failed with err's message and the findings
// it carries, revoking any lease held.
func (r *runState) fail(ctx context.Context, err error) {
	r.revokeAll(ctx, "the publish failed")
	var rf *refusal
	findings := []store.Finding(nil)
	if errors.As(err, &rf) {
		findings = rf.findings
	}
	msg := errdefs.Detail(err)
	if !r.after(store.StepConsumed) {
		msg += "; the approval was not spent"
	} else if !r.after(store.StepPushed) {
		msg += "; the approval was spent and nothing was pushed"
	}
	d, uerr := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
		if d.State.Terminal() {
			return nil
		}
		d.State, d.Message, d.Findings, d.LeaseID = store.Failed, msg, findings, ""
		d.UpdatedAt = r.s.now()
		return nil
	})
	if uerr != nil {
		r.log.Warn("record the failure", "error", uerr)
		return
	}
	r.d = d
}

// refusal is a validation refusal: its findings go on the deployment.
type refusal struct {
	findings []store.Finding
}

func (e *refusal) Error() string {
	n := len(e.findings)
	s := ""
	if n != 1 {
		s = "s"
	}
	return fmt.Sprintf("validation refused the result: %d finding%s (see findings)", n, s)
}

func (e *refusal) Unwrap() error { return errdefs.ErrFailedPrecondition }

// drive runs every step not yet recorded.
func (r *runState) drive(ctx context.Context) error {
	if err := r.readSpec(ctx); err != nil {
		return err
	}
	if r.d.Step == store.StepRevoked {
		return r.succeed(ctx)
	}
	if err := r.verify(ctx); err != nil {
		return err
	}
	if !r.after(store.StepPushed) {
		if err := r.openRepo(ctx); err != nil {
			return err
		}
	}
	if !r.after(store.StepValidated) {
		if err := r.validate(ctx); err != nil {
			return err
		}
	}
	if !r.after(store.StepPushed) {
		landed, err := r.prepare(ctx)
		if err != nil {
			return err
		}
		if landed != "" {
			// An earlier attempt pushed it, and spent the approval first;
			// a commit that claims an approval still unspent is not ours.
			if r.spec.State != ApprovalConsumed {
				return fmt.Errorf("%w: commit %s on %s already carries the trailer of approval %s, which is not spent: it was not made by the publisher",
					errdefs.ErrFailedPrecondition, landed, r.d.TargetBranch, r.d.ApprovalID)
			}
			return r.landed(ctx, landed)
		}
	}
	if !r.after(store.StepConsumed) {
		if err := r.consume(ctx); err != nil {
			return err
		}
	}
	if !r.after(store.StepPushed) {
		if err := r.leaseDeploy(ctx); err != nil {
			return err
		}
		if err := r.push(ctx); err != nil {
			return err
		}
	}
	return r.succeed(ctx)
}

// readSpec reads the approval's spec and checks it is this request's.
func (r *runState) readSpec(ctx context.Context) error {
	spec, err := r.s.cfg.Authority.Spec(ctx, r.d.ApprovalID)
	if err != nil {
		return err
	}
	d := r.d
	switch {
	case spec.JobID != d.JobID:
		return fmt.Errorf("%w: job_id: approval %s is for job %s, not %s", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.JobID, d.JobID)
	case spec.BundleDigest != d.BundleDigest:
		return fmt.Errorf("%w: bundle_digest: approval %s is for %s, not %s", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.BundleDigest, d.BundleDigest)
	case spec.Repo != d.TargetRepo || spec.Branch != d.TargetBranch:
		return fmt.Errorf("%w: target: approval %s is for %s:%s, not %s:%s", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.Repo, spec.Branch, d.TargetRepo, d.TargetBranch)
	case spec.State == ApprovalConsumed:
		// Only the publisher consumes, and one deployment exists per
		// approval: a consumed approval was consumed for this one (a
		// crash came between the consume and its record).
	case spec.State != ApprovalApproved:
		return fmt.Errorf("%w: approval %s is %s, not approved", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.State)
	case r.after(store.StepConsumed):
		return fmt.Errorf("%w: approval %s reads approved although this deployment consumed it", errdefs.ErrFailedPrecondition, d.ApprovalID)
	}
	if spec.Base == "" || (spec.ApprovedAt.IsZero() && spec.State == ApprovalApproved) {
		return fmt.Errorf("%w: approval %s: the authority gave no base commit or approval time", errdefs.ErrFailedPrecondition, d.ApprovalID)
	}
	r.spec = spec
	if d.PolicyDigest == "" {
		return r.recordSame(ctx, func(d *store.Deployment) {
			d.Tenant, d.PolicyDigest, d.BaseCommit, d.Approvers = spec.Tenant, spec.PolicyDigest, spec.Base, spec.Approvers
		})
	}
	return nil
}

// recordSame writes a change without marking a step.
func (r *runState) recordSame(ctx context.Context, change func(d *store.Deployment)) error {
	d, err := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
		change(d)
		d.UpdatedAt = r.s.now()
		return nil
	})
	if err == nil {
		r.d = d
	}
	return err
}

// verify fetches the bundle (unless a verified copy is here) and checks
// it against the approval, then records StepVerified.
func (r *runState) verify(ctx context.Context) error {
	r.bundle = filepath.Join(r.s.cfg.Dir, "bundles", r.d.ID+".tar")
	envPath := r.bundle + ".provenance"
	envelope, err := os.ReadFile(envPath)
	if _, serr := os.Stat(r.bundle); err != nil || serr != nil {
		f, err := atomicfile.Create(r.bundle, 0o600)
		if err != nil {
			return err
		}
		defer f.Abort()
		envelope, err = r.s.cfg.Executor.Artifact(ctx, r.d.JobID, r.d.BundleDigest, f.File)
		if err != nil {
			return err
		}
		if err := f.Commit(atomicfile.Durable); err != nil {
			return err
		}
		if err := atomicfile.Write(envPath, envelope, 0o600, atomicfile.Durable); err != nil {
			return err
		}
	}
	// Every run checks again what it is about to use.
	if _, err := VerifyBundle(r.bundle, envelope, Want{Digest: r.d.BundleDigest, JobID: r.d.JobID, Tenant: r.spec.Tenant}, r.s.cfg.Trust); err != nil {
		if !errors.Is(err, ErrBundle) {
			return err
		}
		// A copy altered on disk is fetched again once, never trusted.
		_ = os.Remove(envPath)
		return err
	}
	if r.after(store.StepVerified) {
		return nil
	}
	return r.record(ctx, store.StepVerified, nil)
}

// openRepo locks the target's scratch repository, writes the CA file git
// needs, and fetches the branch (with a read lease when the repository
// needs a credential).
func (r *runState) openRepo(ctx context.Context) error {
	sum := sha256.Sum256([]byte(r.spec.Tenant + "\x00" + r.spec.Repo + "\x00" + r.spec.URL))
	dir := filepath.Join(r.s.cfg.Dir, "repos", hex.EncodeToString(sum[:8]))
	r.s.mu.Lock()
	mu := r.s.repoMu[dir]
	if mu == nil {
		mu = &sync.Mutex{}
		r.s.repoMu[dir] = mu
	}
	r.s.mu.Unlock()
	mu.Lock()
	r.unlock = mu.Unlock
	repo, err := OpenRepo(ctx, dir)
	if err != nil {
		return err
	}
	r.repo = repo
	if len(r.spec.CA) > 0 {
		caSum := sha256.Sum256(r.spec.CA)
		r.caFile = filepath.Join(r.s.cfg.Dir, "ca", hex.EncodeToString(caSum[:8])+".pem")
		if _, err := os.Stat(r.caFile); err != nil {
			if err := atomicfile.Write(r.caFile, r.spec.CA, 0o600, atomicfile.Durable); err != nil {
				return err
			}
		}
	}
	var secret []byte
	if r.spec.ReadCredential {
		// A read lease is allowed while the approval is approved and after
		// the publisher consumed it.
		l, err := r.s.cfg.Authority.Lease(ctx, LeaseRead, r.d.JobID, r.d.TargetRepo)
		if err != nil {
			return err
		}
		defer func() {
			clear(l.Secret)
			if err := r.s.cfg.Authority.Revoke(context.WithoutCancel(ctx), l.ID, "the branch was fetched"); err != nil {
				r.log.Warn("revoke the read lease", "lease", l.ID, "error", err)
			}
		}()
		if err := r.s.cfg.Authority.Use(ctx, l.ID, r.d.JobID, r.d.TargetRepo); err != nil {
			return err
		}
		secret = l.Secret
	}
	return r.fetch(ctx, secret)
}

// remoteEnv is git's environment for the remote, with secret's header
// when one is given.
func (r *runState) remoteEnv(secret []byte) ([]string, error) {
	kv := gitcmd.RemoteConfig(r.caFile)
	if len(secret) > 0 {
		h, err := gitcmd.AuthHeader(secret)
		if err != nil {
			return nil, fmt.Errorf("%w: the leased credential: %v", errdefs.ErrFailedPrecondition, err)
		}
		kv = append(kv, [2]string{"http.extraHeader", h})
	}
	return gitcmd.ConfigEnv(kv), nil
}

// fetch brings the branch's tip into the scratch repository.
func (r *runState) fetch(ctx context.Context, secret []byte) error {
	env, err := r.remoteEnv(secret)
	if err != nil {
		return err
	}
	tip, err := r.repo.Fetch(ctx, r.spec.URL, r.d.TargetBranch, env)
	if err != nil {
		return err
	}
	r.prep.Tip = tip
	return nil
}

// validate checks the bundle's content against the tenant's policy, the
// base tree and the bundle's own file list; any finding refuses it.
func (r *runState) validate(ctx context.Context) error {
	patch, err := bundle.ReadEntry(r.bundle, bundle.PatchFile)
	if err != nil {
		return fmt.Errorf("%w: %w: patch: %v", errdefs.ErrFailedPrecondition, ErrBundle, err)
	}
	rawFiles, err := bundle.ReadEntry(r.bundle, bundle.FilesFile)
	if err != nil {
		return fmt.Errorf("%w: %w: file list: %v", errdefs.ErrFailedPrecondition, ErrBundle, err)
	}
	files, err := bundle.ParseFiles(rawFiles)
	if err != nil {
		return fmt.Errorf("%w: %w: file list: %v", errdefs.ErrFailedPrecondition, ErrBundle, err)
	}
	base, err := r.repo.Tree(ctx, r.spec.Base)
	if err != nil {
		return err
	}
	var findings []contentcheck.Finding
	outs, err := r.outFiles(ctx)
	if err != nil {
		return err
	}
	found, err := r.s.cfg.Checker.Check(ctx, r.spec.Policy, contentcheck.Input{Patch: patch, Base: base, Files: files})
	if err != nil {
		return err
	}
	findings = append(findings, found...)
	findings = append(findings, outs...)
	findings = append(findings, listMismatch(patch, files)...)
	if len(findings) > 0 {
		return &refusal{findings: toStore(findings)}
	}
	return r.record(ctx, store.StepValidated, func(d *store.Deployment) { d.FilesDigest = FilesDigestOf(paths(files)) })
}

// outFiles scans the bundle's /out files, streaming them.
func (r *runState) outFiles(ctx context.Context) ([]contentcheck.Finding, error) {
	f, err := os.Open(r.bundle)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var findings []contentcheck.Finding
	err = bundle.Stream(f, r.d.BundleDigest, func(name string) bool { return strings.HasPrefix(name, bundle.OutDir) },
		func(name string, size int64, entry io.Reader) error {
			got, err := r.s.cfg.Checker.CheckOut(ctx, r.spec.Policy, contentcheck.OutFile{Name: strings.TrimPrefix(name, bundle.OutDir), Content: entry, Size: size})
			findings = append(findings, got...)
			return err
		})
	return findings, err
}

// RuleListMismatch is a bundle whose file list (files.json, what the
// approver was shown) is not the list of files its patch changes.
const RuleListMismatch = "bundle.file-list"

// listMismatch compares the paths the patch touches with the bundle's
// file list.
func listMismatch(patch []byte, files []bundle.FileChange) []contentcheck.Finding {
	p, err := contentcheck.ParsePatch(patch)
	if err != nil {
		return nil // reported by Check as patch.malformed
	}
	var touched []string
	for _, fp := range p.Files {
		for _, path := range []string{fp.OldPath, fp.NewPath} {
			if path != "" {
				touched = append(touched, path)
			}
		}
	}
	slices.Sort(touched)
	touched = slices.Compact(touched)
	listed := paths(files)
	if slices.Equal(touched, listed) {
		return nil
	}
	return []contentcheck.Finding{{Rule: RuleListMismatch, Message: fmt.Sprintf(
		"the patch changes %d paths and the file list shown for review names %d; they must be the same", len(touched), len(listed))}}
}

// paths returns the sorted paths of files.
func paths(files []bundle.FileChange) []string {
	var out []string
	for _, f := range files {
		out = append(out, f.Path)
	}
	slices.Sort(out)
	return slices.Compact(out)
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

func toStore(fs []contentcheck.Finding) []store.Finding {
	out := make([]store.Finding, 0, len(fs))
	for _, f := range fs {
		out = append(out, store.Finding{Rule: f.Rule, Path: f.Path, Line: f.Line, Message: f.Message, Redacted: f.Redacted})
	}
	return out
}

// change is what the commit carries.
func (r *runState) change() (Change, error) {
	patch, err := bundle.ReadEntry(r.bundle, bundle.PatchFile)
	if err != nil {
		return Change{}, err
	}
	at := r.spec.ApprovedAt
	if at.IsZero() {
		at = r.d.Steps[store.StepAccepted]
	}
	return Change{
		Remote: r.spec.URL, Branch: r.d.TargetBranch, Base: r.spec.Base, Patch: patch,
		JobID: r.d.JobID, BundleDigest: r.d.BundleDigest, ApprovalID: r.d.ApprovalID, Approvers: r.d.Approvers,
		At: at, OnMoved: r.spec.OnMoved,
	}, nil
}

// prepare looks for a commit an earlier attempt landed (returned) and
// otherwise makes the commit on the fetched tip, checks it changes
// exactly the approved file list, and records StepPrepared.
func (r *runState) prepare(ctx context.Context) (string, error) {
	if c, ok, err := r.repo.Find(ctx, r.d.TargetBranch, r.d.ApprovalID); err != nil || ok {
		return c, err
	}
	c, err := r.change()
	if err != nil {
		return "", err
	}
	p, err := r.repo.Prepare(ctx, c, r.prep.Tip)
	if err != nil {
		return "", err
	}
	changed, err := r.repo.Changed(ctx, p.Parent, p.Commit)
	if err != nil {
		return "", err
	}
	if got := FilesDigestOf(changed); r.d.FilesDigest != "" && got != r.d.FilesDigest {
		return "", fmt.Errorf("%w: the commit changes other files than the approved list (%d paths)", errdefs.ErrFailedPrecondition, len(changed))
	}
	r.prep = p
	if r.after(store.StepPrepared) && r.d.Commit == p.Commit {
		return "", nil
	}
	return "", r.record(ctx, maxStep(r.d.Step, store.StepPrepared), func(d *store.Deployment) {
		d.Commit, d.ParentCommit = p.Commit, p.Parent
	})
}

// maxStep is the later of two steps: re-preparing after a lost push race
// keeps the later step recorded.
func maxStep(a, b store.Step) store.Step {
	if slices.Index(stepOrder, a) > slices.Index(stepOrder, b) {
		return a
	}
	return b
}

// consume spends the approval.
func (r *runState) consume(ctx context.Context) error {
	if r.spec.State != ApprovalConsumed {
		err := r.s.cfg.Authority.Consume(ctx, r.d.ApprovalID, r.d.JobID, r.d.BundleDigest, r.d.TargetRepo, r.d.TargetBranch)
		if err != nil {
			// A consume that landed but whose answer was lost reads
			// consumed now.
			spec, serr := r.s.cfg.Authority.Spec(ctx, r.d.ApprovalID)
			if serr != nil || spec.State != ApprovalConsumed {
				return err
			}
		}
	}
	r.log.Info("approval consumed", "approval", r.d.ApprovalID)
	return r.record(ctx, store.StepConsumed, nil)
}

// leaseDeploy ends any lease a crash left and leases the deploy
// credential.
func (r *runState) leaseDeploy(ctx context.Context) error {
	r.revokeAll(ctx, "left by an interrupted publish")
	l, err := r.s.cfg.Authority.Lease(ctx, LeaseDeploy, r.d.JobID, r.d.TargetRepo)
	if err != nil {
		return err
	}
	r.lease = l
	return r.record(ctx, store.StepLeased, func(d *store.Deployment) { d.LeaseID = l.ID })
}

// maxPushAttempts bounds the re-applies after lost push races.
const maxPushAttempts = 3

// push sends the commit, re-preparing on the new tip when the branch
// moved (if the policy allows), and records StepPushed.
func (r *runState) push(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		if err := r.s.cfg.Authority.Use(ctx, r.lease.ID, r.d.JobID, r.d.TargetRepo); err != nil {
			return err
		}
		env, err := r.remoteEnv(r.lease.Secret)
		if err != nil {
			return err
		}
		err = r.repo.Push(ctx, r.spec.URL, r.d.TargetBranch, r.prep, env)
		if err == nil {
			r.log.Info("commit pushed", "commit", r.prep.Commit, "branch", r.d.TargetBranch)
			return r.record(ctx, store.StepPushed, func(d *store.Deployment) { d.Commit, d.ParentCommit = r.prep.Commit, r.prep.Parent })
		}
		if !errors.Is(err, ErrMoved) || attempt >= maxPushAttempts {
			return err
		}
		r.log.Info("the branch moved during the push; preparing again", "attempt", attempt)
		if err := r.fetch(ctx, r.lease.Secret); err != nil {
			return err
		}
		landed, err := r.prepare(ctx)
		if err != nil {
			return err
		}
		if landed != "" {
			r.prep.Commit = landed
			return r.record(ctx, store.StepPushed, func(d *store.Deployment) { d.Commit = landed })
		}
	}
}

// landed records a commit an earlier attempt pushed.
func (r *runState) landed(ctx context.Context, commit string) error {
	r.log.Info("the approval's commit is already on the branch", "commit", commit)
	if err := r.record(ctx, store.StepPushed, func(d *store.Deployment) {
		d.Commit = commit
		d.Steps[store.StepConsumed] = cmpTime(d.Steps[store.StepConsumed], r.s.now())
	}); err != nil {
		return err
	}
	return r.succeed(ctx)
}

func cmpTime(t, or time.Time) time.Time {
	if t.IsZero() {
		return or
	}
	return t
}

// succeed ends the lease and the deployment.
func (r *runState) succeed(ctx context.Context) error {
	r.revokeAll(ctx, "the commit was pushed")
	if r.d.Step != store.StepRevoked {
		if err := r.record(ctx, store.StepRevoked, func(d *store.Deployment) { d.LeaseID = "" }); err != nil {
			return err
		}
	}
	d, err := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
		d.State, d.Message = store.Succeeded, ""
		d.UpdatedAt = r.s.now()
		return nil
	})
	if err != nil {
		return err
	}
	r.d = d
	r.log.Info("deployment succeeded", "commit", d.Commit, "branch", d.TargetBranch)
	return nil
}

// revokeAll ends every active lease the publisher holds for the job.
func (r *runState) revokeAll(ctx context.Context, reason string) {
	ctx = context.WithoutCancel(ctx)
	ids, err := r.s.cfg.Authority.ActiveLeases(ctx, r.d.JobID)
	if err != nil {
		r.log.Warn("list leases to revoke", "error", err)
		return
	}
	for _, id := range ids {
		if err := r.s.cfg.Authority.Revoke(ctx, id, reason); err != nil {
			r.log.Warn("revoke lease", "lease", id, "error", err)
		}
	}
}
