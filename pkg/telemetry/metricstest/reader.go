package metricstest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Reader is an in-process meter provider for a package's tests: the
// domain under test records on Provider (its Config's meter provider),
// and the test reads what it recorded with Collect, by OpenTelemetry
// name, with no exporter in between.
type Reader struct {
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// NewReader returns a Reader, shut down when the test ends.
func NewReader(t testing.TB) *Reader {
	t.Helper()
	r := sdkmetric.NewManualReader()
	p := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return &Reader{Provider: p, reader: r}
}

// Recorded is one collection: every instrument's data, by name.
type Recorded map[string]metricdata.Aggregation

// Collect reads everything recorded so far (observable instruments are
// observed now), failing the test on an error.
func (r *Reader) Collect(t testing.TB) Recorded {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect metrics: %v", err)
	}
	out := Recorded{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// Value is the value of the counter, up-down counter or gauge name at the
// attributes want (the point's whole set: a point with more attributes
// than want is not it), and whether there is such a point.
func (r Recorded) Value(name string, want map[string]string) (float64, bool) {
	switch d := r[name].(type) {
	case metricdata.Sum[int64]:
		return value(d.DataPoints, want)
	case metricdata.Sum[float64]:
		return value(d.DataPoints, want)
	case metricdata.Gauge[int64]:
		return value(d.DataPoints, want)
	case metricdata.Gauge[float64]:
		return value(d.DataPoints, want)
	}
	return 0, false
}

func value[N int64 | float64](points []metricdata.DataPoint[N], want map[string]string) (float64, bool) {
	for _, p := range points {
		if sameAttrs(p.Attributes, want) {
			return float64(p.Value), true
		}
	}
	return 0, false
}

// Histogram is the count and sum of the histogram name at the attributes
// want (the whole set), and whether there is such a point.
func (r Recorded) Histogram(name string, want map[string]string) (count uint64, sum float64, ok bool) {
	d, isHist := r[name].(metricdata.Histogram[float64])
	if !isHist {
		return 0, 0, false
	}
	for _, p := range d.DataPoints {
		if sameAttrs(p.Attributes, want) {
			return p.Count, p.Sum, true
		}
	}
	return 0, 0, false
}

// Points lists name's points as attribute sets with their values (count
// for a histogram), for a failure's message.
func (r Recorded) Points(name string) string {
	var lines []string
	add := func(s attribute.Set, v any) {
		lines = append(lines, fmt.Sprintf("%s %v", s.Encoded(attribute.DefaultEncoder()), v))
	}
	switch d := r[name].(type) {
	case metricdata.Sum[int64]:
		eachPoint(d.DataPoints, add)
	case metricdata.Sum[float64]:
		eachPoint(d.DataPoints, add)
	case metricdata.Gauge[int64]:
		eachPoint(d.DataPoints, add)
	case metricdata.Gauge[float64]:
		eachPoint(d.DataPoints, add)
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, fmt.Sprintf("count=%d sum=%g", p.Count, p.Sum))
		}
	case nil:
		return name + ": nothing recorded"
	}
	sort.Strings(lines)
	return name + ":\n  " + strings.Join(lines, "\n  ")
}

func eachPoint[N int64 | float64](points []metricdata.DataPoint[N], f func(attribute.Set, any)) {
	for _, p := range points {
		f(p.Attributes, p.Value)
	}
}

func sameAttrs(s attribute.Set, want map[string]string) bool {
	if s.Len() != len(want) {
		return false
	}
	for k, v := range want {
		got, ok := s.Value(attribute.Key(k))
		if !ok || got.Emit() != v {
			return false
		}
	}
	return true
}
