package runs

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/egress"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
)

func TestPolicyFromProto(t *testing.T) {
	allowList := func(rules ...*typesv1.AllowRule) *typesv1.NetworkPolicy {
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{Rules: rules}}}
	}
	domainList := func(ports []uint32, names ...string) *typesv1.NetworkPolicy {
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: names, Ports: ports}}}
	}
	for _, tc := range []struct {
		name string
		in   *typesv1.NetworkPolicy
		want jobPolicy
		err  string
	}{
		{name: "deny all", in: &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}},
		{name: "allow", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.0/24", Ports: []uint32{443, 80}}, &typesv1.AllowRule{Cidr: "2001:db8::/32"}),
			want: jobPolicy{net: netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Ports: []uint16{80, 443}}, {Prefix: netip.MustParsePrefix("2001:db8::/32")}}}}},
		{name: "domains", in: domainList([]uint32{8443}, "Proxy.Golang.org.", "*.npmjs.org", "bücher.example"),
			want: jobPolicy{net: netpolicy.Policy{Proxied: true}, names: egress.Policy{Names: []egress.Name{
				{Name: "proxy.golang.org", Ports: []uint16{8443}}, {Name: "*.npmjs.org", Ports: []uint16{8443}}, {Name: "xn--bcher-kva.example", Ports: []uint16{8443}}}}}},
		{name: "no domains", in: domainList(nil), err: "network_policy.domains.domains: need at least one name"},
		{name: "bad domain", in: domainList(nil, "exa mple.com"), err: "network_policy.domains"},
		{name: "bad domain port", in: domainList([]uint32{70000}, "example.com"), err: "network_policy.domains.ports[0]"},
		{name: "no mode", in: &typesv1.NetworkPolicy{}, err: "exactly one mode"},
		{name: "nil", in: nil, err: "exactly one mode"},
		{name: "empty allow", in: allowList(), err: "at least one rule"},
		{name: "bad cidr", in: allowList(&typesv1.AllowRule{Cidr: "example.com"}), err: "rules[0].cidr"},
		{name: "host bits", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.1/24"}), err: "host bits"},
		{name: "port 0", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.0/24", Ports: []uint32{0}}), err: "ports[0]"},
		{name: "port too big", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.0/24", Ports: []uint32{65536}}), err: "ports[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policyFromProto(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
