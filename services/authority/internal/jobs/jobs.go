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
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Retry bounds the back-off between attempts to reach the executor.
type Retry struct {
	Min, Max time.Duration
}

// Config is what the Service needs.
type Config struct {
	Store   store.Store
	Tenants policy.Tenants
	Source  Source
	// Images resolves and reads jobs' OCI images; nil refuses every job
	// that names one (the host template still runs).
	Images Images
	Signer Signer
	// Fleet places jobs on executors and knows which are lost; Executors
	// reaches each by its SPIFFE ID. A job's executor is recorded when it
	// is placed, and only that executor may fetch its source and report
	// its result.
	Fleet     Fleet
	Executors Executors
	// Self is this authority's identity, the caller of the entries it
	// writes on its own (a regrant, a placement, a job its executor lost).
	Self identity.ID
	// Replica names this process in its claims on jobs; replicas sharing
	// a store must have different names, and a process that restarts
	// under its old name takes its old claims back at once. Default: a
	// random name.
	Replica string
	// ClaimTTL is how long a replica's claim on a job lasts unrenewed: a
	// replica that dies leaves its jobs to another after at most this
	// long. Default 15s.
	ClaimTTL time.Duration
	// SweepInterval is how often the fleet is swept for lost executors;
	// default 5s.
	SweepInterval time.Duration
	// LostResult is the run result recorded for a job whose executor was
	// lost (serialized, reason executor_lost).
	LostResult []byte
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
	// Metering keeps tenants' budgets at submission and is told of every
	// run whose result is recorded; nil meters nothing.
	Metering Metering
}

// Metering is metering as the job logic uses it.
type Metering interface {
	// Admit refuses new work of a tenant past its monthly budget
	// (errdefs.ErrResourceExhausted) and warns near it.
	Admit(ctx context.Context, tenant string) (warning string, err error)
	// Ended counts a job whose run's result was just recorded.
	Ended(store.UsageRecord)
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

	mu sync.Mutex
	// active holds each job a goroutine drives: true when it was kicked
	// again meanwhile, so it drives the job once more before it ends (a
	// kick must never be lost to a goroutine on its way out).
	active map[string]bool
	// traces holds, while a goroutine drives a job, the trace of the call
	// that submitted it, which its dispatch continues (so one trace runs
	// from the client's CreateSession to the executor's sandbox).
	traces map[string]trace.SpanContext
	// wakes are the wake-ups armed for jobs waiting on their start
	// approval (wakeAt), one per job.
	wakes map[string]*time.Timer

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
	case cfg.Store == nil, cfg.Source == nil, cfg.Signer == nil, cfg.Fleet == nil, cfg.Executors == nil:
		return nil, errors.New("jobs: store, source, signer, fleet and executors are required")
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
	if cfg.Replica == "" {
		cfg.Replica = "authority-" + ids.New()
	}
	if cfg.ClaimTTL <= 0 {
		cfg.ClaimTTL = 15 * time.Second
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	quota := func(tenant string) policy.Quota {
		if t := cfg.Tenants[tenant]; t != nil {
			return t.Quota
		}
		return policy.Quota{}
	}
	s := &Service{cfg: cfg, hub: newHub(), ctx: ctx, cancel: cancel, active: map[string]bool{}, traces: map[string]trace.SpanContext{}, wakes: map[string]*time.Timer{},
		refusals: cmp.Or(cfg.Refusals, audit.NewRefusalThrottle()), gate: newGate(cfg.Now, quota)}
	var err error
	if s.metrics, err = newMetrics(cfg.Meter, s.gate); err != nil {
		cancel()
		return nil, fmt.Errorf("jobs: metrics: %w", err)
	}
	return s, nil
}

// Run drives the unfinished jobs this replica claims — at once those no
// replica holds (after a restart, its own old claims too), then every few
// seconds those whose claim another replica let lapse — renews its claims,
// sweeps the fleet for lost executors, then, when ctx ends, stops all
// background work, hands its claims back and returns.
func (s *Service) Run(ctx context.Context) error {
	defer s.wg.Wait()
	defer s.cancel()
	defer func() {
		if err := s.metrics.observed.Unregister(); err != nil {
			s.cfg.Logger.Warn("unregister the job gauges", "error", err)
		}
	}()
	// A process that restarts under its old name takes its own claims
	// back now rather than after they lapse.
	if err := s.cfg.Store.ReleaseClaims(ctx, s.cfg.Replica); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: not a failure
		}
		return fmt.Errorf("jobs: release old claims: %w", err)
	}
	if err := s.claim(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("jobs: resume: %w", err)
	}
	if err := s.resumeApproved(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("jobs: resume approved changes: %w", err)
	}
	claims := time.NewTicker(s.cfg.ClaimTTL / 3)
	defer claims.Stop()
	sweeps := time.NewTicker(s.cfg.SweepInterval)
	defer sweeps.Stop()
	defer func() {
		// Handed back so another replica takes them up at once; a fresh
		// context, as ctx has ended.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.cancel()
		s.wg.Wait()
		if err := s.cfg.Store.ReleaseClaims(rctx, s.cfg.Replica); err != nil {
			s.cfg.Logger.Warn("hand back claims on jobs", "error", err)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.ctx.Done():
			return nil
		case <-claims.C:
			if err := s.claim(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Warn("claim jobs", "error", err)
			}
		case <-sweeps.C:
			if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Warn("sweep the fleet", "error", err)
			}
		}
	}
}

// claimBatch bounds the jobs one claim takes.
const claimBatch = 500

// claim renews this replica's claims and takes up every unfinished job no
// replica holds.
func (s *Service) claim(ctx context.Context) error {
	until := s.now().Add(s.cfg.ClaimTTL)
	held, err := s.cfg.Store.RenewClaims(ctx, s.cfg.Replica, until)
	if err != nil {
		return err
	}
	for {
		got, err := s.cfg.Store.ClaimJobs(ctx, s.cfg.Replica, s.now(), until, claimBatch)
		if err != nil {
			return err
		}
		s.resume(got)
		if len(got) < claimBatch {
			break
		}
	}
	// An unfinished job this replica holds and no goroutine drives (its
	// drive ended on an error, or its submission's commit reached the
	// store while the caller's context ended) is driven again: else its
	// claim would be renewed for ever with nobody acting on it.
	for _, id := range held {
		s.mu.Lock()
		_, waiting := s.wakes[id] // waiting on its start approval: its wake-up drives it
		s.mu.Unlock()
		if !waiting {
			s.kick(id)
		}
	}
	return nil
}

// resume drives jobs just claimed: dispatching queued ones again (the
// executor's StartJob makes that safe), following staged and running
// ones, and handing over a change the executor had not confirmed.
func (s *Service) resume(claimed []store.Job) {
	if len(claimed) == 0 {
		return
	}
	// Each job's grant, read once for both passes below.
	grants := make(map[string]GrantRequest, len(claimed))
	for _, j := range claimed {
		if g, err := s.grantOf(j); err == nil {
			grants[j.ID] = g
		}
	}
	// What an executor may already run holds its share at the gate
	// before any waiting job is admitted: staged and running jobs, and
	// queued ones a StartJob was sent for.
	for _, j := range claimed {
		if j.State == store.StateQueued && j.DispatchedAt.IsZero() {
			continue
		}
		if g, ok := grants[j.ID]; ok {
			s.gate.hold(j.ID, j.Tenant, useOf(g.Limits))
		}
	}
	for _, j := range claimed {
		s.kick(j.ID)
		// A change stored but not yet confirmed by the executor is handed
		// over again (the executor applies a generation once).
		if j.State != store.StateQueued && j.NetworkState == "pending" {
			if g, ok := grants[j.ID]; ok && g.Generation > 1 {
				s.resumeChange(j.ID, j.Grant)
			}
		}
	}
	s.cfg.Logger.Info("claimed unfinished jobs", "count", len(claimed), "replica", s.cfg.Replica)
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
		hadResult bool
	)
	change := func(j *store.Job) error {
		before, hadResult = j.State, len(j.Result) > 0
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
	if !hadResult && len(j.Result) > 0 && s.cfg.Metering != nil {
		s.cfg.Metering.Ended(store.UsageRecord{ID: j.ID, Tenant: j.Tenant, State: j.State, Grant: j.Grant, Result: j.Result,
			StartedAt: j.StartedAt, EndedAt: j.EndedAt})
	}
	if j.State != before {
		s.cfg.Logger.Info("job state", "job", j.ID, "tenant", j.Tenant, "from", string(before), "to", string(j.State), "message", j.Message)
	}
	s.hub.publish(j)
	return j, nil
}

// newID returns a random id (pkg/ids).
func newID() string { return ids.New() }

// startDeadline is how long job j may wait for an executor.
func (s *Service) startDeadline(j store.Job) time.Duration {
	if t := s.cfg.Tenants[j.Tenant]; t != nil && t.StartDeadline > 0 {
		return t.StartDeadline
	}
	return s.cfg.StartDeadline
}

// grantOf reads the grant stored with j back into the decision it
// records. It is the one place the jobs package turns a stored grant into
// a domain value; callers read it once per loaded record.
func (s *Service) grantOf(j store.Job) (GrantRequest, error) {
	return s.cfg.Signer.Decode(j.Grant)
}
