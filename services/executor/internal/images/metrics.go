package images

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
)

const meterName = "github.com/airlockhq/airlock/services/executor/internal/images"

// metrics are the cache's instruments.
type metrics struct {
	pulls, pulledBytes, hits, evictions metric.Int64Counter
	observed                            metric.Registration
}

func newMetrics(mp metric.MeterProvider, s *Store) (*metrics, error) {
	set := instruments.New(mp, meterName)
	m := &metrics{
		pulls:       set.Counter("airlock.executor.images.pulls", "{blob}", "Image blobs (manifests, configs, layers) pulled through the authority."),
		pulledBytes: set.Counter("airlock.executor.images.pulled", "By", "Bytes of image blobs pulled through the authority."),
		hits:        set.Counter("airlock.executor.images.hits", "{layer}", "Layers a job found already in the image cache."),
		evictions:   set.Counter("airlock.executor.images.evictions", "{layer}", "Layers evicted from the image cache to keep it within its bound."),
	}
	size := set.IntGauge("airlock.executor.images.cache.size", "By", "Bytes the image cache holds (unpacked layers).")
	bound := set.IntGauge("airlock.executor.images.cache.limit", "By", "The image cache's bound.")
	m.observed = set.Observe(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		o.ObserveInt64(size, st.Size)
		o.ObserveInt64(bound, st.MaxSize)
		return nil
	}, size, bound)
	if err := set.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) counted(pulls, bytes, hits int64) {
	ctx := context.Background()
	if pulls > 0 {
		m.pulls.Add(ctx, pulls)
		m.pulledBytes.Add(ctx, bytes)
	}
	if hits > 0 {
		m.hits.Add(ctx, hits)
	}
}

func (m *metrics) evicted() { m.evictions.Add(context.Background(), 1) }
