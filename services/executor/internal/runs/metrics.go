package runs

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// meterName is the instrumentation scope of the executor's own metrics.
const meterName = "github.com/airlockhq/airlock/services/executor/internal/runs"

// Every attribute has a fixed set of values: a job id, a tenant or a
// repository is never one, so the series stay few whatever the load.
const (
	attrClass  = attribute.Key("runtime_class") // runc, runsc
	attrKind   = attribute.Key("kind")          // job, session
	attrReason = attribute.Key("reason")        // a sandbox.Reason of the list below
	attrState  = attribute.Key("state")         // staging, running, suspended
	attrCause  = attribute.Key("cause")         // why a start was refused
	attrResult = attribute.Key("outcome")       // ok, error
)

// reasons are the ending reasons a run can have; anything else (there is
// nothing else today) is counted as "other" rather than grow the series.
var reasons = map[sandbox.Reason]bool{
	sandbox.ReasonExited: true, sandbox.ReasonTimeout: true, sandbox.ReasonOOM: true,
	sandbox.ReasonDiskFull: true, sandbox.ReasonCancelled: true, sandbox.ReasonSandboxError: true,
	ReasonFinished: true, ReasonIdleTimeout: true, ReasonExecutorRestarted: true,
}

// Refusal causes of a start (attribute cause).
const (
	refusedCapacity    = "capacity"    // the executor's capacity is in use (or too small)
	refusedUnavailable = "unavailable" // the runtime class cannot run here
	refusedOther       = "other"       // a grant this executor cannot take
)

// jobBuckets are the bounds, in seconds, of a run's duration: seconds to
// hours.
var jobBuckets = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800}

// createBuckets are the bounds, in seconds, of making a sandbox.
var createBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}

// claimBuckets are the bounds, in seconds, of a claim of a pooled sandbox.
var claimBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// metrics are the run manager's instruments.
type metrics struct {
	started, ended, refused, execs metric.Int64Counter
	duration, create               metric.Float64Histogram
	// The warm pool's (warm.go).
	poolClaims, discarded metric.Int64Counter
	refill, claim         metric.Float64Histogram
	// observed unregisters the callback of the gauges.
	observed metric.Registration
}

// newMetrics makes the instruments on mp (nil: the global provider) and
// the callback that reads the gauges from m.
func newMetrics(mp metric.MeterProvider, m *Manager) (*metrics, error) {
	set := instruments.New(mp, meterName)
	x := metrics{
		started: set.Counter("airlock.executor.jobs.started", "{job}",
			"Runs accepted: jobs and sessions this executor took a grant for and began to stage."),
		ended:   set.Counter("airlock.executor.jobs.ended", "{job}", "Runs ended, by why they ended."),
		refused: set.Counter("airlock.executor.jobs.refused", "{job}", "Starts refused, by cause."),
		execs:   set.Counter("airlock.executor.execs.started", "{exec}", "Execs started in sessions."),
		duration: set.Histogram("airlock.executor.job.duration", "s",
			"How long a run lasted, from its acceptance to its end.", jobBuckets...),
		create: set.Histogram("airlock.executor.sandbox.create.duration", "s",
			"How long making a run's sandbox took (the runtime's create, mounts and cgroup).", createBuckets...),
		poolClaims: set.Counter("airlock.executor.pool.claims", "{session}",
			"Runs (jobs and sessions) given a pooled sandbox (outcome hit) or not (outcome miss, by cause)."),
		discarded: set.Counter("airlock.executor.pool.discarded", "{sandbox}", "Pooled sandboxes discarded unclaimed, by cause."),
		refill: set.Histogram("airlock.executor.pool.refill.duration", "s",
			"How long making a pooled sandbox took (its namespace, scratch, cgroup, runtime and exec helper).", createBuckets...),
		claim: set.Histogram("airlock.executor.sandbox.claim.duration", "s",
			"How long a run's claim of a pooled sandbox took (its /work mounted in, limits and policy in force).", claimBuckets...),
	}
	active := set.IntGauge("airlock.executor.jobs.active", "{job}", "Runs not yet ended, by state.")
	ready := set.IntGauge("airlock.executor.pool.ready", "{sandbox}", "Pooled sandboxes ready for a claim.")
	type pair struct{ reserved, limit metric.Float64ObservableGauge }
	gauge := func(name, unit, what string) pair {
		return pair{
			reserved: set.FloatGauge("airlock.executor.capacity."+name+".reserved", unit,
				what+" the limits of the runs not yet ended add up to, as admission counts them."),
			limit: set.FloatGauge("airlock.executor.capacity."+name+".limit", unit,
				what+" this executor admits in all (capacity in its config); absent when unbounded."),
		}
	}
	memory, cpu, disk, jobs := gauge("memory", "By", "Memory"), gauge("cpu", "{cpu}", "CPUs"), gauge("disk", "By", "Disk"), gauge("jobs", "{job}", "Runs")
	c := m.cfg.Capacity
	x.observed = set.Observe(func(_ context.Context, o metric.Observer) error {
		m.mu.Lock()
		h := m.held(nil)
		counts := map[[2]string]int64{}
		for _, e := range m.runs {
			if e.run.State.Terminal() {
				continue
			}
			state := string(e.run.State)
			if e.run.Suspended {
				state = "suspended"
			}
			counts[[2]string{state, classOf(e.run.Grant.Class).Value.AsString()}]++
		}
		m.mu.Unlock()
		// Every state of every class, 0 included, so a rate or an alert
		// has a series from the start.
		for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc, sandbox.ClassVM} {
			for _, state := range []string{string(Staging), string(Running), "suspended"} {
				o.ObserveInt64(active, counts[[2]string{state, string(class)}],
					metric.WithAttributes(attrState.String(state), attrClass.String(string(class))))
			}
		}
		observe := func(p pair, held, bound float64) {
			o.ObserveFloat64(p.reserved, held)
			if bound > 0 {
				o.ObserveFloat64(p.limit, bound)
			}
		}
		observe(memory, float64(h.memory), float64(c.MemoryBytes))
		observe(cpu, float64(h.cpu)/1000, float64(c.CPUMillis)/1000)
		observe(disk, float64(h.disk), float64(c.DiskBytes))
		observe(jobs, float64(h.jobs), float64(c.Jobs))
		if m.pool != nil {
			n := 0
			for _, s := range m.pool.Status() {
				n += s.Ready
			}
			o.ObserveInt64(ready, int64(n))
		}
		return nil
	}, active, ready, memory.reserved, memory.limit, cpu.reserved, cpu.limit, disk.reserved, disk.limit, jobs.reserved, jobs.limit)
	if err := set.Err(); err != nil {
		return nil, err
	}
	return &x, nil
}

func kindOf(g Grant) string {
	if g.Session != nil {
		return "session"
	}
	return "job"
}

// runStarted counts a run accepted.
func (x *metrics) runStarted(g Grant) {
	x.started.Add(context.Background(), 1, metric.WithAttributes(classOf(g.Class), attrKind.String(kindOf(g))))
}

// runRefused counts a start refused for cause.
func (x *metrics) runRefused(cause string) {
	x.refused.Add(context.Background(), 1, metric.WithAttributes(attrCause.String(cause)))
}

// classOf is c as an attribute value: a class this executor knows, or
// "other" (a record of a class since dropped).
func classOf(c sandbox.Class) attribute.KeyValue {
	if c != sandbox.ClassRunc && c != sandbox.ClassRunsc && c != sandbox.ClassVM {
		c = "other"
	}
	return attrClass.String(string(c))
}

// runEnded counts r, which has just ended, and records how long it took.
func (x *metrics) runEnded(r Run) {
	reason := sandbox.Reason("other")
	if r.Result != nil && reasons[r.Result.Reason] {
		reason = r.Result.Reason
	}
	class, kind := classOf(r.Grant.Class), attrKind.String(kindOf(r.Grant))
	ctx := context.Background()
	x.ended.Add(ctx, 1, metric.WithAttributes(class, kind, attrReason.String(string(reason))))
	if !r.CreatedAt.IsZero() && !r.FinishedAt.IsZero() {
		x.duration.Record(ctx, r.FinishedAt.Sub(r.CreatedAt).Seconds(), metric.WithAttributes(class, kind))
	}
}

// sandboxMade records how long making a sandbox of class took.
func (x *metrics) sandboxMade(class sandbox.Class, took time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	x.create.Record(context.Background(), took.Seconds(), metric.WithAttributes(classOf(class), attrResult.String(outcome)))
}

// poolClaimed counts a run's claim of a pooled sandbox (hit) or why it
// made its own (cause), and how long a hit's claim took.
func (x *metrics) poolClaimed(hit bool, cause string, took time.Duration) {
	ctx := context.Background()
	if hit {
		x.poolClaims.Add(ctx, 1, metric.WithAttributes(attrResult.String("hit")))
		x.claim.Record(ctx, took.Seconds())
		return
	}
	x.poolClaims.Add(ctx, 1, metric.WithAttributes(attrResult.String("miss"), attrCause.String(cause)))
}

// poolRefilled records how long making a pooled sandbox of class took.
func (x *metrics) poolRefilled(class sandbox.Class, took time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	x.refill.Record(context.Background(), took.Seconds(), metric.WithAttributes(classOf(class), attrResult.String(outcome)))
}

// poolDiscarded counts a pooled sandbox discarded unclaimed, for cause.
func (x *metrics) poolDiscarded(cause string) {
	x.discarded.Add(context.Background(), 1, metric.WithAttributes(attrCause.String(cause)))
}

// execStarted counts an exec started in a session.
func (x *metrics) execStarted() { x.execs.Add(context.Background(), 1) }
