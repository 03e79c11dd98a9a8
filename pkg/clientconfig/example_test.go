package clientconfig

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// The operator's guide's client config (docs/examples/two-host/client.yaml)
// loads, and its identities' certificates are found where it says.
func TestTwoHostExample(t *testing.T) {
	path := configtest.Example(t, "client.yaml")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, as := range []string{"", "approver/alice", "pipeline/deploy"} {
		src, err := cfg.Source(as)
		if err != nil {
			t.Fatalf("identity %q: %v", as, err)
		}
		if id, err := src.ID(); err != nil || (as == "" && id.Principal() != "client/ci") {
			t.Errorf("identity %q: %v, %v", as, id, err)
		}
	}
	if addr, err := cfg.Address("publisher"); err != nil || addr != "10.77.0.1:7403" || cfg.Tenant != "team" {
		t.Errorf("the example loads as publisher %q (%v), tenant %q", addr, err, cfg.Tenant)
	}
	if _, err := Load(configtest.WithUnknownField(t, path)); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("an unknown field in the example: %v, want an error naming colour", err)
	}
}
