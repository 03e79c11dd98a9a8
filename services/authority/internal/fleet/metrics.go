package fleet

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
)

// meterName is the instrumentation scope of the fleet metrics.
const meterName = "github.com/airlockhq/airlock/services/authority/internal/fleet"

// observe registers the fleet's gauges on mp (nil: the global provider):
// executors by state, and their capacity free and in all.
func (f *Fleet) observe(mp metric.MeterProvider) (metric.Registration, error) {
	set := instruments.New(mp, meterName)
	executors := set.IntGauge("airlock.authority.fleet.executors", "{executor}",
		"Executors of the fleet by state: up, lost, draining (an up executor that is drained counts as draining).")
	slots := set.IntGauge("airlock.authority.fleet.job_slots", "{job}",
		"Job slots of the executors that are up, as they last reported: free and total.")
	memory := set.IntGauge("airlock.authority.fleet.memory", "By",
		"Memory of the executors that are up, as they last reported: free and total.")
	reg := set.Observe(func(ctx context.Context, o metric.Observer) error {
		members, err := f.snapshot(ctx)
		if err != nil {
			return err
		}
		count := map[string]int64{"up": 0, "lost": 0, "draining": 0}
		var free, total, memFree, memTotal int64
		for _, m := range members {
			switch {
			case m.Lost:
				count["lost"]++
				continue
			case m.Draining:
				count["draining"]++
			default:
				count["up"]++
			}
			c := m.Report.Capacity
			free, total, memFree, memTotal = free+c.JobsFree, total+c.Jobs, memFree+c.MemoryFree, memTotal+c.MemoryBytes
		}
		for state, n := range count {
			o.ObserveInt64(executors, n, metric.WithAttributes(attribute.String("state", state)))
		}
		o.ObserveInt64(slots, free, metric.WithAttributes(attribute.String("kind", "free")))
		o.ObserveInt64(slots, total, metric.WithAttributes(attribute.String("kind", "total")))
		o.ObserveInt64(memory, memFree, metric.WithAttributes(attribute.String("kind", "free")))
		o.ObserveInt64(memory, memTotal, metric.WithAttributes(attribute.String("kind", "total")))
		return nil
	}, executors, slots, memory)
	return reg, set.Err()
}
