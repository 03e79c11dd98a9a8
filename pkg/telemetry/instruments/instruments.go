// Package instruments makes a package's OpenTelemetry instruments on the
// meter provider it was given (the global one when none), keeping the
// first error, so a domain package declares its metrics in a few lines
// and checks one error. It imports only the OpenTelemetry API: domain
// packages of every service may import it (pkg/telemetry, which installs
// the providers, is for composition roots).
package instruments

import (
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// Set makes instruments on one meter.
type Set struct {
	meter metric.Meter
	errs  []error
}

// New returns a Set on mp's meter for scope (the recording package's
// import path); a nil mp is the global meter provider.
func New(mp metric.MeterProvider, scope string) *Set {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return &Set{meter: mp.Meter(scope)}
}

func (s *Set) keep(err error) {
	if err != nil {
		s.errs = append(s.errs, err)
	}
}

// Counter makes a monotonic counter.
func (s *Set) Counter(name, unit, description string) metric.Int64Counter {
	c, err := s.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(description))
	s.keep(err)
	return c
}

// FloatCounter makes a monotonic counter of fractional amounts.
func (s *Set) FloatCounter(name, unit, description string) metric.Float64Counter {
	c, err := s.meter.Float64Counter(name, metric.WithUnit(unit), metric.WithDescription(description))
	s.keep(err)
	return c
}

// Histogram makes a histogram with explicit bucket bounds.
func (s *Set) Histogram(name, unit, description string, bounds ...float64) metric.Float64Histogram {
	h, err := s.meter.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(description),
		metric.WithExplicitBucketBoundaries(bounds...))
	s.keep(err)
	return h
}

// IntGauge makes an integer gauge observed by a callback (Observe).
func (s *Set) IntGauge(name, unit, description string) metric.Int64ObservableGauge {
	g, err := s.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(description))
	s.keep(err)
	return g
}

// FloatGauge makes a float gauge observed by a callback (Observe).
func (s *Set) FloatGauge(name, unit, description string) metric.Float64ObservableGauge {
	g, err := s.meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(description))
	s.keep(err)
	return g
}

// ObservedCounter makes a counter whose running total a callback
// (Observe) reads from what it counts.
func (s *Set) ObservedCounter(name, unit, description string) metric.Int64ObservableCounter {
	c, err := s.meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(description))
	s.keep(err)
	return c
}

// Observe registers f to observe gauges at every collection; Unregister
// the result when what f reads goes away.
func (s *Set) Observe(f metric.Callback, gauges ...metric.Observable) metric.Registration {
	r, err := s.meter.RegisterCallback(f, gauges...)
	s.keep(err)
	return r
}

// Err is every error met making the instruments, nil if none.
func (s *Set) Err() error { return errors.Join(s.errs...) }
