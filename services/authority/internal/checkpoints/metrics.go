package checkpoints

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
)

// meterName is the instrumentation scope of the audit log metrics.
const meterName = "github.com/airlockhq/airlock/services/authority/internal/checkpoints"

// seen is what the metrics show, kept apart from s.mu so that a scrape
// never waits for a tick reading the log.
type seen struct {
	head   atomic.Int64 // the log's head sequence at the last tick; 0 before the first
	signed atomic.Int64 // the sequence of the last checkpoint
	halted atomic.Bool  // the log disagrees with what was signed
}

// observe registers the audit log gauges on mp (nil: the global
// provider).
func (s *Service) observe(mp metric.MeterProvider) (metric.Registration, error) {
	set := instruments.New(mp, meterName)
	entries := set.ObservedCounter("airlock.authority.audit.entries", "{entry}",
		"Entries in the audit log: its head sequence, read every second by the checkpointer.")
	signed := set.IntGauge("airlock.authority.audit.checkpoint.sequence", "{entry}",
		"The sequence of the last signed audit checkpoint.")
	halted := set.IntGauge("airlock.authority.audit.halted", "",
		"1 when the audit log disagrees with a signed checkpoint (AUDIT LOG TAMPERED) and no checkpoint is signed any more; else 0.")
	reg := set.Observe(func(_ context.Context, o metric.Observer) error {
		if head := s.seen.head.Load(); head > 0 {
			o.ObserveInt64(entries, head)
		}
		o.ObserveInt64(signed, s.seen.signed.Load())
		h := int64(0)
		if s.seen.halted.Load() {
			h = 1
		}
		o.ObserveInt64(halted, h)
		return nil
	}, entries, signed, halted)
	return reg, set.Err()
}
