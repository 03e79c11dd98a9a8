// Package grpcserver owns the one way an Airlock service serves gRPC: mTLS
// credentials only, the interceptor chain (otelgrpc stats handler, slog
// logging, SPIFFE authorization, panic recovery innermost), the standard
// health service, an opt-in reflection switch, and graceful shutdown under a
// deadline. Service composition roots import it; handlers never see it.
package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/identity"
)

// Config is what a server needs. TLS and Authorizer are required: there is
// no way to build a plaintext or unauthorized Airlock server.
type Config struct {
	// Listen is host:port; port 0 picks a free port (see Addr).
	Listen string
	// TLS must require and verify client certificates (pkg/tlsconfig.ServerConfig).
	TLS *tls.Config
	// Authorizer enforces the service's table on every RPC.
	Authorizer *authz.Authorizer
	// Logger receives one line per RPC and every denial.
	Logger *slog.Logger
	// Reflection registers the gRPC reflection service (still behind mTLS).
	Reflection bool
	// ShutdownTimeout bounds graceful stop before in-flight RPCs are cut; 0 means 10s.
	ShutdownTimeout time.Duration
}

// Server is a listening gRPC server with its health service.
type Server struct {
	cfg    Config
	lis    net.Listener
	grpc   *grpc.Server
	health *health.Server
}

// New listens on cfg.Listen and builds the server. Register services on it,
// then call Serve.
func New(cfg Config) (*Server, error) {
	if cfg.TLS == nil {
		return nil, errors.New("grpcserver: TLS config is required; Airlock serves nothing in plaintext")
	}
	if cfg.TLS.ClientAuth != tls.RequireAnyClientCert && cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert {
		return nil, errors.New("grpcserver: TLS config must require client certificates")
	}
	if cfg.Authorizer == nil {
		return nil, errors.New("grpcserver: an authorizer is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("grpcserver: listen on %s: %w", cfg.Listen, err)
	}
	s := &Server{cfg: cfg, lis: lis, health: health.NewServer()}
	s.grpc = grpc.NewServer(append(ServerOptions(cfg.Logger, cfg.Authorizer),
		grpc.Creds(credentials.NewTLS(cfg.TLS)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)...)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	if cfg.Reflection {
		reflection.Register(s.grpc)
	}
	// Not serving until the composition root says everything is ready.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return s, nil
}

// ServerOptions returns the interceptor chain every Airlock server uses, in
// order: tracing and metrics outermost (so a denied call is still traced),
// then logging, then authorization, then recovery innermost so a panicking
// handler becomes an Internal error that is still logged and traced.
func ServerOptions(logger *slog.Logger, a *authz.Authorizer) []grpc.ServerOption {
	lopts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithFieldsFromContext(callFields),
	}
	rec := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	return []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler()),
		// A request field that is not UTF-8 is InvalidArgument naming the
		// field (utf8.go), not gRPC's Internal.
		grpc.ForceServerCodec(utf8Codec{}),
		grpc.ChainUnaryInterceptor(
			logging.UnaryServerInterceptor(SlogLogger(logger), lopts...),
			auth.UnaryServerInterceptor(a.Authorize),
			unaryUTF8,
			recovery.UnaryServerInterceptor(rec),
		),
		grpc.ChainStreamInterceptor(
			logging.StreamServerInterceptor(SlogLogger(logger), lopts...),
			auth.StreamServerInterceptor(a.Authorize),
			streamUTF8,
			recovery.StreamServerInterceptor(rec),
		),
	}
}

// callFields puts the trace id and, once authorization has run, the caller
// on every log line of a call.
func callFields(ctx context.Context) logging.Fields {
	var f logging.Fields
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		f = append(f, "trace_id", sc.TraceID().String())
	}
	if id, err := identity.FromPeer(ctx); err == nil {
		f = append(f, "caller", id.String())
	}
	return f
}

// SlogLogger adapts slog to go-grpc-middleware's logging interface.
func SlogLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// Registrar is where services register their implementation.
func (s *Server) Registrar() grpc.ServiceRegistrar { return s.grpc }

// Addr is the address actually listened on.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// SetServing marks the whole server SERVING (or NOT_SERVING) for health checks.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
}

// SetComponent reports one named component (e.g. "runtime/runsc") as
// SERVING or NOT_SERVING under its own health service name, so operators
// and tools can check it with the standard health protocol.
func (s *Server) SetComponent(name string, serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(name, st)
}

// Serve serves until ctx is cancelled or the listener fails. On
// cancellation it reports NOT_SERVING, lets in-flight RPCs finish for at
// most ShutdownTimeout, then cuts what is left.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(s.lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("grpcserver: serve on %s: %w", s.lis.Addr(), err)
	case <-ctx.Done():
	}
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(s.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		s.cfg.Logger.Warn("graceful stop timed out; cutting remaining RPCs", "timeout", s.cfg.ShutdownTimeout)
		s.grpc.Stop()
		<-stopped
	}
	<-errc
	return nil
}
