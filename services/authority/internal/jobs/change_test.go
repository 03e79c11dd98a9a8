package jobs

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

func allowOf(rules ...AllowRule) Network { return Network{Mode: NetworkAllow, Rules: rules} }

// TestWidensNetwork: a change widens the network exactly when the new
// policy permits a destination or port the old one did not.
func TestWidensNetwork(t *testing.T) {
	deny := Network{Mode: NetworkDenyAll}
	for _, tc := range []struct {
		name     string
		from, to Network
		widens   bool
	}{
		{"deny to deny", deny, deny, false},
		{"allow to deny", allowOf(AllowRule{CIDR: "10.0.0.0/8"}), deny, false},
		{"deny to allow", deny, allowOf(AllowRule{CIDR: "10.1.0.0/16", Ports: []uint32{443}}), true},
		{"sub-prefix, same port", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), allowOf(AllowRule{CIDR: "10.1.2.0/24", Ports: []uint32{443}}), false},
		{"sub-prefix under all ports", allowOf(AllowRule{CIDR: "10.0.0.0/8"}), allowOf(AllowRule{CIDR: "10.1.2.3/32", Ports: []uint32{22, 443}}), false},
		{"fewer ports", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{80, 443}}), allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), false},
		{"another port", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{22}}), true},
		{"all ports where some were", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), allowOf(AllowRule{CIDR: "10.0.0.0/8"}), true},
		{"wider prefix", allowOf(AllowRule{CIDR: "10.1.0.0/16"}), allowOf(AllowRule{CIDR: "10.0.0.0/8"}), true},
		{"sibling prefix", allowOf(AllowRule{CIDR: "10.1.0.0/16"}), allowOf(AllowRule{CIDR: "10.2.0.0/16"}), true},
		{"v6 not covered by v4 all", allowOf(AllowRule{CIDR: "0.0.0.0/0"}), allowOf(AllowRule{CIDR: "2001:db8::/32"}), true},
		{"v6 sub-prefix", allowOf(AllowRule{CIDR: "2001:db8::/32"}), allowOf(AllowRule{CIDR: "2001:db8:1::/48"}), false},
		{"ports split over two rules", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{80}}, AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}),
			allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{80, 443}}), true},
		{"host bits in the new rule", allowOf(AllowRule{CIDR: "10.1.0.0/16"}), allowOf(AllowRule{CIDR: "10.1.2.3/16"}), false},
		{"domains always widen", deny, Network{Mode: NetworkDomains, Domains: []string{"example.com"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := len(uncovered(tc.from, tc.to)) > 0
			if got != tc.widens {
				t.Fatalf("widens = %v, want %v (uncovered %v)", got, tc.widens, uncovered(tc.from, tc.to))
			}
		})
	}
}

// TestPlanChange: limits merge over the grant in force, the tenant's
// ceilings hold, disk cannot change, and each raised limit is named.
func TestPlanChange(t *testing.T) {
	tenant := &policy.Tenant{Name: "dev", Max: policy.DefaultMax,
		Egress: policy.Egress{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Domains: []string{"example.com"}}}
	cur := GrantRequest{Generation: 3, Limits: policy.DefaultLimits, Network: Network{Mode: NetworkDenyAll}, RuntimeClass: "runc"}
	ch, err := planChange(tenant, cur, ChangeRequest{Limits: &policy.Limits{MemoryBytes: 1 << 30, Pids: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if ch.BaseGeneration != 3 || ch.ToLimits.MemoryBytes != 1<<30 || ch.ToLimits.Pids != 10 || ch.ToLimits.CPUMillis != cur.Limits.CPUMillis ||
		ch.ToLimits.Deadline != cur.Limits.Deadline {
		t.Fatalf("change = %+v", ch)
	}
	if len(ch.Widens) != 1 || !strings.HasPrefix(ch.Widens[0], "memory_bytes: ") {
		t.Fatalf("widens = %v, want memory only", ch.Widens)
	}
	if d := describe(ch); !strings.Contains(d, "memory_bytes") || !strings.Contains(d, "pids 256 -> 10") {
		t.Fatalf("describe = %q", d)
	}
	for _, tc := range []struct {
		name string
		req  ChangeRequest
		want string
	}{
		{"above the ceiling", ChangeRequest{Limits: &policy.Limits{Deadline: 2 * time.Hour}}, "limits.deadline"},
		{"disk", ChangeRequest{Limits: &policy.Limits{DiskBytes: 1}}, "limits.disk_bytes"},
		{"negative", ChangeRequest{Limits: &policy.Limits{Pids: -1}}, "limits.pids"},
		{"outside egress", ChangeRequest{Network: &Network{Mode: NetworkAllow, Rules: []AllowRule{{CIDR: "192.0.2.0/24"}}}}, "policy.allow.rules[0].cidr: 192.0.2.0/24 is outside"},
		{"domains for a job that started deny_all", ChangeRequest{Network: &Network{Mode: NetworkDomains, Domains: []string{"example.com"}}}, "did not start with a domains policy"},
		{"no change", ChangeRequest{Limits: &policy.Limits{Pids: policy.DefaultLimits.Pids}}, "already runs under exactly"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := planChange(tenant, cur, tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	runsc := cur
	runsc.RuntimeClass = policy.RuntimeRunsc
	if _, err := planChange(tenant, runsc, ChangeRequest{Network: &Network{Mode: NetworkAllow, Rules: []AllowRule{{CIDR: "10.0.0.0/8"}}}}); err == nil || !strings.Contains(err.Error(), "runsc job started deny_all") {
		t.Fatalf("widening a deny-all runsc job's network: %v", err)
	}
	// Digest binds the exact change.
	_, d1, _ := ch.Encode()
	ch.ToLimits.Pids++
	if _, d2, _ := ch.Encode(); d1 == d2 {
		t.Fatal("two different changes have one digest")
	}
}
