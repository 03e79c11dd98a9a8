package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Defaults of Config.
const (
	DefaultInterval  = 5 * time.Second
	DefaultLostAfter = 30 * time.Second
)

// SingleName is the fleet name of an executor whose certificate names no
// instance (spiffe://TD/service/executor): the one executor of a
// deployment that never named its executors. No certificate may name it.
const SingleName = identity.ReservedInstance

// Bounds of a report: what one heartbeat may carry.
const (
	maxImages    = 1024
	maxSources   = 1024
	maxPools     = 16
	maxRuns      = 4096
	maxItemBytes = 256
	maxReason    = 200
)

// Config is what a Fleet needs.
type Config struct {
	Store store.Store
	// Interval is how often executors are asked to report; default
	// DefaultInterval.
	Interval time.Duration
	// LostAfter is how long an executor may miss its heartbeats before it
	// is lost; default DefaultLostAfter, at least three intervals.
	LostAfter time.Duration
	// Now is the clock; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Meter makes the fleet's gauges (metrics.go); nil is the global
	// meter provider.
	Meter metric.MeterProvider
}

// Fleet is the authority's view of its executors. Its methods are safe for
// concurrent use, and several Fleets (replicas) may share one store.
type Fleet struct {
	cfg Config

	mu sync.Mutex
	// snap is the last read of the fleet, reused for placement within
	// snapTTL.
	snap       []Member
	placements []store.Placement
	snapAt     time.Time
	// reserved is what this replica placed on each executor (by name)
	// since the executor's report, which may not count it yet.
	reserved map[string][]reservation
	// freed is what jobs the executors' reports counted as running have
	// freed since (they ended), by executor name.
	freed map[string][]reservation
	// full holds off an executor that refused a job for lack of capacity
	// until its next report (the LastSeen it had).
	full     map[string]time.Time
	observed metric.Registration
	// onReturn is told of an executor that came back from lost (its
	// SPIFFE ID).
	onReturn func(id string)
	// onRestart ends what an executor's previous process held; under mu.
	onRestart func(ctx context.Context, id, name string, startedAt time.Time) error
}

// OnReturn has fn told, in the heartbeat's goroutine, of every executor
// that comes back after it was lost (its SPIFFE ID): its sessions wait to
// be resumed. (An executor that restarts without being lost keeps its
// sessions suspended for their clients to resume, as a single executor
// always has.) Call it before the first heartbeat.
func (f *Fleet) OnReturn(fn func(id string)) { f.onReturn = fn }

// OnRestart has fn told of every executor whose heartbeat reports a
// start later than the one recorded (its SPIFFE ID, fleet name and new
// start): what its previous process held (the brokered credentials its
// jobs' proxies leased) ends. fn runs before the heartbeat is recorded,
// so a failure of fn fails the heartbeat and the next one tells fn
// again. A restart seen before fn is set is not told.
func (f *Fleet) OnRestart(fn func(ctx context.Context, id, name string, startedAt time.Time) error) {
	f.mu.Lock()
	f.onRestart = fn
	f.mu.Unlock()
}

// New returns a Fleet.
func New(cfg Config) (*Fleet, error) {
	if cfg.Store == nil {
		return nil, errors.New("fleet: a store is required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.LostAfter <= 0 {
		cfg.LostAfter = DefaultLostAfter
	}
	if cfg.LostAfter < 3*cfg.Interval {
		return nil, fmt.Errorf("fleet: lost_after %v must be at least three heartbeat intervals (%v)", cfg.LostAfter, 3*cfg.Interval)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Fleet{cfg: cfg, reserved: map[string][]reservation{}, freed: map[string][]reservation{}, full: map[string]time.Time{}}
	reg, err := f.observe(cfg.Meter)
	if err != nil {
		return nil, fmt.Errorf("fleet: metrics: %w", err)
	}
	f.observed = reg
	return f, nil
}

// Close unregisters the fleet's gauges.
func (f *Fleet) Close() error { return f.observed.Unregister() }

func (f *Fleet) now() time.Time { return f.cfg.Now().UTC().Truncate(time.Microsecond) }

// NameOf is the fleet name of executor id: its instance, or SingleName.
func NameOf(id identity.ID) string {
	if id.Instance != "" {
		return id.Instance
	}
	return SingleName
}

// Heartbeat records executor caller's report and address, joining it to
// the fleet or bringing it back from lost (both on the audit log), and
// answers with its drain and the runs it must stop: those whose jobs are
// not placed on it any more, or have ended.
func (f *Fleet) Heartbeat(ctx context.Context, caller identity.ID, address string, r Report) (Answer, error) {
	if !caller.IsExecutor() {
		return Answer{}, fmt.Errorf("%w: %s is not an executor", errdefs.ErrPermissionDenied, caller)
	}
	if err := checkAddress(address); err != nil {
		return Answer{}, fmt.Errorf("%w: address: %v", errdefs.ErrInvalidArgument, err)
	}
	if err := r.check(); err != nil {
		return Answer{}, fmt.Errorf("%w: report.%v", errdefs.ErrInvalidArgument, err)
	}
	body, err := json.Marshal(r)
	if err != nil {
		return Answer{}, fmt.Errorf("fleet: encode the report: %w", err)
	}
	name, now := NameOf(caller), f.now()
	f.mu.Lock()
	onRestart := f.onRestart
	f.mu.Unlock()
	var (
		event string
		kept  store.Executor
		// restartSeen is set once onRestart was told of this start.
		restartSeen bool
	)
	update := func(e *store.Executor, found bool) (*audit.Event, error) {
		if found && e.ID == caller.String() && !restartSeen && onRestart != nil && restarted(e.Report, r.StartedAt) {
			return nil, errRestarted
		}
		if found && e.ID == caller.String() && e.State == store.ExecutorUp && now.Sub(e.LastSeen) < f.cfg.Interval/4 && !restartSeen {
			// Far sooner than asked: answered, not written (an executor
			// cannot make the authority write faster than its interval),
			// unless it restarted since.
			kept = *e
			return nil, errUnchanged
		}
		switch {
		case !found:
			e.ID, e.JoinedAt, event = caller.String(), now, audit.KindExecutorJoined
		case e.ID != caller.String():
			return nil, fmt.Errorf("%w: the fleet name %q is %s's; %s must have a certificate of its own name",
				errdefs.ErrPermissionDenied, name, e.ID, caller)
		case e.State == store.ExecutorLost:
			event = audit.KindExecutorReturned
		default:
			event = ""
		}
		e.State, e.Address, e.Report, e.LastSeen = store.ExecutorUp, address, body, now
		if event == "" {
			return nil, nil
		}
		reason := fmt.Sprintf("executor %s at %s runs %v", name, address, r.Classes)
		if event == audit.KindExecutorReturned {
			reason = fmt.Sprintf("executor %s came back at %s after it was lost", name, address)
		}
		return &audit.Event{Kind: event, Caller: caller.String(), Subject: name, Outcome: audit.OutcomeAllowed, Reason: reason}, nil
	}
	e, err := f.cfg.Store.UpdateExecutorAudited(ctx, name, update)
	if errors.Is(err, errRestarted) {
		// Outside the executor's transaction: what it held ends first,
		// then its new start is recorded.
		if err := onRestart(ctx, caller.String(), name, r.StartedAt); err != nil {
			return Answer{}, fmt.Errorf("fleet: executor %s restarted: %w", name, err)
		}
		restartSeen = true
		e, err = f.cfg.Store.UpdateExecutorAudited(ctx, name, update)
	}
	switch {
	case errors.Is(err, errUnchanged):
		e = kept
	case err != nil:
		return Answer{}, err
	}
	if event != "" {
		f.cfg.Logger.Info("executor "+event[len("executor."):], "executor", name, "address", address, "classes", r.Classes)
		f.forget() // placement sees it at once
	}
	if event == audit.KindExecutorReturned && f.onReturn != nil {
		f.onReturn(caller.String())
	}
	cancel, err := f.strayRuns(ctx, caller, r.Runs)
	if err != nil {
		return Answer{}, err
	}
	return Answer{Name: name, Interval: f.cfg.Interval, LostAfter: f.cfg.LostAfter, Draining: e.Draining, CancelRuns: cancel}, nil
}

// errRestarted stops a heartbeat's update to end what the executor's
// previous process held first.
var errRestarted = errors.New("the executor restarted")

// restarted says whether an executor whose last recorded report is
// recorded started before startedAt (both known).
func restarted(recorded []byte, startedAt time.Time) bool {
	var last Report
	if startedAt.IsZero() || json.Unmarshal(recorded, &last) != nil || last.StartedAt.IsZero() {
		return false
	}
	return startedAt.After(last.StartedAt)
}

// strayRuns are the runs of runs that the executor must stop: their jobs
// are not placed on it, or have ended.
func (f *Fleet) strayRuns(ctx context.Context, caller identity.ID, runs []string) ([]string, error) {
	if len(runs) == 0 {
		return nil, nil
	}
	placed, err := f.cfg.Store.JobsOnExecutor(ctx, caller.String(), maxRuns*2)
	if err != nil {
		return nil, fmt.Errorf("fleet: jobs on %s: %w", caller, err)
	}
	here := make(map[string]bool, len(placed))
	for _, j := range placed {
		here[j.ID] = true
	}
	var stray []string
	for _, id := range runs {
		if !here[id] {
			stray = append(stray, id)
		}
	}
	return stray, nil
}

// checkAddress checks the address an executor says it is reached at: a
// host (an IP address, or a DNS name of letters, digits, dots and
// hyphens) and a port from 1 to 65535, at most 255 bytes — nothing the
// audit log or a terminal would show as more than it is. The authority
// dials it only to talk to that executor, whose certificate it pins.
func checkAddress(address string) error {
	if address == "" {
		return errors.New("required (host:port)")
	}
	if len(address) > 255 {
		return fmt.Errorf("%d bytes, at most 255", len(address))
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil || host == "" {
		return fmt.Errorf("%q: want host:port", address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be 1 to 65535", address)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.IsUnspecified() {
			return fmt.Errorf("%q: an unspecified address cannot be dialled", address)
		}
		return nil
	}
	for _, r := range host {
		if !('a' <= r && r <= 'z') && !('A' <= r && r <= 'Z') && !('0' <= r && r <= '9') && r != '.' && r != '-' {
			return fmt.Errorf("%q: the host is neither an IP address nor a DNS name", address)
		}
	}
	return nil
}

// check bounds what one report may carry.
func (r *Report) check() error {
	for _, c := range r.Classes {
		if !slices.Contains(policy.RuntimeClasses(), c) {
			return fmt.Errorf("runtime_classes: unknown class %q", c)
		}
	}
	for _, l := range []struct {
		field string
		items []string
		most  int
	}{{"images", r.Images, maxImages}, {"sources", r.Sources, maxSources}, {"network_pools", r.Pools, maxPools}, {"runs", r.Runs, maxRuns}} {
		if len(l.items) > l.most {
			return fmt.Errorf("%s: %d entries, at most %d", l.field, len(l.items), l.most)
		}
		for _, s := range l.items {
			if s == "" || len(s) > maxItemBytes {
				return fmt.Errorf("%s: an entry of %d bytes, want 1 to %d", l.field, len(s), maxItemBytes)
			}
		}
	}
	c := r.Capacity
	for _, v := range []int64{c.MemoryBytes, c.MemoryFree, c.CPUMillis, c.CPUFree, c.DiskBytes, c.DiskFree, c.Jobs, c.JobsFree} {
		if v < 0 {
			return errors.New("capacity: a negative figure")
		}
	}
	for _, p := range []struct {
		what        string
		free, total int64
	}{{"memory", c.MemoryFree, c.MemoryBytes}, {"cpu", c.CPUFree, c.CPUMillis}, {"disk", c.DiskFree, c.DiskBytes}, {"jobs", c.JobsFree, c.Jobs}} {
		if p.free > p.total {
			return fmt.Errorf("capacity: %d of %s free, more than its total %d", p.free, p.what, p.total)
		}
	}
	if len(r.Version) > maxItemBytes {
		return errors.New("version: too long")
	}
	return nil
}

// List returns the fleet by name, each with what is placed on it.
func (f *Fleet) List(ctx context.Context) ([]Member, error) {
	members, placements, err := f.read(ctx)
	if err != nil {
		return nil, err
	}
	placed := map[string]int64{}
	for _, p := range placements {
		placed[p.Executor] += p.Jobs
	}
	for i := range members {
		members[i].Placed = placed[members[i].ID]
	}
	return members, nil
}

// read reads the fleet and the unfinished jobs placed on each executor.
func (f *Fleet) read(ctx context.Context) ([]Member, []store.Placement, error) {
	recs, err := f.cfg.Store.ListExecutors(ctx)
	if err != nil {
		return nil, nil, err
	}
	placements, err := f.cfg.Store.Placements(ctx)
	if err != nil {
		return nil, nil, err
	}
	members := make([]Member, 0, len(recs))
	for _, rec := range recs {
		m, err := memberOf(rec)
		if err != nil {
			return nil, nil, err
		}
		members = append(members, m)
	}
	return members, placements, nil
}

// Get returns executor name and the ids of the jobs placed on it that have
// not ended (at most limit, oldest first).
func (f *Fleet) Get(ctx context.Context, name string, limit int) (Member, []string, error) {
	if name == "" {
		return Member{}, nil, fmt.Errorf("%w: name: required", errdefs.ErrInvalidArgument)
	}
	rec, err := f.cfg.Store.GetExecutor(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return Member{}, nil, notInFleet(name)
	}
	if err != nil {
		return Member{}, nil, err
	}
	m, err := memberOf(rec)
	if err != nil {
		return Member{}, nil, err
	}
	jobs, err := f.cfg.Store.JobsOnExecutor(ctx, m.ID, max(limit, 1))
	if err != nil {
		return Member{}, nil, err
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	if m.Placed, err = f.placedOn(ctx, m.ID); err != nil {
		return Member{}, nil, err
	}
	return m, ids, nil
}

// placedOn counts the unfinished jobs placed on executor id.
func (f *Fleet) placedOn(ctx context.Context, id string) (int64, error) {
	placements, err := f.cfg.Store.Placements(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range placements {
		if p.Executor == id {
			n += p.Jobs
		}
	}
	return n, nil
}

// Drain drains executor name (drain true: nothing new is placed on it) or
// ends its drain, on the audit log as by's, with reason.
func (f *Fleet) Drain(ctx context.Context, by identity.ID, name string, drain bool, reason string) (Member, error) {
	switch {
	case name == "":
		return Member{}, fmt.Errorf("%w: name: required", errdefs.ErrInvalidArgument)
	case len(reason) > maxReason:
		return Member{}, fmt.Errorf("%w: reason: %d bytes, at most %d", errdefs.ErrInvalidArgument, len(reason), maxReason)
	}
	now := f.now()
	rec, err := f.cfg.Store.UpdateExecutorAudited(ctx, name, func(e *store.Executor, found bool) (*audit.Event, error) {
		if !found {
			return nil, notInFleet(name)
		}
		if e.Draining == drain {
			return nil, errUnchanged // already so: nothing to record
		}
		kind := audit.KindExecutorUndrained
		if drain {
			kind = audit.KindExecutorDrained
			e.Draining, e.DrainedBy, e.DrainedAt, e.DrainReason = true, by.String(), now, reason
		} else {
			e.Draining, e.DrainedBy, e.DrainedAt, e.DrainReason = false, "", time.Time{}, ""
		}
		return &audit.Event{Kind: kind, Caller: by.String(), Subject: name, Outcome: audit.OutcomeAllowed, Reason: reason}, nil
	})
	switch {
	case errors.Is(err, errUnchanged):
		if rec, err = f.cfg.Store.GetExecutor(ctx, name); err != nil {
			return Member{}, err
		}
	case err != nil:
		return Member{}, err
	default:
		f.forget()
		f.cfg.Logger.Info("executor drain", "executor", name, "draining", drain, "by", by.String(), "reason", reason)
	}
	m, err := memberOf(rec)
	if err != nil {
		return Member{}, err
	}
	if m.Placed, err = f.placedOn(ctx, m.ID); err != nil {
		return Member{}, err
	}
	return m, nil
}

// Sweep marks lost every executor whose last heartbeat is older than
// LostAfter, on the audit log (each once, whichever replica sweeps first),
// and returns every lost executor: the caller ends or moves their work.
func (f *Fleet) Sweep(ctx context.Context, by identity.ID) ([]Member, error) {
	recs, err := f.cfg.Store.ListExecutors(ctx)
	if err != nil {
		return nil, err
	}
	cutoff := f.now().Add(-f.cfg.LostAfter)
	var lost []Member
	for _, rec := range recs {
		if rec.State == store.ExecutorUp && rec.LastSeen.Before(cutoff) {
			rec, err = f.cfg.Store.UpdateExecutorAudited(ctx, rec.Name, func(e *store.Executor, found bool) (*audit.Event, error) {
				if !found || e.State != store.ExecutorUp || !e.LastSeen.Before(cutoff) {
					return nil, errUnchanged // it came back meanwhile, or another replica swept it
				}
				e.State = store.ExecutorLost
				return &audit.Event{Kind: audit.KindExecutorLost, Caller: by.String(), Subject: e.Name, Outcome: audit.OutcomeAllowed,
					Reason: fmt.Sprintf("no heartbeat from executor %s since %s (more than %v)", e.Name, e.LastSeen.Format(time.RFC3339), f.cfg.LostAfter)}, nil
			})
			switch {
			case errors.Is(err, errUnchanged):
				if rec, err = f.cfg.Store.GetExecutor(ctx, rec.Name); err != nil {
					return nil, err
				}
			case err != nil:
				return nil, err
			default:
				f.cfg.Logger.Warn("executor lost", "executor", rec.Name, "last_seen", rec.LastSeen)
				f.forget()
			}
		}
		if rec.State == store.ExecutorLost {
			m, err := memberOf(rec)
			if err != nil {
				return nil, err
			}
			lost = append(lost, m)
		}
	}
	return lost, nil
}

var errUnchanged = errors.New("unchanged")

// notInFleet is the error for an executor name the fleet does not know.
func notInFleet(name string) error {
	return fmt.Errorf("%w: no executor %q in the fleet", errdefs.ErrNotFound, name)
}

// memberOf reads a stored executor.
func memberOf(e store.Executor) (Member, error) {
	m := Member{Name: e.Name, ID: e.ID, Address: e.Address, Lost: e.State == store.ExecutorLost,
		Draining: e.Draining, DrainedBy: e.DrainedBy, DrainedAt: e.DrainedAt, DrainReason: e.DrainReason,
		JoinedAt: e.JoinedAt, LastSeen: e.LastSeen}
	if len(e.Report) > 0 {
		if err := json.Unmarshal(e.Report, &m.Report); err != nil {
			return Member{}, fmt.Errorf("fleet: the stored report of executor %s: %w", e.Name, err)
		}
	}
	return m, nil
}
