package config

import (
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// advertise defaults to listen when listen names a host; with an
// unspecified host it is required, and the error says why; a bad address
// is refused naming the field.
func TestAdvertise(t *testing.T) {
	for _, tc := range []struct {
		listen, advertise string
		want              string // the advertise after validation
		err               string // in advertise's error
	}{
		{listen: "10.77.0.2:7402", want: "10.77.0.2:7402"},
		{listen: "executor-0.airlock:7402", want: "executor-0.airlock:7402"},
		{listen: "[2001:db8::2]:7402", want: "[2001:db8::2]:7402"},
		{listen: "0.0.0.0:7402", advertise: "10.77.0.2:7402", want: "10.77.0.2:7402"},
		{listen: "10.77.0.2:7402", advertise: "exec.example:7402", want: "exec.example:7402"},
		{listen: "0.0.0.0:7402", err: "required when listen (0.0.0.0:7402) has no specific host"},
		{listen: "[::]:7402", err: "required when listen ([::]:7402) has no specific host"},
		{listen: ":7402", err: "required when listen (:7402) has no specific host"},
		{listen: "0.0.0.0:7402", advertise: "10.77.0.2", err: "must be host:port"},
		{listen: "0.0.0.0:7402", advertise: "0.0.0.0:7402", err: "unspecified address"},
		{listen: "127.0.0.1:0", err: "port 0"},
	} {
		c := &Config{Advertise: tc.advertise}
		c.Listen = tc.listen
		reason, bad := fieldErrors(c.ValidatePeers())["advertise"]
		switch {
		case tc.err == "" && bad:
			t.Errorf("listen %q advertise %q: %s", tc.listen, tc.advertise, reason)
		case tc.err == "" && c.Advertise != tc.want:
			t.Errorf("listen %q advertise %q: advertise became %q, want %q", tc.listen, tc.advertise, c.Advertise, tc.want)
		case tc.err != "" && !strings.Contains(reason, tc.err):
			t.Errorf("listen %q advertise %q: advertise error %q, want one saying %q", tc.listen, tc.advertise, reason, tc.err)
		}
	}
}

// --advertise wins over the file and over listen's default, in a start
// and in --check-config alike; with listen on every interface it is what
// makes the config good.
func TestAdvertiseFlag(t *testing.T) {
	path := configtest.Example(t, "executor.yaml")
	everywhere := func(s *config.Server) { s.Listen = "0.0.0.0:7402" }
	if _, err := Load(path, everywhere, Flags{}); err == nil || !strings.Contains(err.Error(), "advertise") {
		t.Fatalf("listen 0.0.0.0 without advertise: %v, want an error naming advertise", err)
	}
	if _, problems := Check(path, everywhere); len(problems) == 0 {
		t.Fatal("--check-config of listen 0.0.0.0 without advertise: no problem")
	}
	cfg, err := Load(path, everywhere, Flags{Advertise: "10.1.2.3:7402"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Advertise != "10.1.2.3:7402" || cfg.Fleet.FenceAfter != DefaultFenceAfter {
		t.Errorf("advertise %q, fence_after %v; want the flag's 10.1.2.3:7402 and %v", cfg.Advertise, cfg.Fleet.FenceAfter, DefaultFenceAfter)
	}
	if _, problems := (&Flags{Advertise: "10.1.2.3:7402"}).Check(path, everywhere); len(problems) > 0 {
		t.Errorf("--check-config with --advertise: %v", problems)
	}
}

// fleet.fence_after defaults to 20s; below 1s is refused.
func TestFenceAfter(t *testing.T) {
	c := &Config{Fleet: Fleet{FenceAfter: 500 * time.Millisecond}}
	c.Listen = "10.0.0.1:7402"
	if _, bad := fieldErrors(c.ValidatePeers())["fleet.fence_after"]; !bad {
		t.Error("fence_after 500ms accepted")
	}
}
