package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/config/configtest"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// A tenant's port forward policy from the file: each bad entry fails
// naming its exact field; a good one becomes its port ranges and bounds
// with the defaults filled in; none at all is no forward.
func TestPortForwardPolicy(t *testing.T) {
	f := configtest.New(t, "authority")
	base := f.Common() + `fleet: {lost_after: 1m}
tenants:
  dev:
    clients: [client/dev]
    repositories: {demo: {url: /srv/git/demo.git}}
`
	with := func(pf string) string { return base + "    port_forward:\n" + pf }
	good := with(`      ports: ["3000", "8000-8999"]
      approval: required
      default_ttl: 10m
      max_ttl: 2h
      max_open: 3
`)
	cases := []configtest.Case{
		{Name: "a good policy", Body: good, Summary: "1 tenants"},
		{Name: "no policy", Body: base, Summary: "1 tenants"},
		{Name: "no ports", Body: with("      approval: none\n"), Field: "tenants.dev.port_forward.ports"},
		{Name: "a port that is no number", Body: with("      ports: [\"3000\", http]\n"), Field: "tenants.dev.port_forward.ports[1]"},
		{Name: "port 0", Body: with("      ports: [\"0\"]\n"), Field: "tenants.dev.port_forward.ports[0]"},
		{Name: "a port past 65535", Body: with("      ports: [\"70000\"]\n"), Field: "tenants.dev.port_forward.ports[0]"},
		{Name: "a range backwards", Body: with("      ports: [\"9000-8000\"]\n"), Field: "tenants.dev.port_forward.ports[0]"},
		{Name: "a bad approval", Body: with("      ports: [\"3000\"]\n      approval: sometimes\n"), Field: "tenants.dev.port_forward.approval"},
		{Name: "a default_ttl under a minute", Body: with("      ports: [\"3000\"]\n      default_ttl: 30s\n"), Field: "tenants.dev.port_forward.default_ttl"},
		{Name: "a max_ttl past a day", Body: with("      ports: [\"3000\"]\n      max_ttl: 25h\n"), Field: "tenants.dev.port_forward.max_ttl"},
		{Name: "a max_ttl under the default", Body: with("      ports: [\"3000\"]\n      default_ttl: 30m\n      max_ttl: 20m\n"), Field: "tenants.dev.port_forward.max_ttl"},
		{Name: "a negative max_open", Body: with("      ports: [\"3000\"]\n      max_open: -1\n"), Field: "tenants.dev.port_forward.max_open"},
		{Name: "a max_open too large", Body: with("      ports: [\"3000\"]\n      max_open: 1000\n"), Field: "tenants.dev.port_forward.max_open"},
		{Name: "an unknown key", Body: with("      ports: [\"3000\"]\n      public: true\n"), Field: "tenants.dev.port_forward.public"},
	}
	f.Run(t, Check, cases)

	load := func(body string) *policy.Tenant {
		t.Helper()
		path := filepath.Join(f.Dir, "pf.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Policy["dev"]
	}
	pf := load(good).PortForward
	if pf == nil || pf.PortList() != "3000, 8000-8999" || !pf.ApprovalRequired || pf.DefaultTTL != 10*time.Minute ||
		pf.MaxTTL != 2*time.Hour || pf.MaxOpen != 3 {
		t.Fatalf("good = %+v", pf)
	}
	for port, want := range map[uint32]bool{2999: false, 3000: true, 3001: false, 7999: false, 8000: true, 8500: true, 8999: true, 9000: false} {
		if pf.Allows(port) != want {
			t.Errorf("Allows(%d) = %v", port, !want)
		}
	}
	if got := load(base).PortForward; got != nil || got.Allows(3000) {
		t.Fatalf("no policy = %+v, want none, allowing nothing", got)
	}
	pf = load(with("      ports: [\"3000\"]\n")).PortForward
	if pf.ApprovalRequired || pf.DefaultTTL != 15*time.Minute || pf.MaxTTL != time.Hour || pf.MaxOpen != 8 {
		t.Fatalf("defaults = %+v", pf)
	}
}
