// Package telemetry owns OpenTelemetry set-up for Airlock processes: one
// tracer provider, one meter provider and the W3C propagators, installed
// globally so the otelgrpc stats handlers on servers and clients put every
// hop of a call on one trace, and the optional Prometheus /metrics endpoint
// that reads the same meter provider. Composition roots call Setup once;
// nothing else installs providers.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Config says where telemetry goes. With no endpoint, spans and metrics are
// still created (so trace context propagates and logs carry trace ids) but
// nothing is exported.
type Config struct {
	// OTLPEndpoint is host:port of an OTLP/gRPC collector, e.g. "127.0.0.1:4317".
	OTLPEndpoint string
	// Insecure sends OTLP without TLS, for a collector on loopback.
	Insecure bool
	// SampleRatio is the fraction of new traces recorded, 0..1; 0 means 1.
	SampleRatio float64
	// Prometheus adds a reader that Providers.Metrics serves in the
	// Prometheus text format.
	Prometheus bool
}

// Providers are what Setup installed.
type Providers struct {
	Tracer *sdktrace.TracerProvider
	Meter  *sdkmetric.MeterProvider
	// Metrics serves the meter provider's metrics, with the Go runtime's
	// and the process's, in the Prometheus format; nil unless
	// Config.Prometheus.
	Metrics http.Handler
}

// Shutdown flushes and stops both providers.
func (p *Providers) Shutdown(ctx context.Context) error {
	return errors.Join(p.Tracer.Shutdown(ctx), p.Meter.Shutdown(ctx))
}

// Setup builds the providers for service (e.g. "airlock-authority"), installs
// them as the global ones, and returns them for shutdown.
func Setup(ctx context.Context, service, version string, cfg Config) (*Providers, error) {
	if cfg.SampleRatio < 0 || cfg.SampleRatio > 1 {
		return nil, fmt.Errorf("telemetry: sample_ratio %v: must be between 0 and 1", cfg.SampleRatio)
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(service), semconv.ServiceVersion(version)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	ratio := cfg.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	topts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	if cfg.OTLPEndpoint != "" {
		texp, err := otlptracegrpc.New(ctx, traceOptions(cfg)...)
		if err != nil {
			return nil, fmt.Errorf("telemetry: otlp trace exporter for %s: %w", cfg.OTLPEndpoint, err)
		}
		mexp, err := otlpmetricgrpc.New(ctx, metricOptions(cfg)...)
		if err != nil {
			return nil, fmt.Errorf("telemetry: otlp metric exporter for %s: %w", cfg.OTLPEndpoint, err)
		}
		topts = append(topts, sdktrace.WithBatcher(texp))
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(15*time.Second))))
	}
	var metrics http.Handler
	if cfg.Prometheus {
		reader, handler, err := prometheusReader()
		if err != nil {
			return nil, err
		}
		mopts = append(mopts, sdkmetric.WithReader(reader))
		metrics = handler
	}
	p := &Providers{Tracer: sdktrace.NewTracerProvider(topts...), Meter: sdkmetric.NewMeterProvider(mopts...), Metrics: metrics}
	otel.SetTracerProvider(p.Tracer)
	otel.SetMeterProvider(p.Meter)
	otel.SetTextMapPropagator(Propagator())
	return p, nil
}

// Propagator is the one propagator Airlock uses on every hop.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

func traceOptions(cfg Config) []otlptracegrpc.Option {
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint)}
	if cfg.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	return opts
}

func metricOptions(cfg Config) []otlpmetricgrpc.Option {
	opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(cfg.OTLPEndpoint)}
	if cfg.Insecure {
		opts = append(opts, otlpmetricgrpc.WithInsecure())
	}
	return opts
}
