//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
)

// TestUsage runs a real job through the dev stack, with the authority's
// metering set in its file (the guide's rates written out, a budget for
// dev) and its /metrics served: `airlock usage -o json` then shows the
// job with vCPU-minutes and a cost, the budget beside it, and the usage
// counters appear on /metrics by tenant and runtime class.
func TestUsage(t *testing.T) {
	t.Parallel()
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	addr := metricstest.FreeAddr(t)
	s.editConfig(t, identity.ServiceAuthority, func(_ string, cfg map[string]any) {
		tel, ok := cfg["telemetry"].(map[string]any)
		if !ok {
			tel = map[string]any{}
			cfg["telemetry"] = tel
		}
		tel["prometheus_listen"] = addr
		cfg["metering"] = map[string]any{"rates": map[string]any{"vcpu_month": "0.80", "memory_gb_month": "0.70", "disk_gb_month": "0.09",
			"class_compute": map[string]any{"vm": 2.5}}}
		tenants := cfg["tenants"].(map[string]any)
		tenants["dev"].(map[string]any)["metering"] = map[string]any{"monthly_budget": "100.00"}
	})
	s.restartService(t, identity.ServiceAuthority)

	// The sample's test fails with status 3 (job_test.go): a real run all the same.
	before := time.Now().UTC()
	if res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--wait", "--", "./test.sh"); res.code != 3 {
		t.Fatalf("job: exit %d, want 3\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	// From before the job, not the month's start: the month may turn while
	// the test runs.
	since := before.Add(-time.Minute).Format(time.RFC3339)
	res := s.airlock(t, "usage", "--since", since, "-o", "json")
	if res.code != 0 {
		t.Fatalf("usage: exit %d\n%s", res.code, res.stderr)
	}
	var got struct {
		Rows []struct {
			JobID        string  `json:"jobId"`
			Tenant       string  `json:"tenant"`
			RuntimeClass string  `json:"runtimeClass"`
			VCPUMinutes  float64 `json:"vcpuMinutes"`
			AwakeMinutes string  `json:"awakeMinutes"`
			CostMicros   string  `json:"costMicros"`
		} `json:"rows"`
		Total struct {
			CostMicros string `json:"costMicros"`
		} `json:"total"`
		Budgets []struct {
			Tenant             string `json:"tenant"`
			MonthlyLimitMicros string `json:"monthlyLimitMicros"`
			UsedMicros         string `json:"usedMicros"`
		} `json:"budgets"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatalf("usage -o json: %v\n%s", err, res.stdout)
	}
	if len(got.Rows) != 1 {
		t.Fatalf("rows: %s", res.stdout)
	}
	r := got.Rows[0]
	cost, _ := strconv.ParseInt(r.CostMicros, 10, 64)
	if r.JobID == "" || r.Tenant != "dev" || r.RuntimeClass != "RUNTIME_CLASS_RUNC" || r.VCPUMinutes <= 0 || r.AwakeMinutes == "" || cost <= 0 {
		t.Fatalf("row %+v, want dev's runc job with vCPU-minutes and a cost\n%s", r, res.stdout)
	}
	after := time.Now().UTC()
	// The budget is this month's: the job's cost, unless the month turned
	// since it ran.
	sameMonth := before.Format("2006-01") == after.Format("2006-01")
	if got.Total.CostMicros != r.CostMicros || len(got.Budgets) != 1 || got.Budgets[0].MonthlyLimitMicros != "100000000" ||
		(sameMonth && got.Budgets[0].UsedMicros != r.CostMicros) {
		t.Fatalf("total and budget: %s", res.stdout)
	}
	// The table says the same in dollars, on the job's UTC day (the day
	// before or after, across a midnight).
	text := s.airlock(t, "usage", "--by", "day", "--since", since)
	if !strings.Contains(text.stdout, before.Format(time.DateOnly)) && !strings.Contains(text.stdout, after.Format(time.DateOnly)) {
		t.Fatalf("usage --by day: want the day %s or %s in\n%s%s", before.Format(time.DateOnly), after.Format(time.DateOnly), text.stdout, text.stderr)
	}
	for _, want := range []string{"TOTAL", "budget dev: $", "of $100.00 this month"} {
		if text.code != 0 || !strings.Contains(text.stdout, want) {
			t.Fatalf("usage --by day: exit %d, want %q in\n%s%s", text.code, want, text.stdout, text.stderr)
		}
	}

	labels := map[string]string{"tenant": "dev", "runtime_class": "runc"}
	fams := metricstest.Await(t, addr, 10*time.Second, func(f metricstest.Families) error {
		for _, name := range []string{"airlock_usage_vcpu_minutes_total", "airlock_usage_memory_gb_minutes_total", "airlock_usage_disk_gb_minutes_total", "airlock_usage_cost_micros_total"} {
			m, err := f.Series(name, dto.MetricType_COUNTER, labels)
			if err != nil {
				return err
			}
			if v := value(m[0]); v <= 0 {
				return fmt.Errorf("%s = %v, want more than 0", name, v)
			}
		}
		_, err := f.Series("airlock_usage_network_bytes_total", dto.MetricType_COUNTER, map[string]string{"tenant": "dev", "runtime_class": "runc", "direction": "sent"})
		return err
	})
	logScrape(t, identity.ServiceAuthority, fams)
}
