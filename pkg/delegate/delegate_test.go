package delegate

import (
	"slices"
	"testing"
)

// A scope is asked for exactly where the executor needs one and systemd
// can make it.
func TestPrefix(t *testing.T) {
	systemd := Host{V2: true, Systemd: true, SystemdRun: "/usr/bin/systemd-run", Self: "/user.slice/user-0.slice/session-3.scope"}
	want := []string{"/usr/bin/systemd-run", "--scope", "--quiet", "--collect", "--unit=airlock-x", "--property=Delegate=yes", "--"}
	if got := systemd.Prefix("airlock-x"); !slices.Equal(got, want) {
		t.Errorf("a v2 systemd host, from a session: %q, want %q", got, want)
	}
	for name, h := range map[string]Host{
		"cgroup v1":       {V2: false, Systemd: true, SystemdRun: "/usr/bin/systemd-run", Self: "/user.slice"},
		"the root cgroup": {V2: true, Systemd: true, SystemdRun: "/usr/bin/systemd-run", Self: "/"},
		"no systemd":      {V2: true, Systemd: false, SystemdRun: "/usr/bin/systemd-run", Self: "/payload"},
		"no systemd-run":  {V2: true, Systemd: true, Self: "/user.slice"},
	} {
		if got := h.Prefix("airlock-x"); got != nil {
			t.Errorf("%s: %q, want none", name, got)
		}
	}
	// This host reads without error and decides: no scope on a v1 host.
	if h := ReadHost(); !h.V2 && h.Prefix("x") != nil {
		t.Errorf("this v1 host asks for a scope: %+v", h)
	}
}
