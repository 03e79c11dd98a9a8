package grpcserver_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/grpcserver"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/logging/logtest"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/telemetry"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

const td = "airlock.test"

var (
	authorityID = identity.Service(td, identity.ServiceAuthority)
	executorID  = identity.Service(td, identity.ServiceExecutor)
	devID       = identity.MustParse("spiffe://" + td + "/client/dev")
)

// env is a throwaway CA with the services and client/dev on disk.
type env struct{ dir string }

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	if _, err := pki.Init(dir, td, []identity.ID{devID}); err != nil {
		t.Fatal(err)
	}
	return &env{dir: dir}
}

func (e *env) source(t *testing.T, id identity.ID) *tlsconfig.Source {
	t.Helper()
	cert, key := pki.Paths(e.dir, id)
	src, err := tlsconfig.NewFileSource(pki.CAPath(e.dir), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// serve starts a server for id with table and health; register may add or
// replace services before it starts. It returns the address.
// The returned stop cancels Serve and waits for it, once; it returns what
// Serve returned.
func serve(t *testing.T, e *env, id identity.ID, table authz.Table, logs *logtest.Buffer, timeout time.Duration, register func(*grpcserver.Server)) (*grpcserver.Server, func() error) {
	t.Helper()
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	srv, err := grpcserver.New(grpcserver.Config{
		Listen:          "127.0.0.1:0",
		TLS:             tlsconfig.ServerConfig(e.source(t, id), td),
		Authorizer:      authz.New(table, logger, nil),
		Logger:          logger,
		ShutdownTimeout: timeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	if register != nil {
		register(srv)
	}
	srv.SetServing(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { stop() })
	return srv, stop
}

func dial(t *testing.T, e *env, as identity.ID, addr string, server identity.ID) *grpc.ClientConn {
	t.Helper()
	cc, err := grpcclient.Dial(addr, e.source(t, as), server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestNewRefusesInsecureConfigs(t *testing.T) {
	e := newEnv(t)
	a := authz.New(authz.Infrastructure, nil, nil)
	serverTLS := tlsconfig.ServerConfig(e.source(t, authorityID), td)
	noClientAuth := serverTLS.Clone()
	noClientAuth.ClientAuth = tls.NoClientCert
	for _, tc := range []struct {
		name string
		cfg  grpcserver.Config
		want string
	}{
		{"no TLS", grpcserver.Config{Listen: "127.0.0.1:0", Authorizer: a}, "TLS config is required"},
		{"TLS without client certificates", grpcserver.Config{Listen: "127.0.0.1:0", TLS: noClientAuth, Authorizer: a}, "must require client certificates"},
		{"no authorizer", grpcserver.Config{Listen: "127.0.0.1:0", TLS: serverTLS}, "authorizer is required"},
		{"bad address", grpcserver.Config{Listen: "nonsense", TLS: serverTLS, Authorizer: a}, "listen on nonsense"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := grpcserver.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// panicky is a health service whose Check panics.
type panicky struct {
	healthpb.UnimplementedHealthServer
}

func (panicky) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("boom")
}

func TestPanicBecomesInternalAndServerSurvives(t *testing.T) {
	e := newEnv(t)
	logs := &logtest.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	// The same chain grpcserver.New uses, on a bare server, so a panicking
	// handler can stand in for health.
	gs := grpc.NewServer(append(grpcserver.ServerOptions(logger, authz.New(authz.Infrastructure, logger, nil)),
		grpc.Creds(credentials.NewTLS(tlsconfig.ServerConfig(e.source(t, authorityID), td))))...)
	healthpb.RegisterHealthServer(gs, panicky{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	cc := dial(t, e, devID, lis.Addr().String(), authorityID)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 2 { // twice: the server must survive the first panic
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.Internal || status.Convert(err).Message() != "internal error" {
			t.Fatalf("call %d: got %v, want Internal \"internal error\" (no panic detail to the caller)", i, err)
		}
	}
	if out := logs.String(); !strings.Contains(out, "panic in handler") || !strings.Contains(out, "boom") {
		t.Errorf("panic not logged with its value: %s", out)
	}
}

func TestDeniedCallIsLoggedWithCaller(t *testing.T) {
	e := newEnv(t)
	logs := &logtest.Buffer{}
	onlyAuthority := authz.Table{healthpb.Health_Check_FullMethodName: {authz.Authority}}
	srv, _ := serve(t, e, executorID, onlyAuthority, logs, time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	_, err := healthpb.NewHealthClient(dial(t, e, devID, srv.Addr().String(), executorID)).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.HasPrefix(status.Convert(err).Message(), authz.DeniedPrefix) {
		t.Fatalf("client/dev: got %v, want the table's PermissionDenied", err)
	}
	if _, err := healthpb.NewHealthClient(dial(t, e, authorityID, srv.Addr().String(), executorID)).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("service/authority: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, `"msg":"rpc denied"`) || !strings.Contains(out, devID.String()) {
		t.Errorf("denial not logged with the caller: %s", out)
	}
	if strings.Count(out, `"msg":"rpc denied"`) != 1 {
		t.Errorf("want exactly one denial logged: %s", out)
	}
}

func TestServeStopsGracefullyThenCutsStreams(t *testing.T) {
	e := newEnv(t)
	srv, stopServer := serve(t, e, authorityID, authz.Infrastructure, &logtest.Buffer{}, 300*time.Millisecond, nil)
	cc := dial(t, e, devID, srv.Addr().String(), authorityID)
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	// A Watch stream never ends by itself, so graceful stop alone would hang.
	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch message: %v %v", r, err)
	}
	start := time.Now()
	returned := make(chan error, 1)
	go func() { returned <- stopServer() }()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the shutdown timeout")
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("Serve returned after %v: it did not wait for the in-flight stream", d)
	}
	// The stream sees NOT_SERVING (health shut down) and then its end.
	for {
		r, err := w.Recv()
		if err != nil {
			break
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			t.Fatal("still SERVING after shutdown began")
		}
	}
}

func TestOneTraceAcrossServices(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(telemetry.Propagator())
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	e := newEnv(t)
	// Downstream: the executor's real health service.
	exec, _ := serve(t, e, executorID, authz.Infrastructure, &logtest.Buffer{}, time.Second, nil)
	// Upstream: the authority, whose handler calls the executor with the
	// incoming context, as real handlers will.
	down := dial(t, e, authorityID, exec.Addr().String(), executorID)
	logger := slog.New(slog.NewJSONHandler(&logtest.Buffer{}, nil))
	gs := grpc.NewServer(append(grpcserver.ServerOptions(logger, authz.New(authz.Infrastructure, logger, nil)),
		grpc.Creds(credentials.NewTLS(tlsconfig.ServerConfig(e.source(t, authorityID), td))))...)
	healthpb.RegisterHealthServer(gs, forwarder{next: healthpb.NewHealthClient(down)})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	ctx, span := tp.Tracer("test").Start(context.Background(), "client-operation")
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(dial(t, e, devID, lis.Addr().String(), authorityID)).Check(cctx, &healthpb.HealthCheckRequest{})
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	want := span.SpanContext().TraceID()
	// A server span ends after its response is sent, so the client can
	// return before the last hop's span is recorded: wait for it a while.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		n := 0
		for _, s := range rec.Ended() {
			if s.Name() == healthpb.Health_Check_FullMethodName[1:] && s.SpanKind() == trace.SpanKindServer {
				n++
			}
		}
		if n >= 2 {
			break
		}
	}
	var servers, clients int
	for _, s := range rec.Ended() {
		if s.Name() != healthpb.Health_Check_FullMethodName[1:] {
			continue
		}
		if s.SpanContext().TraceID() != want {
			t.Errorf("span %s (%v) is on trace %s, want %s", s.Name(), s.SpanKind(), s.SpanContext().TraceID(), want)
		}
		switch s.SpanKind() {
		case trace.SpanKindServer:
			servers++
		case trace.SpanKindClient:
			clients++
		}
	}
	if servers != 2 || clients != 2 {
		t.Fatalf("want 2 client and 2 server spans for the two hops, got %d client, %d server", clients, servers)
	}
}

// forwarder answers Check by asking the next server, carrying the context.
type forwarder struct {
	healthpb.UnimplementedHealthServer
	next healthpb.HealthClient
}

func (f forwarder) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return f.next.Check(ctx, req)
}

// rawCodec sends bytes as they are, so a test can send what no proto
// library would encode.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	return *(v.(*[]byte)), nil
}
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

// A request whose string field is not UTF-8 is InvalidArgument naming the
// field, not Internal; a valid one still reaches the handler.
func TestInvalidUTF8IsInvalidArgument(t *testing.T) {
	e := newEnv(t)
	srv, _ := serve(t, e, executorID, authz.Infrastructure, &logtest.Buffer{}, time.Second, nil)
	cc := dial(t, e, devID, srv.Addr().String(), executorID)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := []byte{0x0a, 3, 'a', 0xff, 'b'} // field 1 (service), "a\xffb"
	var resp []byte
	err := cc.Invoke(ctx, healthpb.Health_Check_FullMethodName, &req, &resp, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "service: not valid UTF-8") {
		t.Fatalf("Check with a non-UTF-8 service name: %v, want InvalidArgument naming service", err)
	}
	// The same stream call, and the same name valid: the handler answers.
	// The handler's own answer for a service it does not know.
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "a\u00ffb"}); status.Code(err) != codes.NotFound {
		t.Errorf("a valid name: %v, want the health handler's NotFound", err)
	}
	forged := append([]byte{0xfa, 0xff, 0xff, 0xff, 0x0f, 4}, []byte("\x1b[2J")...) // the mark, sent by the caller
	if err := cc.Invoke(ctx, healthpb.Health_Check_FullMethodName, &forged, &resp, grpc.ForceCodec(rawCodec{})); status.Code(err) != codes.InvalidArgument ||
		strings.Contains(err.Error(), "\x1b") {
		t.Errorf("a forged mark: %v, want InvalidArgument without its bytes", err)
	}
	stream, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, healthpb.Health_Watch_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendMsg(&req); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	if err := stream.RecvMsg(&resp); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "service: not valid UTF-8") {
		t.Errorf("Watch with a non-UTF-8 service name: %v", err)
	}
}
