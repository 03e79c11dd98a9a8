package config

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// The operator's guide's example (docs/examples/two-host/publisher.yaml)
// is a config this build checks and loads, so the guide cannot drift from
// the code.
func TestTwoHostExample(t *testing.T) {
	path := configtest.Example(t, "publisher.yaml")
	summary, problems := Check(path, nil)
	if len(problems) > 0 {
		t.Fatalf("the example does not check: %v", problems)
	}
	t.Log(summary)
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Authority.Address != "10.77.0.1:7401" || cfg.Executor != nil || cfg.Store.Driver != "sqlite" {
		t.Errorf("the example loads as authority %q, executor %v, store %q", cfg.Authority.Address, cfg.Executor, cfg.Store.Driver)
	}
	if _, problems := Check(configtest.WithUnknownField(t, path), nil); len(problems) == 0 || !strings.Contains(problems[0].Error(), "colour") {
		t.Errorf("an unknown field in the example: problems %v, want one naming colour", problems)
	}
}
