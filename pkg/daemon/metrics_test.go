package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// otelgrpcScope is the instrumentation scope of the gRPC metrics.
const otelgrpcScope = "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"

// metricsSpec is an authority with nothing but health, serving metrics on
// metricsAddr, and the client/dev source to call it.
func metricsSpec(t *testing.T, listen, metricsAddr string) (Spec, *tlsconfig.Source) {
	t.Helper()
	dir := t.TempDir()
	dev, err := identity.New("a.test", identity.KindClient, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Init(dir, "a.test", []identity.ID{dev}); err != nil {
		t.Fatal(err)
	}
	cert, key := pki.Paths(dir, identity.Service("a.test", identity.ServiceAuthority))
	devCert, devKey := pki.Paths(dir, dev)
	src, err := tlsconfig.NewFileSource(pki.CAPath(dir), devCert, devKey)
	if err != nil {
		t.Fatal(err)
	}
	return Spec{
		Name:    "authority",
		Version: "v0.0.0-test",
		Config: config.Server{
			TrustDomain: "a.test", Listen: listen, DataDir: t.TempDir(),
			TLS:             config.TLS{CA: pki.CAPath(dir), Cert: cert, Key: key},
			Telemetry:       config.Telemetry{PrometheusListen: metricsAddr},
			ShutdownTimeout: 5 * time.Second,
		},
		// Health/List left out, for a call authorization refuses.
		Table:  authz.Table{healthpb.Health_Check_FullMethodName: authz.Everyone},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, src
}

// TestPrometheusEndpoint runs a service with telemetry.prometheus_listen,
// calls it over mTLS, and reads the calls back from /metrics over plain
// HTTP: the otelgrpc server histogram by method and status code, the
// resource as target_info, the Go and process collectors. The endpoint
// goes away with the service.
func TestPrometheusEndpoint(t *testing.T) {
	listen, metricsAddr := metricstest.FreeAddr(t), metricstest.FreeAddr(t)
	spec, src := metricsSpec(t, listen, metricsAddr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, spec) }()

	cc, err := grpcclient.Dial(listen, src, identity.Service("a.test", identity.ServiceAuthority))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := health.Check(rctx, &healthpb.HealthCheckRequest{})
		rcancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before serving", err)
		default:
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("not SERVING after 20s: %v %v", resp, err)
		}
	}

	okCheck := map[string]string{
		"rpc_method": "grpc.health.v1.Health/Check", "rpc_system_name": "grpc",
		"rpc_response_status_code": "OK", "otel_scope_name": otelgrpcScope,
	}
	const histogram = "rpc_server_call_duration_seconds"
	// The server records a call as it ends, which may be just after the
	// client has its answer: wait for the checks above to show.
	before := metricstest.Await(t, metricsAddr, 5*time.Second, func(f metricstest.Families) error {
		_, err := f.Series(histogram, dto.MetricType_HISTOGRAM, okCheck)
		return err
	})
	checks := before.Find(t, histogram, dto.MetricType_HISTOGRAM, okCheck)
	n0 := checks[0].GetHistogram().GetSampleCount()

	for range 2 {
		if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// A method outside the table, refused by authorization, and one no
	// service has: both still measured.
	if _, err := health.List(ctx, &healthpb.HealthListRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Health/List, outside the table: %v, want PermissionDenied", err)
	}
	err = cc.Invoke(ctx, "/airlock.authority.v1.AuthorityService/Nothing", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("a method no service has: %v, want Unimplemented", err)
	}

	after := metricstest.Await(t, metricsAddr, 5*time.Second, func(f metricstest.Families) error {
		checks, err := f.Series(histogram, dto.MetricType_HISTOGRAM, okCheck)
		if err != nil {
			return err
		}
		if n := checks[0].GetHistogram().GetSampleCount(); len(checks) != 1 || n != n0+2 {
			return fmt.Errorf("%d series for %v, the first counting %d calls; want 1 counting %d (+2 since the last scrape)", len(checks), okCheck, n, n0+2)
		}
		_, err = f.Series(histogram, dto.MetricType_HISTOGRAM, map[string]string{"rpc_method": "grpc.health.v1.Health/List", "rpc_response_status_code": "PERMISSION_DENIED"})
		return err
	})
	after.Find(t, "target_info", dto.MetricType_GAUGE, map[string]string{"service_name": "airlock-authority", "service_version": "v0.0.0-test"})
	after.Find(t, "go_goroutines", dto.MetricType_GAUGE, nil)
	after.Find(t, "process_open_fds", dto.MetricType_GAUGE, nil)
	for _, name := range after.Names() {
		t.Logf("exported: %s (%v)", name, after[name].GetType())
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10s after cancel")
	}
	if _, err := metricstest.TryScrape(metricsAddr); err == nil {
		t.Errorf("%s still serves metrics after the service stopped", metricsAddr)
	}
}

// TestPrometheusListenInUse: a metrics address that cannot be bound fails
// the start, naming the field, before the service is built.
func TestPrometheusListenInUse(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	spec, _ := metricsSpec(t, "127.0.0.1:0", held.Addr().String())
	spec.Start = func(context.Context, *Env) error {
		t.Error("the service started")
		return nil
	}
	var stderr bytes.Buffer
	code := main("authority", []string{"--config", "unused.yaml"}, io.Discard, &stderr, nil, func(ctx context.Context, _ *Flags) error {
		return Run(ctx, spec)
	})
	want := "authority: telemetry.prometheus_listen: listen tcp " + held.Addr().String() + ": bind: address already in use\n"
	if code != 1 || stderr.String() != want {
		t.Errorf("exit %d, printed %q, want exit 1, %q", code, stderr.String(), want)
	}
	if strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("printed more than one line: %q", stderr.String())
	}
}
