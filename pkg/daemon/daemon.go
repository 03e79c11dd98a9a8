// Package daemon owns the life of an Airlock service process, the part the
// three services share: telemetry (and its optional /metrics endpoint), the
// locked data directory, the reloading TLS source, the gRPC server with its
// chain and health, readiness, and
// shutdown where the first task to fail cancels the rest. Each service's
// internal/server builds its domain inside Start and calls Run; nothing
// else starts a server.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/datadir"
	"github.com/airlockhq/airlock/pkg/grpcserver"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/telemetry"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// Spec describes one service process.
type Spec struct {
	// Name is the service name: authority, executor or publisher.
	Name string
	// Version is the build version, reported in telemetry.
	Version string
	// Config is the validated common config.
	Config config.Server
	// Table is the service's authorization table.
	Table authz.Table
	// OnDeny, if set, is told about every call the table refuses.
	OnDeny authz.DenyHook
	// Logger is the process logger.
	Logger *slog.Logger
	// Start builds the service's domain and registers its API on env.Server.
	// It runs before the server reports SERVING. Cleanups it registers with
	// env.OnStop run after the server has stopped, in reverse order. ctx
	// ends when the service is asked to stop: a Start that returns its
	// error (context.Canceled) then is a stop, and Run returns nil.
	Start func(ctx context.Context, env *Env) error
}

// Env is what Start gets.
type Env struct {
	// Server is where the API registers.
	Server grpc.ServiceRegistrar
	// DataDir is the locked data directory.
	DataDir *datadir.Dir
	// TLS is this process's identity, for dialing peers.
	TLS *tlsconfig.Source
	// TrustDomain is the SPIFFE trust domain.
	TrustDomain string
	// Logger is the process logger.
	Logger *slog.Logger
	// Meter is the process's meter provider (the one Setup installed
	// globally), for the domain's own metrics.
	Meter metric.MeterProvider

	// SetComponent reports a named component's health (see grpcserver).
	SetComponent func(name string, serving bool)

	group *errgroup.Group
	ctx   context.Context
	stops []func() error
}

// Go runs task for the life of the process; if it returns an error the
// whole process shuts down with it.
func (e *Env) Go(task func(ctx context.Context) error) {
	e.group.Go(func() error { return task(e.ctx) })
}

// OnStop registers a cleanup to run after the server has stopped.
func (e *Env) OnStop(f func() error) { e.stops = append(e.stops, f) }

// PeerID returns the SPIFFE ID of the named Airlock service in this trust domain.
func (e *Env) PeerID(service string) identity.ID { return identity.Service(e.TrustDomain, service) }

// Run runs the service until ctx is cancelled or a task fails. It returns
// nil after a clean shutdown. Its errors do not name the service: Main puts
// the name before them.
func Run(ctx context.Context, spec Spec) (err error) {
	cfg, log := spec.Config, spec.Logger
	providers, err := telemetry.Setup(ctx, "airlock-"+spec.Name, spec.Version, telemetry.Config{
		OTLPEndpoint: cfg.Telemetry.OTLPEndpoint, Insecure: cfg.Telemetry.Insecure, SampleRatio: cfg.Telemetry.SampleRatio,
		Prometheus: cfg.Telemetry.PrometheusListen != "",
	})
	if err != nil {
		return err
	}
	defer func() {
		// A fresh context: the run's own is already cancelled here.
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		if serr := providers.Shutdown(sctx); serr != nil {
			log.Warn("telemetry shutdown", "error", serr)
		}
	}()

	dir, err := datadir.Open(cfg.DataDir)
	if err != nil {
		return err
	}
	defer dir.Close()

	src, self, err := cfg.LoadTLS(spec.Name, tlsconfig.WithLogger(log))
	if err != nil {
		return err
	}

	var metrics *telemetry.MetricsServer
	if addr := cfg.Telemetry.PrometheusListen; addr != "" {
		metrics, err = telemetry.ListenMetrics(addr, providers.Metrics)
		if err != nil {
			return config.Field("telemetry.prometheus_listen", "%v", err)
		}
		// Released here if the start fails before Serve; Serve closes it
		// on a clean stop.
		defer metrics.Close()
	}

	srv, err := grpcserver.New(grpcserver.Config{
		Listen:          cfg.Listen,
		TLS:             tlsconfig.ServerConfig(src, cfg.TrustDomain),
		Authorizer:      authz.New(spec.Table, log, spec.OnDeny),
		Logger:          log,
		Reflection:      cfg.Reflection,
		ShutdownTimeout: cfg.ShutdownTimeout,
	})
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	env := &Env{Server: srv.Registrar(), DataDir: dir, TLS: src, TrustDomain: cfg.TrustDomain, Logger: log,
		Meter: providers.Meter, SetComponent: srv.SetComponent, group: g, ctx: gctx}
	defer func() {
		for i := len(env.stops) - 1; i >= 0; i-- {
			err = errors.Join(err, env.stops[i]())
		}
	}()
	if spec.Start != nil {
		if err := spec.Start(gctx, env); err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				// Asked to stop while starting (an executor's recovery on
				// a host busy with IO): a stop, not a failure, once the
				// tasks Start began have ended, before the cleanups run.
				if werr := g.Wait(); werr != nil && !errors.Is(werr, context.Canceled) {
					return fmt.Errorf("stopped while starting: %w", werr)
				}
				log.Info("stopped while starting", "error", err)
				return nil
			}
			return fmt.Errorf("start: %w", err)
		}
	}
	g.Go(func() error { return srv.Serve(gctx) })
	if metrics != nil {
		g.Go(func() error { return metrics.Serve(gctx) })
		log.Info("serving metrics", "address", metrics.Addr().String(), "path", telemetry.MetricsPath)
	}
	srv.SetServing(true)
	log.Info("serving", "address", srv.Addr().String(), "identity", self.String(), "data_dir", dir.Path(), "reflection", cfg.Reflection)
	err = g.Wait()
	// The cleanups run before the last line, so "stopped" is the last
	// thing the service logs (the authority's last audit checkpoint is
	// one of them).
	for i := len(env.stops) - 1; i >= 0; i-- {
		err = errors.Join(err, env.stops[i]())
	}
	env.stops = nil
	log.Info("stopped", "error", err)
	return err
}
