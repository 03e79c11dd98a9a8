//go:build linux

package e2e

import (
	"context"
	"fmt"
	"maps"
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
// and the executor, made) in the otelgrpc histograms, by method and
// status; the authority and the executor show the job in their own
// metrics (docs/metrics.md), with its labels.
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
	// Airlock's own: the job counted by each service with its fixed
	// labels, and the gauges read at the scrape.
	job := map[string]string{"runtime_class": "runc", "kind": "job"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	type own struct {
		name    string
		typ     dto.MetricType
		labels  map[string]string
		atLeast float64
	}
	owns := map[string][]own{
		identity.ServiceAuthority: {
			{"airlock_authority_jobs_submitted_total", dto.MetricType_COUNTER, map[string]string{"outcome": "accepted", "kind": "job"}, 1},
			{"airlock_authority_jobs_ended_total", dto.MetricType_COUNTER, map[string]string{"state": "finished"}, 1},
			{"airlock_authority_jobs_waiting", dto.MetricType_GAUGE, nil, 0},
			{"airlock_authority_audit_entries_total", dto.MetricType_COUNTER, nil, 1},
			{"airlock_authority_audit_checkpoint_sequence", dto.MetricType_GAUGE, nil, 0},
			{"airlock_authority_audit_halted", dto.MetricType_GAUGE, nil, 0},
		},
		identity.ServiceExecutor: {
			{"airlock_executor_jobs_started_total", dto.MetricType_COUNTER, job, 1},
			{"airlock_executor_jobs_ended_total", dto.MetricType_COUNTER, with(job, "reason", "exited"), 1},
			{"airlock_executor_job_duration_seconds", dto.MetricType_HISTOGRAM, job, 1},
			{"airlock_executor_sandbox_create_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"runtime_class": "runc", "outcome": "ok"}, 1},
			{"airlock_executor_jobs_active", dto.MetricType_GAUGE, map[string]string{"runtime_class": "runc", "state": "running"}, 0},
			{"airlock_executor_capacity_memory_reserved_bytes", dto.MetricType_GAUGE, nil, 0},
			{"airlock_executor_capacity_cpu_reserved", dto.MetricType_GAUGE, nil, 0},
			{"airlock_executor_capacity_disk_reserved_bytes", dto.MetricType_GAUGE, nil, 0},
			{"airlock_executor_capacity_jobs_reserved", dto.MetricType_GAUGE, nil, 0},
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
			for _, w := range owns[name] {
				got, err := f.Series(w.name, w.typ, w.labels)
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				if v := value(got[0]); v < w.atLeast {
					return fmt.Errorf("%s: %s%s = %v, want at least %v", name, w.name, metricstest.Labels(got[0]), v, w.atLeast)
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

// value is a series' value: a counter's or gauge's, a histogram's count.
func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
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
		if strings.HasPrefix(name, "rpc_") || strings.HasPrefix(name, "airlock_") || name == "target_info" {
			for _, m := range fam.Metric {
				fmt.Fprintf(&b, "    %s\n", metricstest.Labels(m))
			}
		}
	}
	t.Logf("%s /metrics:\n%s", service, b.String())
}
