package config

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config"
)

// fieldErrors maps each field ValidatePeers complains about to its reason.
func fieldErrors(err error) map[string]string {
	out := map[string]string{}
	var walk func(error)
	walk = func(err error) {
		var fe *config.FieldError
		if errors.As(err, &fe) && err == error(fe) {
			out[fe.Field] = fe.Reason
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Without network.pool4, each data directory gets a /22 of 10.200.0.0/13
// of its own, the same at every start.
func TestDefaultPool4(t *testing.T) {
	seen := map[netip.Prefix]string{}
	for _, dir := range []string{"/var/lib/airlock/executor", "/var/lib/airlock/executor2", "/srv/a", "/srv/b", "/srv/c"} {
		c := &Config{}
		c.DataDir = dir
		_ = c.ValidatePeers()
		p := c.Network.Pool4Prefix
		if p.Bits() != 22 || !netip.MustParsePrefix("10.200.0.0/13").Contains(p.Addr()) || p != p.Masked() {
			t.Errorf("data_dir %s: default pool4 %s, want a /22 of 10.200.0.0/13", dir, p)
		}
		if other, dup := seen[p]; dup {
			t.Errorf("data_dirs %s and %s both get pool4 %s", other, dir, p)
		}
		seen[p] = dir
		again := &Config{}
		again.DataDir = dir
		_ = again.ValidatePeers()
		if again.Network.Pool4Prefix != p {
			t.Errorf("data_dir %s: pool4 %s, then %s", dir, p, again.Network.Pool4Prefix)
		}
	}
	c := &Config{Network: Network{Pool4: "10.1.0.0/16"}}
	_ = c.ValidatePeers()
	if c.Network.Pool4Prefix != netip.MustParsePrefix("10.1.0.0/16") {
		t.Errorf("a configured pool4 became %s", c.Network.Pool4Prefix)
	}
}

// network.always_deny takes CIDRs, masked; each bad one is named by its
// index.
func TestAlwaysDeny(t *testing.T) {
	c := &Config{Network: Network{AlwaysDeny: []string{"203.0.113.7/24", "nonsense", "2001:db8::/32", "::ffff:1.2.3.4/128"}}}
	errs := fieldErrors(c.ValidatePeers())
	for _, f := range []string{"network.always_deny[1]", "network.always_deny[3]"} {
		if _, ok := errs[f]; !ok {
			t.Errorf("no error for %s; errors %v", f, errs)
		}
	}
	for f := range errs {
		if f == "network.always_deny[0]" || f == "network.always_deny[2]" {
			t.Errorf("%s: %s", f, errs[f])
		}
	}
	want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	if !slices.Equal(c.Network.AlwaysDenyPrefixes, want) {
		t.Errorf("parsed %v, want %v", c.Network.AlwaysDenyPrefixes, want)
	}
	if reason := errs["network.always_deny[1]"]; !strings.Contains(reason, "nonsense") {
		t.Errorf("reason %q does not quote the value", reason)
	}
}

// network.max_connections defaults to 1024; a value below 1 or above
// 1<<20 is refused, naming the field.
func TestMaxConnections(t *testing.T) {
	for _, tc := range []struct {
		in, want int
		ok       bool
	}{{0, 1024, true}, {8, 8, true}, {1 << 20, 1 << 20, true}, {-1, 0, false}, {1<<20 + 1, 0, false}} {
		c := &Config{Network: Network{MaxConnections: tc.in}}
		reason, bad := fieldErrors(c.ValidatePeers())["network.max_connections"]
		switch {
		case tc.ok && bad:
			t.Errorf("max_connections %d: %s", tc.in, reason)
		case tc.ok && c.Network.MaxConnections != tc.want:
			t.Errorf("max_connections %d became %d, want %d", tc.in, c.Network.MaxConnections, tc.want)
		case !tc.ok && !bad:
			t.Errorf("max_connections %d: no error for network.max_connections", tc.in)
		}
	}
}
