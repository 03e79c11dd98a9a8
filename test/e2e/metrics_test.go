//go:build linux

package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

// TestPrometheusMetrics gives each service of a stack a
// telemetry.prometheus_listen, restarts it, runs a job and a publisher
// call, and scrapes every service's /metrics over plain HTTP: each shows
// itself in target_info and the calls it served (and, for the authority
// and the executor, made) in the otelgrpc histograms, by method and status.
func TestPrometheusMetrics(t *testing.T) {
	t.Parallel()
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	metrics := map[string]string{}
	for _, name := range identity.ServiceNames() {
		addr := metricstest.FreeAddr(t)
		metrics[name] = addr
		s.editConfig(t, name, func(path string, cfg map[string]any) {
			tel, ok := cfg["telemetry"].(map[string]any)
			if !ok {
				tel = map[string]any{}
				cfg["telemetry"] = tel
			}
			tel["prometheus_listen"] = addr
		})
		s.restartService(t, name)
	}

	// The job's test fails with status 3, as checked in (job_test.go).
	if res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--wait", "--", "./test.sh"); res.code != 3 {
		t.Fatalf("job: exit %d, want 3\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	pub := publisherv1.NewPublisherServiceClient(s.dial(t, "approver/alice", identity.ServicePublisher))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pub.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{}); err != nil {
		t.Fatalf("ListDeployments: %v", err)
	}

	const server, client = "rpc_server_call_duration_seconds", "rpc_client_call_duration_seconds"
	type series struct {
		name   string
		labels map[string]string
	}
	ok := func(method string) map[string]string {
		return map[string]string{"rpc_method": method, "rpc_system_name": "grpc", "rpc_response_status_code": "OK"}
	}
	want := map[string][]series{
		identity.ServiceAuthority: {
			{server, ok("grpc.health.v1.Health/Check")},
			{server, ok("airlock.authority.v1.AuthorityService/SubmitJob")},
			{server, ok("airlock.authority.v1.AuthorityService/ReportResult")},
			{client, ok("airlock.executor.v1.ExecutorService/StartJob")},
		},
		identity.ServiceExecutor: {
			{server, ok("grpc.health.v1.Health/Check")},
			{server, ok("airlock.executor.v1.ExecutorService/StartJob")},
			{client, ok("airlock.authority.v1.AuthorityService/ReportResult")},
		},
		identity.ServicePublisher: {
			{server, ok("grpc.health.v1.Health/Check")},
			{server, ok("airlock.publisher.v1.PublisherService/ListDeployments")},
		},
	}
	for _, name := range identity.ServiceNames() {
		fams := metricstest.Await(t, metrics[name], 10*time.Second, func(f metricstest.Families) error {
			if _, err := f.Series("target_info", dto.MetricType_GAUGE, map[string]string{"service_name": "airlock-" + name}); err != nil {
				return err
			}
			for _, w := range want[name] {
				if _, err := f.Series(w.name, dto.MetricType_HISTOGRAM, w.labels); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			}
			return nil
		})
		for _, fam := range []string{"go_goroutines", "process_resident_memory_bytes"} {
			fams.Find(t, fam, dto.MetricType_GAUGE, nil)
		}
		logScrape(t, name, fams)
	}
}

// logScrape logs a scrape's families and their label sets, the record
// docs/metrics.md is checked against.
func logScrape(t *testing.T, service string, fams metricstest.Families) {
	t.Helper()
	var b strings.Builder
	for _, name := range fams.Names() {
		fam := fams[name]
		keys := map[string]bool{}
		for _, m := range fam.Metric {
			for _, l := range m.GetLabel() {
				keys[l.GetName()] = true
			}
		}
		var ks []string
		for k := range keys {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		fmt.Fprintf(&b, "%s %v [%s] %d series\n", name, fam.GetType(), strings.Join(ks, " "), len(fam.Metric))
		if strings.HasPrefix(name, "rpc_") || name == "target_info" {
			for _, m := range fam.Metric {
				fmt.Fprintf(&b, "    %s\n", metricstest.Labels(m))
			}
		}
	}
	t.Logf("%s /metrics:\n%s", service, b.String())
}
