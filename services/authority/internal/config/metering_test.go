package config_test

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/services/authority/internal/config"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
)

// TestMeteringDefaults: a file without metering has the guide's rates and
// no budgets.
func TestMeteringDefaults(t *testing.T) {
	c, err := config.Load(write(t, common+"tenants:\n  dev:\n    clients: [client/dev]\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := c.MeteringPolicy.Rates
	if r.VCPUMonth != 800_000 || r.MemoryGBMonth != 700_000 || r.DiskGBMonth != 90_000 || r.ComputeMillis("vm") != 2500 || r.ComputeMillis("runc") != 1000 {
		t.Errorf("default rates %+v", r)
	}
	if len(c.MeteringPolicy.Budgets) != 0 {
		t.Errorf("budgets %v, want none", c.MeteringPolicy.Budgets)
	}
}

func TestMeteringSection(t *testing.T) {
	c, err := config.Load(write(t, common+`metering:
  rates: {vcpu_month: "1.20", memory_gb_month: "0.5", disk_gb_month: "$0.1", class_compute: {vm: 3, runsc: 1.25}}
tenants:
  dev:
    clients: [client/dev]
    metering: {monthly_budget: "100.00"}
  free:
    clients: [client/free]
    metering: {monthly_budget: "0"}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := c.MeteringPolicy.Rates
	if r.VCPUMonth != 1_200_000 || r.MemoryGBMonth != 500_000 || r.DiskGBMonth != 100_000 || r.ComputeMillis("vm") != 3000 ||
		r.ComputeMillis("runsc") != 1250 || r.ComputeMillis("runc") != 1000 {
		t.Errorf("rates %+v", r)
	}
	if got := c.MeteringPolicy.Budgets; len(got) != 1 || got["dev"] != metering.Micros(100_000_000) {
		t.Errorf("budgets %v, want dev's $100 alone", got)
	}
}

func TestMeteringErrorsNameTheField(t *testing.T) {
	tenant := func(body string) string { return common + "tenants:\n  dev:\n    clients: [client/dev]\n" + body }
	for _, tc := range []struct {
		name, body, want string
	}{
		{"bad rate", common + "metering: {rates: {vcpu_month: cheap}}\n", `metering.rates.vcpu_month: "cheap"`},
		{"negative rate", common + "metering: {rates: {disk_gb_month: \"-0.09\"}}\n", `metering.rates.disk_gb_month: "-0.09"`},
		{"too many decimals", common + "metering: {rates: {memory_gb_month: \"0.0000001\"}}\n", `metering.rates.memory_gb_month`},
		{"unknown class", common + "metering: {rates: {class_compute: {kvm: 2}}}\n", `metering.rates.class_compute.kvm: "kvm" is not a runtime class`},
		{"zero multiplier", common + "metering: {rates: {class_compute: {vm: 0}}}\n", `metering.rates.class_compute.vm: "0": must be between 0.001 and 1000`},
		{"unknown rates field", common + "metering: {rates: {gpu_month: \"1\"}}\n", `metering.rates.gpu_month`},
		{"bad budget", tenant("    metering: {monthly_budget: lots}\n"), `tenants.dev.metering.monthly_budget: "lots"`},
		{"unknown tenant metering field", tenant("    metering: {budget: \"1\"}\n"), `tenants.dev.metering.budget`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(write(t, tc.body), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
