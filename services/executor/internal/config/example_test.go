package config

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// The operator's guide's example (docs/examples/two-host/executor.yaml)
// is a config this build checks and loads, so the guide cannot drift from
// the code.
func TestTwoHostExample(t *testing.T) {
	path := configtest.Example(t, "executor.yaml")
	summary, problems := Check(path, nil)
	if len(problems) > 0 {
		t.Fatalf("the example does not check: %v", problems)
	}
	t.Log(summary)
	cfg, err := Load(path, nil, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Authority.Address != "10.77.0.1:7401" || cfg.Sandbox.Runsc == "" || !strings.HasPrefix(cfg.Sandbox.CgroupParent, "/airlock/") ||
		len(cfg.Network.AlwaysDenyPrefixes) != 1 || !strings.HasPrefix(cfg.Sandbox.Path, "/usr/local/go/bin:") {
		t.Errorf("the example loads as authority %q, runsc %q, cgroup parent %q, always deny %v, path %q",
			cfg.Authority.Address, cfg.Sandbox.Runsc, cfg.Sandbox.CgroupParent, cfg.Network.AlwaysDenyPrefixes, cfg.Sandbox.Path)
	}
	if _, problems := Check(configtest.WithUnknownField(t, path), nil); len(problems) == 0 || !strings.Contains(problems[0].Error(), "colour") {
		t.Errorf("an unknown field in the example: problems %v, want one naming colour", problems)
	}
}
