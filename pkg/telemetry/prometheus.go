package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// MetricsPath is where the metrics server answers.
const MetricsPath = "/metrics"

// Bounds of the metrics server. A scrape is one small GET; anything slower
// is a stuck or hostile client, not a scraper.
const (
	metricsReadHeaderTimeout = 5 * time.Second
	metricsReadTimeout       = 10 * time.Second
	metricsWriteTimeout      = 30 * time.Second
	metricsIdleTimeout       = 60 * time.Second
	metricsGatherTimeout     = 20 * time.Second
	metricsMaxInFlight       = 4
	metricsShutdownTimeout   = 5 * time.Second
)

// prometheusReader returns a meter-provider reader and the handler that
// serves what it reads. Both sit on a registry of their own, not the
// client library's global one, so nothing else in the process can add to
// (or collide with) what the endpoint shows.
func prometheusReader() (sdkmetric.Reader, http.Handler, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		// Pinned: the exporter's default is planned to change, and the
		// names are what dashboards and docs/metrics.md rely on.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, nil, fmt.Errorf("telemetry: go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, fmt.Errorf("telemetry: process collector: %w", err)
	}
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// Counts failed gathers as promhttp_metric_handler_errors_total.
		Registry:            reg,
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: metricsMaxInFlight,
		Timeout:             metricsGatherTimeout,
	})
	return exp, h, nil
}

// MetricsServer serves a metrics handler over plain HTTP at MetricsPath.
// It has no authentication: bind it to loopback or a private interface.
type MetricsServer struct {
	lis net.Listener
	srv *http.Server
}

// ListenMetrics binds addr (host:port; port 0 picks one, see Addr) for
// metrics. Serve it, or Close it if the process does not get that far.
func ListenMetrics(addr string, metrics http.Handler) (*MetricsServer, error) {
	if metrics == nil {
		return nil, errors.New("telemetry: no metrics handler (Config.Prometheus is off)")
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+MetricsPath, metrics)
	return &MetricsServer{lis: lis, srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: metricsReadHeaderTimeout,
		ReadTimeout:       metricsReadTimeout,
		WriteTimeout:      metricsWriteTimeout,
		IdleTimeout:       metricsIdleTimeout,
		MaxHeaderBytes:    16 << 10,
	}}, nil
}

// Addr is the address the server is bound to.
func (m *MetricsServer) Addr() net.Addr { return m.lis.Addr() }

// Serve serves until ctx is done, then shuts down, letting a scrape in
// progress finish for a few seconds. It returns an error only if serving
// failed before that.
func (m *MetricsServer) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- m.srv.Serve(m.lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server on %s: %w", m.lis.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
	defer cancel()
	if err := m.srv.Shutdown(sctx); err != nil {
		m.srv.Close()
	}
	<-errc
	return nil
}

// Close releases the listener of a server that is not serving.
func (m *MetricsServer) Close() error {
	if err := m.lis.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
