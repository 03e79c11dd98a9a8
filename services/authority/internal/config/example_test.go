package config

import (
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/config/configtest"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// The operator's guide's example (docs/examples/two-host/authority.yaml)
// is a config this build checks and loads, so the guide cannot drift from
// the code: a field renamed or removed here fails this test.
func TestTwoHostExample(t *testing.T) {
	path := configtest.Example(t, "authority.yaml")
	summary, problems := Check(path, nil)
	if len(problems) > 0 {
		t.Fatalf("the example does not check: %v", problems)
	}
	t.Log(summary)
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if team, ok := cfg.Policy["team"]; !ok || cfg.Fleet.LostAfter != 30*time.Second || len(team.RuntimeClasses) != 2 || team.User != runspec.Agent || team.AllowRoot {
		t.Errorf("the example loads as fleet %+v, tenants %v", cfg.Fleet, cfg.Policy)
	}
	if _, problems := Check(configtest.WithUnknownField(t, path), nil); len(problems) == 0 || !strings.Contains(problems[0].Error(), "colour") {
		t.Errorf("an unknown field in the example: problems %v, want one naming colour", problems)
	}
}
