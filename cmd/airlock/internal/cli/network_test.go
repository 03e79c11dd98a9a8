package cli

import (
	"slices"
	"strings"
	"testing"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func TestNetworkFlags(t *testing.T) {
	policy := func(f networkFlags) (*typesv1.NetworkPolicy, error) { return f.policy() }

	if np, err := policy(networkFlags{}); np != nil || err != nil {
		t.Errorf("no flags: %v, %v; want no policy (the tenant's default)", np, err)
	}
	if np, err := policy(networkFlags{denyAll: true}); err != nil || np.GetDenyAll() == nil {
		t.Errorf("--deny-all: %v, %v", np, err)
	}
	np, err := policy(networkFlags{allow: []string{"10.0.0.0/8:443,80", "[2001:db8::/32]:443", "192.0.2.0/24"}})
	if err != nil || len(np.GetAllow().GetRules()) != 3 || !slices.Equal(np.GetAllow().GetRules()[0].GetPorts(), []uint32{443, 80}) ||
		np.GetAllow().GetRules()[1].GetCidr() != "2001:db8::/32" || len(np.GetAllow().GetRules()[2].GetPorts()) != 0 {
		t.Errorf("--allow: %v, %v", np, err)
	}
	np, err = policy(networkFlags{allowDomain: []string{"Proxy.Golang.ORG:443", "*.npmjs.org:443"}})
	if err != nil || !slices.Equal(np.GetDomains().GetDomains(), []string{"proxy.golang.org", "*.npmjs.org"}) || !slices.Equal(np.GetDomains().GetPorts(), []uint32{443}) {
		t.Errorf("--allow-domain: %v, %v", np, err)
	}
	for _, tc := range []struct {
		f    networkFlags
		want string
	}{
		{networkFlags{denyAll: true, allow: []string{"10.0.0.0/8"}}, "exclude each other"},
		{networkFlags{allow: []string{"10.0.0.0/8"}, allowDomain: []string{"example.com"}}, "exclude each other"},
		{networkFlags{allow: []string{"10.0.0.1/8"}}, "write 10.0.0.0/8"},
		{networkFlags{allow: []string{"10.0.0.0/8:0"}}, `"0" is not a TCP port`},
		{networkFlags{allow: []string{"[2001:db8::/32:443"}}, "missing ']'"},
		{networkFlags{allowDomain: []string{"localhost"}}, "not a fully qualified name"},
		{networkFlags{allowDomain: []string{"a.*.example.com"}}, "only as the whole first label"},
		{networkFlags{allowDomain: []string{"a.example.com:443", "b.example.com:80"}}, "the same ports"},
		{networkFlags{allowDomain: []string{"a.example.com:https"}}, "is not a TCP port"},
	} {
		_, err := policy(tc.f)
		var ue usageError
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", tc.f, err, tc.want)
		} else if !asUsage(err, &ue) {
			t.Errorf("%+v: %v is not a usage error (exit 2)", tc.f, err)
		}
	}
}

func asUsage(err error, ue *usageError) bool {
	u, ok := err.(usageError)
	if ok {
		*ue = u
	}
	return ok
}
