//go:build linux

package e2e

import (
	"context"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// fleetBenchClients is how many clients submit at once in BenchmarkFleet.
const fleetBenchClients = 24

// BenchmarkFleet is issue 22's throughput measure: 24 clients (a Go load
// client, not the CLI) each submitting `true` and waiting for it to
// finish, against the dev stack's one authority with one executor
// (executors=1: the two others drained) and with three (executors=3), all
// on this machine. It reports jobs/s, the authority's CPU per job, and
// the placement latency — the authority's own histogram of the time from
// submission to an executor accepting the job — at p50 and p99 (bucket
// upper bounds, from /metrics).
func BenchmarkFleet(b *testing.B) {
	repo := benchRepo(b, 3)
	s := startStack(b, "--repo", "bench="+repo)
	metricsAddr := metricstest.FreeAddr(b)
	s.editConfig(b, identity.ServiceAuthority, func(_ string, cfg map[string]any) {
		cfg["telemetry"] = map[string]any{"prometheus_listen": metricsAddr}
	})
	s.restartService(b, identity.ServiceAuthority)
	op := authorityv1.NewAuthorityServiceClient(s.dial(b, "operator/admin", identity.ServiceAuthority))
	for _, name := range []string{"x2", "x3"} {
		startHostExecutor(b, s, op, name)
	}
	client := authorityv1.NewAuthorityServiceClient(s.dial(b, "client/dev", identity.ServiceAuthority))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	authority := s.services[identity.ServiceAuthority].PID // the restarted one
	for _, n := range []int{1, 3} {
		for _, name := range []string{"x2", "x3"} {
			if _, err := op.DrainExecutor(ctx, &authorityv1.DrainExecutorRequest{Name: name, Drain: n == 1, Reason: "benchmark"}); err != nil {
				b.Fatal(err)
			}
		}
		// One job first, so no sub-benchmark pays for a cold cache.
		if _, err := submitAndWait(ctx, client, "main", fmt.Sprintf("fleet-warm-%d-%d", n, time.Now().UnixNano())); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("executors=%d", n), func(b *testing.B) {
			before := metricstest.Scrape(b, metricsAddr)
			cpu0 := cpuTicks(b, authority)
			var (
				next atomic.Int64
				mu   sync.Mutex
				errs []error
				wg   sync.WaitGroup
			)
			b.ResetTimer()
			start := time.Now()
			for w := range fleetBenchClients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						_, err := submitAndWait(ctx, client, "main", fmt.Sprintf("fleet-%d-%d-%d-%d-%d", n, b.N, w, i, start.UnixNano()))
						if err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if len(errs) > 0 {
				b.Fatalf("%d jobs failed; first: %v", len(errs), errs[0])
			}
			cpu := cpuTicks(b, authority) - cpu0
			after := metricstest.Scrape(b, metricsAddr)
			const handover = "airlock_authority_jobs_handover_duration_seconds"
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
			b.ReportMetric(float64(cpu)*1000/clockTicks/float64(b.N), "authority-cpu-ms/job")
			b.ReportMetric(histogramQuantile(b, before, after, handover, 0.5)*1000, "placement-p50-ms")
			b.ReportMetric(histogramQuantile(b, before, after, handover, 0.99)*1000, "placement-p99-ms")
		})
	}
}

// startHostExecutor starts one more executor, name, on this host beside
// dev up's (its own certificate, data directory and port; everything else
// as dev up's), and waits until the fleet has it up.
func startHostExecutor(b *testing.B, s *stack, op authorityv1.AuthorityServiceClient, name string) {
	b.Helper()
	if res := s.airlock(b, "pki", "issue", "--dir", s.pkiDir, "--id", "service/executor/"+name); res.code != 0 {
		b.Fatalf("pki issue %s: exit %d\n%s", name, res.code, res.stderr)
	}
	dir := filepath.Join(s.dir, "fleet", name)
	cfg := readYAMLMap(b, s.services[identity.ServiceExecutor].Config)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg["listen"], cfg["data_dir"] = addr, filepath.Join(dir, "data")
	tls := cfg["tls"].(map[string]any)
	tls["cert"] = filepath.Join(s.pkiDir, "service", "executor", name+".crt")
	tls["key"] = filepath.Join(s.pkiDir, "service", "executor", name+".key")
	config := filepath.Join(dir, "config.yaml")
	writeYAMLFile(b, config, cfg)
	p := startProcess(b, b, name, []string{bin(identity.ServiceExecutor), "--config", config}, filepath.Join(dir, "executor.log"), nil)
	b.Cleanup(func() {
		if err := syscall.Kill(p.pid, syscall.SIGTERM); err != nil {
			b.Errorf("stop executor %s: %v", name, err)
			return
		}
		if _, err := reap(p.pid, stopTimeout); err != nil {
			b.Errorf("stop executor %s: %v", name, err)
		}
	})
	p.waitReady(b, filepath.Join(dir, "data"), filepath.Join(dir, "executor.log"), 100*time.Millisecond, func() error {
		x, err := op.GetExecutor(context.Background(), &authorityv1.GetExecutorRequest{Name: name})
		if err != nil || x.GetExecutor().GetState() != authorityv1.ExecutorState_EXECUTOR_STATE_UP {
			return fmt.Errorf("executor %s: %v, %v", name, x, err)
		}
		return nil
	})
}

// histogramQuantile is quantile q of histogram name's observations between
// two scrapes: the upper bound of the first bucket holding it (+Inf when
// it is past the last).
func histogramQuantile(b *testing.B, before, after metricstest.Families, name string, q float64) float64 {
	b.Helper()
	buckets := func(f metricstest.Families) []*dto.Bucket {
		fam := f[name]
		if fam == nil || len(fam.Metric) != 1 {
			return nil
		}
		return fam.Metric[0].GetHistogram().GetBucket()
	}
	was, now := buckets(before), buckets(after)
	if len(now) == 0 {
		b.Fatalf("no histogram %s on /metrics", name)
	}
	count := func(bs []*dto.Bucket, i int) float64 {
		if i < len(bs) {
			return float64(bs[i].GetCumulativeCount())
		}
		return 0
	}
	total := float64(0)
	if h := after[name].Metric[0].GetHistogram(); h != nil {
		total = float64(h.GetSampleCount())
		if before[name] != nil {
			total -= float64(before[name].Metric[0].GetHistogram().GetSampleCount())
		}
	}
	if total <= 0 {
		b.Fatalf("histogram %s recorded nothing", name)
	}
	bounds := make([]float64, len(now))
	for i, bk := range now {
		bounds[i] = bk.GetUpperBound()
	}
	if !slices.IsSorted(bounds) {
		b.Fatalf("histogram %s: buckets out of order", name)
	}
	for i, bk := range now {
		if count(now, i)-count(was, i) >= q*total {
			return bk.GetUpperBound()
		}
	}
	return math.Inf(1)
}
