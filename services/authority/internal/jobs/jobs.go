// Package jobs owns the authority's job logic: checking a submitted job
// against its tenant's policy, recording it, granting it, dispatching the
// grant to the executor and following the run, serving its source, taking
// its result, and telling watchers about every change. It imports no gRPC
// or protobuf: the executor, the grant signer and the repositories are
// interfaces here, implemented at the boundaries (executorclient, source),
// and the api package converts between its types and the wire. Only the
// authority's api and composition root import it.
package jobs

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/source"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// NetworkMode is which kind of network policy a job asks for.
type NetworkMode int

const (
	// NetworkUnset means the spec gave none: deny-all.
	NetworkUnset NetworkMode = iota
	NetworkDenyAll
	NetworkAllow
	NetworkDomains
)

// String is the mode's name as the API spells it.
func (m NetworkMode) String() string {
	switch m {
	case NetworkDenyAll, NetworkUnset:
		return "deny_all"
	case NetworkAllow:
		return "allow"
	case NetworkDomains:
		return "domains"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// AllowRule permits one CIDR on some ports (none means every port).
type AllowRule struct {
	CIDR  string
	Ports []uint32
}

// Network is a job's network policy.
type Network struct {
	Mode NetworkMode
	// Rules are the allow mode's destinations.
	Rules []AllowRule
	// Domains and DomainPorts are the domains mode's names and ports.
	Domains     []string
	DomainPorts []uint32
}

// PublishTarget is where an approved result may be published.
type PublishTarget struct {
	Repository string
	Branch     string
}

// Spec is what a client asks to run, as the domain reads it.
type Spec struct {
	Repository string
	Revision   string
	Command    []string
	Env        map[string]string
	// Resources with zero fields taking the tenant's defaults.
	Resources policy.Limits
	Network   Network
	// RuntimeClass is a policy runtime class name, or "" for the default.
	RuntimeClass  string
	PublishTarget *PublishTarget
	// Session, if set, makes the job a session: Command is then empty.
	Session *Session
}

// Session is what makes a job a session: its sandbox stays up for the
// client's execs. Zero fields take the tenant's defaults (policy.Sessions),
// and none may pass its ceilings.
type Session struct {
	IdleTimeout        time.Duration
	MaxConcurrentExecs int
}

// SubmitRequest is one submission.
type SubmitRequest struct {
	Tenant         string
	IdempotencyKey string
	Spec           Spec
	// SpecWire is the spec exactly as submitted, serialized by the caller;
	// it is stored and given back by Get, never interpreted here.
	SpecWire []byte
}

// GrantRequest is everything the authority decided for one job: what the
// Signer turns into a signed grant.
type GrantRequest struct {
	JobID, Tenant, Requester string
	Repository, Commit       string
	Command                  []string
	Env                      map[string]string
	// Limits are the effective limits, defaults filled in.
	Limits policy.Limits
	// Network is the effective policy; its mode is never NetworkUnset.
	Network           Network
	NetworkGeneration int64
	// Generation is 1 for the first grant and one more for every change
	// granted to the running job.
	Generation    int64
	RuntimeClass  string
	PublishTarget *PublishTarget
	// Session is set, defaults filled in, for a session.
	Session *Session
	// HistoryDepth is how many commits of history the job's .git gets.
	HistoryDepth int
	IssuedAt     time.Time
	ExpiresAt    time.Time
}

// SignedGrant is a signed grant in its wire form.
type SignedGrant struct {
	// Wire is the serialized SignedGrant the executor receives.
	Wire []byte
	// Digest names exactly what was granted.
	Digest string
}

// Signer signs grants with the authority's key, and reads back the ones it
// signed (the stored grant is the record of what a job may do).
type Signer interface {
	Sign(GrantRequest) (SignedGrant, error)
	Decode(wire []byte) (GrantRequest, error)
}

// Source reads tenants' repositories (see package source).
type Source interface {
	Resolve(ctx context.Context, repo policy.Repository, rev string) (source.Revision, error)
	Archive(ctx context.Context, repo policy.Repository, commit string, w io.Writer) error
	// CommitObject returns the commit object of commit, as git stores it.
	CommitObject(ctx context.Context, repo policy.Repository, commit string) ([]byte, error)
	// PlanHistory chooses the history beyond commit a job's .git gets at
	// depth; WritePack writes it as a git pack.
	PlanHistory(ctx context.Context, repo policy.Repository, commit string, depth int) (source.History, error)
	WritePack(ctx context.Context, repo policy.Repository, h source.History, w io.Writer) error
}

// Retry bounds the back-off between attempts to reach the executor.
type Retry struct {
	Min, Max time.Duration
}

// Config is what the Service needs.
type Config struct {
	Store    store.Store
	Tenants  policy.Tenants
	Source   Source
	Signer   Signer
	Executor Executor
	// ExecutorID is the identity the Executor connection verified of its
	// peer; every dispatch records it, and only that identity may fetch
	// the job's source and report its result.
	ExecutorID identity.ID
	// GrantTTL is how long a grant may wait for the executor to accept it.
	GrantTTL time.Duration
	// StartDeadline is how long a job may wait, from its submission, for
	// an executor to accept it, where its tenant sets none: a grant that
	// expires before then is replaced by a fresh one for the same decision
	// (on the log); after it the job fails, saying so. Default
	// policy.DefaultStartDeadline.
	StartDeadline time.Duration
	// Auditors are the approver principals ("approver/NAME") who read the
	// whole audit log; every other approver reads only the entries of
	// the tenants that list it.
	Auditors []string
	// Secrets checks a job's environment for credential-looking values;
	// default a pkg/contentcheck Checker of its own.
	Secrets *contentcheck.Checker
	// Refusals throttles repeated refusals on the log; default a
	// throttle of its own (audit.NewRefusalThrottle). Whoever owns it runs
	// its Flush.
	Refusals *audit.Throttle
	Logger   *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Retry defaults to 200ms doubling up to 1s: a job waiting for an
	// executor that comes back is dispatched within about a second.
	Retry Retry
	// DrainTimeout bounds how long a watcher waits for the rest of the
	// output after the job has ended; default 30s.
	DrainTimeout time.Duration
	// Meter makes the job metrics (metrics.go); nil is the global meter
	// provider.
	Meter metric.MeterProvider
}

// Service is the authority's job logic. Its methods are safe for concurrent
// use. Background work (dispatching, following runs) starts with the first
// Submit or with Run, and stops when Run's context ends.
type Service struct {
	cfg Config
	hub *hub

	// ctx governs background work; Run cancels it on the way out.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	active map[string]bool

	// refusals keeps one caller's repeated refusal from filling the log.
	refusals *audit.Throttle
	// gate decides which queued job asks the executor next.
	gate    *gate
	metrics *metrics
}

// New returns a Service. Call Run to resume unfinished jobs and to stop
// background work on shutdown.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Store == nil, cfg.Source == nil, cfg.Signer == nil, cfg.Executor == nil:
		return nil, errors.New("jobs: store, source, signer and executor are required")
	case cfg.GrantTTL <= 0:
		return nil, errors.New("jobs: grant TTL must be positive")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Tenants == nil {
		cfg.Tenants = policy.Tenants{}
	}
	if cfg.Secrets == nil {
		c, err := contentcheck.New(contentcheck.Config{})
		if err != nil {
			return nil, err
		}
		cfg.Secrets = c
	}
	if cfg.Retry.Min <= 0 {
		cfg.Retry.Min = 200 * time.Millisecond
	}
	if cfg.Retry.Max < cfg.Retry.Min {
		cfg.Retry.Max = max(time.Second, cfg.Retry.Min)
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.StartDeadline <= 0 {
		cfg.StartDeadline = policy.DefaultStartDeadline
	}
	ctx, cancel := context.WithCancel(context.Background())
	quota := func(tenant string) policy.Quota {
		if t := cfg.Tenants[tenant]; t != nil {
			return t.Quota
		}
		return policy.Quota{}
	}
	s := &Service{cfg: cfg, hub: newHub(), ctx: ctx, cancel: cancel, active: map[string]bool{},
		refusals: cmp.Or(cfg.Refusals, audit.NewRefusalThrottle()), gate: newGate(cfg.Now, quota)}
	var err error
	if s.metrics, err = newMetrics(cfg.Meter, s.gate); err != nil {
		cancel()
		return nil, fmt.Errorf("jobs: metrics: %w", err)
	}
	return s, nil
}

// Run resumes every unfinished job (dispatching queued ones again, which
// the executor's StartJob makes safe, and following staged and running
// ones), then waits for ctx to end, stops all background work and returns.
func (s *Service) Run(ctx context.Context) error {
	defer s.wg.Wait()
	defer s.cancel()
	defer func() {
		if err := s.metrics.observed.Unregister(); err != nil {
			s.cfg.Logger.Warn("unregister the job gauges", "error", err)
		}
	}()
	pending, err := s.cfg.Store.JobsInStates(ctx, store.StateQueued, store.StateStaging, store.StateRunning)
	if ctx.Err() != nil {
		return nil // stopped while starting: not a failure
	}
	if err != nil {
		return fmt.Errorf("jobs: resume: %w", err)
	}
	// What the executor may already run holds its share at the gate
	// before any waiting job is admitted: staged and running jobs, and
	// queued ones a StartJob was sent for.
	for _, j := range pending {
		if j.State == store.StateQueued && j.DispatchedAt.IsZero() {
			continue
		}
		if g, err := s.cfg.Signer.Decode(j.Grant); err == nil {
			s.gate.hold(j.ID, j.Tenant, useOf(g.Limits))
		}
	}
	for _, j := range pending {
		s.kick(j.ID)
		// A change stored but not yet confirmed by the executor is handed
		// over again (the executor applies a generation once).
		if j.State != store.StateQueued && j.NetworkState == "pending" {
			if g, err := s.cfg.Signer.Decode(j.Grant); err == nil && g.Generation > 1 {
				s.resumeChange(j.ID, j.Grant)
			}
		}
	}
	if len(pending) > 0 {
		s.cfg.Logger.Info("resumed unfinished jobs", "count", len(pending))
	}
	if err := s.resumeApproved(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("jobs: resume approved changes: %w", err)
	}
	select {
	case <-ctx.Done():
	case <-s.ctx.Done():
	}
	return nil
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// errUnchanged ends an update that has nothing to write.
var errUnchanged = errors.New("unchanged")

// update changes job id through fn and tells watchers. When fn returns
// errUnchanged, nothing is written and the job as read is returned.
func (s *Service) update(ctx context.Context, id string, fn func(*store.Job) error) (store.Job, error) {
	return s.updateAudited(ctx, id, fn, nil)
}

// updateAudited is update that, when event is not nil, appends the audit
// entry event builds from the changed job in the same transaction: the
// change and its record take effect together or not at all.
func (s *Service) updateAudited(ctx context.Context, id string, fn func(*store.Job) error, event func(*store.Job) audit.Event) (store.Job, error) {
	var (
		unchanged store.Job
		before    store.State
	)
	change := func(j *store.Job) error {
		before = j.State
		if err := fn(j); err != nil {
			if errors.Is(err, errUnchanged) {
				unchanged = *j
			}
			return err
		}
		j.UpdatedAt = s.now()
		return nil
	}
	var j store.Job
	var err error
	if event == nil {
		j, err = s.cfg.Store.UpdateJob(ctx, id, change)
	} else {
		j, err = s.cfg.Store.UpdateJobAudited(ctx, id, func(j *store.Job) (audit.Event, error) {
			if err := change(j); err != nil {
				return audit.Event{}, err
			}
			return event(j), nil
		})
	}
	if errors.Is(err, errUnchanged) {
		return unchanged, nil
	}
	if err != nil {
		return store.Job{}, err
	}
	if j.State != before && j.State.Terminal() {
		s.metrics.jobEnded(j.State)
	}
	if j.State != before {
		s.cfg.Logger.Info("job state", "job", j.ID, "tenant", j.Tenant, "from", string(before), "to", string(j.State), "message", j.Message)
	}
	s.hub.publish(j)
	return j, nil
}

// Audit outcomes as the log stores them.
const (
	outcomeAllowed = "allowed"
	outcomeDenied  = "denied"
)

// audit appends an event that goes with no job change (a refusal, a read).
// A log that cannot be written is an error the caller must see: a decision
// that is not recorded must not take effect.
func (s *Service) audit(ctx context.Context, e audit.Event) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	if _, err := s.cfg.Store.AppendAudit(ctx, e); err != nil {
		return fmt.Errorf("jobs: audit %s: %w", e.Kind, err)
	}
	return nil
}

// auditRefusal records a refusal, unless the same one was recorded within
// the throttle's window (then it is counted, and the next says so).
func (s *Service) auditRefusal(ctx context.Context, e audit.Event) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	e, ok := s.refusals.Admit(e, e.Time)
	if !ok {
		return nil
	}
	return s.audit(ctx, e)
}

// AuditDenied records a call the authorization table refused.
func (s *Service) AuditDenied(ctx context.Context, method string, caller identity.ID, reason string) {
	if err := s.auditRefusal(ctx, audit.Event{Kind: audit.KindRpcDenied, Caller: caller.String(), Subject: method, Outcome: outcomeDenied, Reason: reason}); err != nil {
		s.cfg.Logger.Error("audit a denied call", "method", method, "caller", caller.String(), "error", err)
	}
}

// visible returns job id if caller acts for its tenant; any other job,
// existing or not, is NotFound, so ids reveal nothing across tenants.
func (s *Service) visible(ctx context.Context, caller identity.ID, id string) (store.Job, error) {
	if id == "" {
		return store.Job{}, fmt.Errorf("%w: job_id: required", errdefs.ErrInvalidArgument)
	}
	j, err := s.cfg.Store.GetJob(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Job{}, notFound(id)
	}
	if err != nil {
		return store.Job{}, err
	}
	if t := s.cfg.Tenants[j.Tenant]; t == nil || caller.Kind != identity.KindClient || !t.HasClient(caller.Principal()) {
		return store.Job{}, notFound(id)
	}
	return j, nil
}

func notFound(id string) error { return fmt.Errorf("%w: job %q", errdefs.ErrNotFound, id) }

// tenantFor returns the tenant named if caller acts for it. An unknown
// tenant gets the same answer as a foreign one.
func (s *Service) tenantFor(caller identity.ID, name string) (*policy.Tenant, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: tenant: required", errdefs.ErrInvalidArgument)
	}
	if len(name) > maxNameBytes {
		// Not echoed: it is the caller's bytes, and the refusal is audited.
		return nil, fmt.Errorf("%w: tenant: at most %d bytes (got %d)", errdefs.ErrInvalidArgument, maxNameBytes, len(name))
	}
	t := s.cfg.Tenants[name]
	if t == nil || caller.Kind != identity.KindClient || !t.HasClient(caller.Principal()) {
		return nil, fmt.Errorf("%w: tenant: %s does not act for tenant %q", errdefs.ErrPermissionDenied, caller.Principal(), name)
	}
	return t, nil
}

// maxNameBytes bounds a tenant, repository, revision or branch name a
// caller sends.
const maxNameBytes = 256

func isExecutor(id identity.ID) bool {
	return id.Kind == identity.KindService && id.Name == identity.ServiceExecutor
}

// dispatchedTo refuses caller unless it is the executor job j was
// dispatched to (any executor, for a job recorded before that was kept).
func dispatchedTo(j store.Job, caller identity.ID) error {
	if j.Executor != "" && j.Executor != caller.String() {
		return fmt.Errorf("%w: job %q was dispatched to %s, not to %s", errdefs.ErrPermissionDenied, j.ID, j.Executor, caller.String())
	}
	return nil
}

// newID returns a random id (pkg/ids).
func newID() string { return ids.New() }

// Get returns a job the caller may see.
func (s *Service) Get(ctx context.Context, caller identity.ID, id string) (store.Job, error) {
	return s.visible(ctx, caller, id)
}

// ListRequest selects jobs for List.
type ListRequest struct {
	Tenant    string
	States    []store.State
	PageSize  int
	PageToken string
}

// List returns a page of the tenant's jobs, newest first.
func (s *Service) List(ctx context.Context, caller identity.ID, req ListRequest) ([]store.Job, string, error) {
	if _, err := s.tenantFor(caller, req.Tenant); err != nil {
		return nil, "", err
	}
	switch {
	case req.PageSize < 0:
		return nil, "", fmt.Errorf("%w: page_size: must not be negative", errdefs.ErrInvalidArgument)
	case req.PageSize == 0:
		req.PageSize = 50
	case req.PageSize > 500:
		req.PageSize = 500
	}
	return s.cfg.Store.ListJobs(ctx, store.ListOptions{Tenant: req.Tenant, States: req.States, Limit: req.PageSize, PageToken: req.PageToken})
}

// Cancel stops a job. A queued job is cancelled here and never dispatched;
// a job the executor holds is cancelled there, and its final state arrives
// with its result.
func (s *Service) Cancel(ctx context.Context, caller identity.ID, id, reason string) (store.Job, error) {
	if _, err := s.visible(ctx, caller, id); err != nil {
		return store.Job{}, err
	}
	if len(reason) > 1024 {
		return store.Job{}, fmt.Errorf("%w: reason: at most 1024 bytes", errdefs.ErrInvalidArgument)
	}
	who := "cancelled by " + caller.Principal()
	if reason != "" {
		who += ": " + reason
	}
	var atExecutor, wasQueued bool
	j, err := s.updateAudited(ctx, id, func(j *store.Job) error {
		switch {
		case j.State == store.StateCancelled:
			return errUnchanged
		case j.State.Terminal():
			return fmt.Errorf("%w: job %q already ended (%s)", errdefs.ErrFailedPrecondition, id, j.State)
		case j.State == store.StateQueued:
			j.State, j.Message = store.StateCancelled, who
			// A StartJob may already be on its way; make sure it is undone.
			atExecutor, wasQueued = !j.DispatchedAt.IsZero(), true
		default:
			j.Message = "cancel requested: " + who
			atExecutor = true
		}
		return nil
	}, func(j *store.Job) audit.Event {
		return audit.Event{Kind: audit.KindJobCancelled, Caller: caller.String(), Subject: j.ID, Outcome: outcomeAllowed, Reason: j.Message}
	})
	if err == nil && wasQueued {
		s.gate.withdraw(id) // no longer waits for its turn
	}
	if err != nil || !atExecutor {
		return j, err
	}
	err = s.cfg.Executor.Cancel(ctx, id, reason)
	switch {
	case err == nil:
		return j, nil
	case wasQueued:
		s.cfg.Logger.Debug("cancel of a queued job at the executor", "job", id, "error", err)
		return j, nil
	case errors.Is(err, errdefs.ErrNotFound):
		// The executor has no run to stop; nothing else would ever end the job.
		return s.update(ctx, id, func(j *store.Job) error {
			if j.State.Terminal() {
				return errUnchanged
			}
			j.State, j.Message = store.StateCancelled, who+" (the executor had no run for it)"
			return nil
		})
	default:
		return store.Job{}, fmt.Errorf("%w: the executor could not be reached to cancel the job; try again", errdefs.ErrUnavailable)
	}
}

// SourceWriter receives a job's source: the header, then the archive,
// then, when the header's history depth is above 1, the history.
type SourceWriter interface {
	Header(commit, tree string, commitObject []byte, historyDepth int) error
	io.Writer
	// History ends the archive and starts the history pack of the given
	// depth and number of commits, which the returned writer takes.
	History(depth, commits int) (io.Writer, error)
}

// FetchSource streams the job's recorded commit, read with the authority's
// credential, to the executor it was dispatched to, while it may run: the
// header, the tree's archive and the history the job's grant gives its
// .git, from the job's own repository.
func (s *Service) FetchSource(ctx context.Context, caller identity.ID, id string, w SourceWriter) error {
	if !isExecutor(caller) {
		return fmt.Errorf("%w: only the executor fetches source", errdefs.ErrPermissionDenied)
	}
	if id == "" {
		return fmt.Errorf("%w: job_id: required", errdefs.ErrInvalidArgument)
	}
	j, err := s.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return err
	}
	switch j.State {
	case store.StateQueued, store.StateStaging, store.StateRunning:
	default:
		return fmt.Errorf("%w: job %q is %s; its source is served only while it runs", errdefs.ErrFailedPrecondition, id, j.State)
	}
	if j.DispatchedAt.IsZero() {
		return fmt.Errorf("%w: job %q has not been dispatched", errdefs.ErrFailedPrecondition, id)
	}
	if err := dispatchedTo(j, caller); err != nil {
		return err
	}
	repo, ok := s.repository(j)
	if !ok {
		return fmt.Errorf("%w: repository %q is no longer in tenant %q's policy", errdefs.ErrFailedPrecondition, j.Repository, j.Tenant)
	}
	obj, err := s.cfg.Source.CommitObject(ctx, repo, j.Commit)
	if err != nil {
		return err
	}
	g, err := s.cfg.Signer.Decode(j.Grant)
	if err != nil {
		return err
	}
	depth := max(1, g.HistoryDepth)
	hw := &headerFirst{w: w, commit: j.Commit, tree: j.TreeHash, object: obj, depth: depth}
	if err := s.cfg.Source.Archive(ctx, repo, j.Commit, hw); err != nil {
		return err
	}
	if err := hw.ensureHeader(); err != nil {
		return err
	}
	history := ""
	if depth > 1 {
		h, err := s.cfg.Source.PlanHistory(ctx, repo, j.Commit, depth)
		if err != nil {
			return err
		}
		pw, err := w.History(h.Depth, h.Commits)
		if err != nil {
			return err
		}
		if h.Commits > 0 {
			if err := s.cfg.Source.WritePack(ctx, repo, h, pw); err != nil {
				return err
			}
		}
		history = fmt.Sprintf(", git history depth %d of %d (%d commits)", h.Depth, depth, h.Commits)
	}
	return s.audit(ctx, audit.Event{Kind: audit.KindSourceFetched, Caller: caller.String(), Subject: j.ID, Tenant: j.Tenant, JobID: j.ID,
		Outcome: outcomeAllowed, Reason: fmt.Sprintf("repository %s at %s (tree %s)%s", j.Repository, j.Commit, j.TreeHash, history)})
}

// historyDepth is the git history depth the tenant's policy gives a job's
// .git: at least 1. It is read once, into the job's grant.
func (s *Service) historyDepth(tenant string) int {
	if t := s.cfg.Tenants[tenant]; t != nil && t.GitHistoryDepth > 1 {
		return t.GitHistoryDepth
	}
	return 1
}

func (s *Service) repository(j store.Job) (policy.Repository, bool) {
	t := s.cfg.Tenants[j.Tenant]
	if t == nil {
		return policy.Repository{}, false
	}
	r, ok := t.Repositories[j.Repository]
	return r, ok
}

// headerFirst sends the header just before the first archive bytes, so a
// failure before any bytes leaves the stream without a misleading header.
type headerFirst struct {
	w            SourceWriter
	commit, tree string
	object       []byte
	depth        int
	sent         bool
}

func (h *headerFirst) ensureHeader() error {
	if h.sent {
		return nil
	}
	h.sent = true
	return h.w.Header(h.commit, h.tree, h.object, h.depth)
}

func (h *headerFirst) Write(p []byte) (int, error) {
	if err := h.ensureHeader(); err != nil {
		return 0, err
	}
	return h.w.Write(p)
}

// Reason says why a run ended.
type Reason int

const (
	ReasonUnspecified Reason = iota
	ReasonExited
	ReasonTimeout
	ReasonOOM
	ReasonDiskFull
	ReasonCancelled
	ReasonExecutorRestarted
	ReasonSandboxError
	// A session's: its client finished it, or it sat idle too long.
	ReasonFinished
	ReasonIdleTimeout
)

// Report is what the executor reports when a run ends.
type Report struct {
	Reason       Reason
	ExitCode     int32
	BundleDigest string
	// Message is the executor's detail, for SANDBOX_ERROR and the like.
	Message string
	// Result is the serialized RunResult, stored as is.
	Result []byte
	// Patch is the patch's first bytes, for reviewers.
	Patch []byte
	// Review is the serialized ReviewDetail (file list, patch size, output
	// tails), stored as is; nil when the executor sent none, which is
	// refused for a result with a bundle.
	Review     []byte
	Provenance []byte
	// Execs are a session's execs as the report lists them (the first and
	// the last, when not all fit): the authority's records take their
	// final state from them.
	Execs []ExecSeen
}

// outcome maps a report to the job's final state and a message for people.
func (r Report) outcome() (store.State, string) {
	detail := func(s string) string {
		if r.Message != "" {
			return s + ": " + r.Message
		}
		return s
	}
	switch r.Reason {
	case ReasonExited:
		return store.StateFinished, fmt.Sprintf("exited with status %d", r.ExitCode)
	case ReasonTimeout:
		return store.StateFinished, "the deadline passed and the process tree was killed"
	case ReasonOOM:
		return store.StateFinished, "the memory limit was hit and the kernel killed the job"
	case ReasonDiskFull:
		return store.StateFinished, "the disk limit was reached"
	case ReasonCancelled:
		return store.StateCancelled, detail("cancelled")
	case ReasonExecutorRestarted:
		return store.StateFailed, detail("the executor restarted while the job was in flight")
	case ReasonFinished:
		return store.StateFinished, "the client finished the session"
	case ReasonIdleTimeout:
		return store.StateFinished, "the session had no exec running for longer than its idle timeout"
	default:
		return store.StateFailed, detail("the sandbox could not be set up or the runtime failed")
	}
}

// ReportResult records a run's outcome. The same report again (same bundle
// digest) changes nothing; a different one for a job that already has a
// result is refused.
func (s *Service) ReportResult(ctx context.Context, caller identity.ID, id string, r Report) (store.Job, error) {
	if !isExecutor(caller) {
		return store.Job{}, fmt.Errorf("%w: only the executor reports results", errdefs.ErrPermissionDenied)
	}
	if id == "" {
		return store.Job{}, fmt.Errorf("%w: job_id: required", errdefs.ErrInvalidArgument)
	}
	if r.Reason <= ReasonUnspecified || r.Reason > ReasonIdleTimeout {
		return store.Job{}, fmt.Errorf("%w: result.reason: required", errdefs.ErrInvalidArgument)
	}
	if r.BundleDigest != "" && !isDigest(r.BundleDigest) {
		return store.Job{}, fmt.Errorf("%w: result.bundle_digest: %q is not sha256:<64 hex>", errdefs.ErrInvalidArgument, r.BundleDigest)
	}
	if r.BundleDigest == "" {
		if st, _ := r.outcome(); st == store.StateFinished {
			return store.Job{}, fmt.Errorf("%w: result.bundle_digest: required when the run finished", errdefs.ErrInvalidArgument)
		}
	}
	if r.BundleDigest != "" && r.Review == nil {
		// A reviewer must see every file of a bundle that may land.
		return store.Job{}, fmt.Errorf("%w: detail: required with a bundle (the file list, patch size and output tails)", errdefs.ErrInvalidArgument)
	}
	j, err := s.updateAudited(ctx, id, func(j *store.Job) error {
		if j.DispatchedAt.IsZero() {
			return fmt.Errorf("%w: job %q was never dispatched", errdefs.ErrFailedPrecondition, id)
		}
		if err := dispatchedTo(*j, caller); err != nil {
			return err
		}
		if len(j.Result) > 0 {
			if j.BundleDigest == r.BundleDigest && (r.BundleDigest != "" || string(j.Result) == string(r.Result)) {
				return errUnchanged
			}
			return fmt.Errorf("%w: job %q already has a result (bundle %q)", errdefs.ErrFailedPrecondition, id, j.BundleDigest)
		}
		j.Result, j.BundleDigest, j.Patch, j.Review, j.Provenance = r.Result, r.BundleDigest, r.Patch, r.Review, r.Provenance
		if !j.State.Terminal() {
			// A job already ended here (cancelled while queued, say)
			// keeps its state; the result is recorded beside it.
			j.State, j.Message = r.outcome()
		}
		return nil
	}, func(j *store.Job) audit.Event {
		return audit.Event{Kind: audit.KindResultRecorded, Caller: caller.String(), Subject: j.ID, Outcome: outcomeAllowed,
			Reason: fmt.Sprintf("%s, bundle %s: %s", j.State, orNone(j.BundleDigest), j.Message)}
	})
	if err == nil && len(r.Execs) > 0 {
		s.observeExecs(ctx, j.ID, r.Execs...)
	}
	return j, err
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func isDigest(s string) bool {
	hex, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, r := range hex {
		if !('0' <= r && r <= '9') && !('a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// AuditQuery selects audit events.
type AuditQuery struct {
	JobID, Tenant, Caller, Kind string
	Since, Until                time.Time
	PageSize                    int
	PageToken                   string
}

// auditPageBytes bounds one page of the audit log.
const auditPageBytes = 2 << 20

// AuditEvents returns a page of the audit log, oldest first, and the token
// of the next page ("" on the last). The authorization table lets only
// approvers call; an auditor reads the whole log, any other approver only
// the entries of a tenant that lists it, and must name that tenant.
func (s *Service) AuditEvents(ctx context.Context, caller identity.ID, q AuditQuery) ([]audit.Event, string, error) {
	if err := s.mayReadAudit(caller, q.Tenant); err != nil {
		return nil, "", err
	}
	size := q.PageSize
	switch {
	case size == 0:
		size = 100
	case size < 0 || size > 1000:
		return nil, "", fmt.Errorf("%w: page_size: %d is not between 1 and 1000", errdefs.ErrInvalidArgument, size)
	}
	var after int64
	if q.PageToken != "" {
		n, err := strconv.ParseInt(strings.TrimPrefix(q.PageToken, "after:"), 10, 64)
		if err != nil || !strings.HasPrefix(q.PageToken, "after:") || n < 0 {
			return nil, "", fmt.Errorf("%w: page_token: not a token this server issued", errdefs.ErrInvalidArgument)
		}
		after = n
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return nil, "", fmt.Errorf("%w: end_time must be after start_time", errdefs.ErrInvalidArgument)
	}
	events, err := s.cfg.Store.ListAudit(ctx, store.AuditFilter{
		JobID: q.JobID, Tenant: q.Tenant, Caller: q.Caller, Kind: q.Kind,
		Since: q.Since, Until: q.Until, AfterSequence: after, Limit: size + 1,
	})
	if err != nil {
		return nil, "", err
	}
	// A page also ends before it would pass auditPageBytes (entries are
	// bounded, but a thousand of them need not fit in one message).
	n, total := 0, 0
	for n < len(events) && n < size {
		e := events[n]
		total += len(e.Kind) + len(e.Caller) + len(e.Subject) + len(e.Tenant) + len(e.JobID) + len(e.Outcome) + len(e.Reason) + 256
		if n > 0 && total > auditPageBytes {
			break
		}
		n++
	}
	next := ""
	if n < len(events) {
		events = events[:n]
		next = fmt.Sprintf("after:%d", events[n-1].Sequence)
	}
	return events, next, nil
}

// IsAuditor reports whether caller reads the whole audit log.
func (s *Service) IsAuditor(caller identity.ID) bool {
	return caller.Kind == identity.KindApprover && slices.Contains(s.cfg.Auditors, caller.Principal())
}

// mayReadAudit says whether caller may read the log's entries of tenant
// ("" for the whole log).
func (s *Service) mayReadAudit(caller identity.ID, tenant string) error {
	switch {
	case s.IsAuditor(caller):
		return nil
	case caller.Kind != identity.KindApprover:
		return fmt.Errorf("%w: only approvers read the audit log", errdefs.ErrPermissionDenied)
	case tenant == "":
		return fmt.Errorf("%w: tenant: required: %s reads only the entries of the tenants that list it as an approver; the whole log is for auditors (the authority config's audit.auditors)",
			errdefs.ErrPermissionDenied, caller.Principal())
	}
	if t := s.cfg.Tenants[tenant]; t == nil || !t.Approvals.AllowsApprover(caller.Principal()) {
		// Told the same whether the tenant exists or not.
		return fmt.Errorf("%w: tenant %q: %s is not one of its approvers", errdefs.ErrPermissionDenied, tenant, caller.Principal())
	}
	return nil
}

// RecordPolicy appends the tenant policy this authority runs with to the
// audit log (kind policy.loaded): a digest of the whole policy and of each
// tenant's, so a change between starts shows as a changed digest.
// Credential files are named by path only; their contents are never read
// here.
func (s *Service) RecordPolicy(ctx context.Context, caller identity.ID) error {
	names := make([]string, 0, len(s.cfg.Tenants))
	for name := range s.cfg.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	digest := func(v any) (string, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(sum[:]), nil
	}
	all, err := digest(s.cfg.Tenants)
	if err != nil {
		return fmt.Errorf("jobs: policy digest: %w", err)
	}
	parts := []string{fmt.Sprintf("%d tenant(s), policy %s", len(names), all)}
	for _, name := range names {
		d, err := digest(s.cfg.Tenants[name])
		if err != nil {
			return fmt.Errorf("jobs: policy digest: %w", err)
		}
		parts = append(parts, name+" "+d)
	}
	return s.audit(ctx, audit.Event{Kind: audit.KindPolicyLoaded, Caller: caller.String(), Subject: all, Outcome: outcomeAllowed,
		Reason: strings.Join(parts, "; ")})
}

// startDeadline is how long job j may wait for an executor.
func (s *Service) startDeadline(j store.Job) time.Duration {
	if t := s.cfg.Tenants[j.Tenant]; t != nil && t.StartDeadline > 0 {
		return t.StartDeadline
	}
	return s.cfg.StartDeadline
}
