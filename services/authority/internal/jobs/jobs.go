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
	Images   Images
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
	// Each job's grant, read once for both passes below.
	grants := make(map[string]GrantRequest, len(pending))
	for _, j := range pending {
		if g, err := s.grantOf(j); err == nil {
			grants[j.ID] = g
		}
	}
	// What the executor may already run holds its share at the gate
	// before any waiting job is admitted: staged and running jobs, and
	// queued ones a StartJob was sent for.
	for _, j := range pending {
		if j.State == store.StateQueued && j.DispatchedAt.IsZero() {
			continue
		}
		if g, ok := grants[j.ID]; ok {
			s.gate.hold(j.ID, j.Tenant, useOf(g.Limits))
		}
	}
	for _, j := range pending {
		s.kick(j.ID)
		// A change stored but not yet confirmed by the executor is handed
		// over again (the executor applies a generation once).
		if j.State != store.StateQueued && j.NetworkState == "pending" {
			if g, ok := grants[j.ID]; ok && g.Generation > 1 {
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
