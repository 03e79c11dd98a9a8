package publish

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
)

// meterName is the instrumentation scope of the publish metrics.
const meterName = "github.com/airlockhq/airlock/services/publisher/internal/publish"

// How one run of a deployment ended (attribute outcome): the only
// attribute, so the series stay four whatever the repositories.
const (
	runSucceeded   = "succeeded"   // the commit is on the branch, the leases ended
	runRefused     = "refused"     // a check refused it: the deployment failed
	runPaused      = "paused"      // a peer, the remote or the host failed: retried later
	runInterrupted = "interrupted" // the publisher stopped or lost its claim: resumed later
)

// runBuckets are the bounds, in seconds, of one run: a fetch, a scan, a
// commit and a push.
var runBuckets = []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300}

// metrics are the publish service's instruments.
type metrics struct {
	runs     metric.Int64Counter
	duration metric.Float64Histogram
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	set := instruments.New(mp, meterName)
	x := metrics{
		runs: set.Counter("airlock.publisher.runs", "{run}",
			"Runs of deployments (a first attempt, a retry or a resume), by how they ended."),
		duration: set.Histogram("airlock.publisher.run.duration", "s",
			"How long one run of a deployment took, from its last recorded step to how it ended.", runBuckets...),
	}
	if err := set.Err(); err != nil {
		return nil, err
	}
	return &x, nil
}

// ran counts one run that began at began and ended with outcome.
func (x *metrics) ran(outcome string, began time.Time) {
	attrs := metric.WithAttributes(attribute.String("outcome", outcome))
	x.runs.Add(context.Background(), 1, attrs)
	x.duration.Record(context.Background(), time.Since(began).Seconds(), attrs)
}
