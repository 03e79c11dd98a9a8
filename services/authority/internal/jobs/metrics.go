package jobs

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// meterName is the instrumentation scope of the job metrics.
const meterName = "github.com/airlockhq/airlock/services/authority/internal/jobs"

// Submission outcomes (attribute outcome). Every attribute has a fixed
// set of values: a tenant, a repository or a job id is never one.
const (
	submitAccepted = "accepted" // recorded and granted
	submitRepeated = "repeated" // a known idempotency key: the job recorded first
	submitRefused  = "refused"  // a policy decision (invalid, denied, key reused)
	submitFailed   = "failed"   // a failure: the store or the source
)

// metrics are the job service's instruments.
type metrics struct {
	submitted, ended metric.Int64Counter
	// placements counts placement decisions by outcome; place times them;
	// handover is the time from a job's submission to an executor
	// accepting it.
	placements      metric.Int64Counter
	place, handover metric.Float64Histogram
	observed        metric.Registration
}

// Placement outcomes (attribute outcome).
const (
	placePlaced = "placed" // an executor was chosen
	placeNone   = "none"   // no executor has room or runs the class: the job waits
	placeFailed = "failed" // the fleet could not be read
)

// newMetrics makes the instruments on mp (nil: the global provider) and
// the gauge of the jobs waiting at g.
func newMetrics(mp metric.MeterProvider, g *gate) (*metrics, error) {
	set := instruments.New(mp, meterName)
	x := metrics{
		submitted: set.Counter("airlock.authority.jobs.submitted", "{job}", "Job and session submissions, by outcome."),
		ended:     set.Counter("airlock.authority.jobs.ended", "{job}", "Jobs that reached an end state here, by that state."),
		placements: set.Counter("airlock.authority.jobs.placements", "{placement}",
			"Placement decisions on the executor fleet, by outcome (placed, none, failed)."),
		place: set.Histogram("airlock.authority.jobs.placement.duration", "s",
			"Time one placement decision takes (reading the fleet and choosing).", 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
		handover: set.Histogram("airlock.authority.jobs.handover.duration", "s",
			"Time from a job's submission to an executor accepting it: placement, waiting at the gate, and the StartJob.",
			0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
	}
	waiting := set.IntGauge("airlock.authority.jobs.waiting", "{job}",
		"Queued jobs waiting at the admission gate for their tenant's quota or the executor's capacity.")
	x.observed = set.Observe(func(_ context.Context, o metric.Observer) error {
		g.mu.Lock()
		n := len(g.waiting)
		g.mu.Unlock()
		o.ObserveInt64(waiting, int64(n))
		return nil
	}, waiting)
	if err := set.Err(); err != nil {
		return nil, err
	}
	return &x, nil
}

// submission counts one Submit.
func (x *metrics) submission(req SubmitRequest, created bool, err error) {
	outcome := submitAccepted
	switch {
	case err != nil && refusal(err):
		outcome = submitRefused
	case err != nil:
		outcome = submitFailed
	case !created:
		outcome = submitRepeated
	}
	kind := "job"
	if req.Spec.Session != nil {
		kind = "session"
	}
	x.submitted.Add(context.Background(), 1, metric.WithAttributes(attribute.String("outcome", outcome), attribute.String("kind", kind)))
}

// jobEnded counts a job that has just reached state, an end state.
func (x *metrics) jobEnded(state store.State) {
	x.ended.Add(context.Background(), 1, metric.WithAttributes(attribute.String("state", string(state))))
}

// placed records one placement decision that took d.
func (x *metrics) placed(outcome string, d time.Duration) {
	x.placements.Add(context.Background(), 1, metric.WithAttributes(attribute.String("outcome", outcome)))
	x.place.Record(context.Background(), d.Seconds())
}
