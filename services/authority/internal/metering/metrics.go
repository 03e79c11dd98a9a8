package metering

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// meterName is the instrumentation scope of the usage metrics.
const meterName = "github.com/airlockhq/airlock/services/authority/internal/metering"

// metrics are the usage counters, by tenant (a configured tenant: the
// values are the config's, a bounded list) and runtime class.
type metrics struct {
	vcpu, memory, disk metric.Float64Counter
	network, cost      metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	set := instruments.New(mp, meterName)
	m := metrics{
		vcpu:    set.FloatCounter("airlock.usage.vcpu_minutes", "{vcpu_minute}", "vCPU-minutes allocated while awake, of jobs and sessions that ended, by tenant and runtime class."),
		memory:  set.FloatCounter("airlock.usage.memory_gb_minutes", "{gb_minute}", "Memory GB-minutes (2^30 bytes) allocated while awake, of jobs and sessions that ended."),
		disk:    set.FloatCounter("airlock.usage.disk_gb_minutes", "{gb_minute}", "Disk GB-minutes allocated while retained (awake or asleep), of jobs and sessions that ended."),
		network: set.Counter("airlock.usage.network_bytes", "{byte}", "Network bytes of jobs and sessions that ended, by direction (sent, received)."),
		cost:    set.Counter("airlock.usage.cost_micros", "{micro_dollar}", "Cost at the operator's rates, in millionths of a US dollar, of jobs and sessions that ended."),
	}
	if err := set.Err(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Ended adds a job whose result was just recorded to the usage counters:
// once per job, the whole of its run.
func (s *Service) Ended(r store.UsageRecord) {
	j, err := s.cfg.Decode(r)
	if err != nil {
		s.cfg.Logger.Warn("metering: an ended job's record cannot be read; not counted", "job", r.ID, "error", err)
		return
	}
	if j.End.IsZero() {
		// Ended with its result: the store stamps the end with the state,
		// which may follow the result.
		j.End = s.cfg.Now().UTC()
	}
	u := Meter(j, j.Start, j.End.Add(time.Minute), j.End, s.cfg.Rates)
	ctx := context.Background()
	attrs := metric.WithAttributes(attribute.String("tenant", j.Tenant), attribute.String("runtime_class", j.Class))
	s.metrics.vcpu.Add(ctx, u.Alloc.VCPUMinutes(), attrs)
	s.metrics.memory.Add(ctx, u.Alloc.MemoryByteMinutes.GBMinutes(), attrs)
	s.metrics.disk.Add(ctx, u.Alloc.DiskByteMinutes.GBMinutes(), attrs)
	s.metrics.cost.Add(ctx, int64(u.Cost), attrs)
	for dir, n := range map[string]int64{"sent": u.NetSent, "received": u.NetReceived} {
		s.metrics.network.Add(ctx, n, metric.WithAttributes(attribute.String("tenant", j.Tenant), attribute.String("runtime_class", j.Class), attribute.String("direction", dir)))
	}
}
