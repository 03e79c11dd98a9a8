package netpolicy

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// shapeManager is a manager with a fixed configuration, for the shape
// of the rules alone; it touches nothing on the host.
func shapeManager() *Manager {
	m := &Manager{cfg: Config{Name: "airlock", Pool4: DefaultPool4, Pool6: netip.MustParsePrefix("fd00:1::/48"), MaxConnections: 77}}
	m.deny = append(slices.Clone(alwaysDeny), DefaultPool4, m.cfg.Pool6)
	return m
}

func shapePolicy() Policy {
	return allow(rule(netip.MustParseAddr("192.0.2.0"), 24, 443, 80), rule(netip.MustParseAddr("198.51.100.7"), 32), rule(netip.MustParseAddr("2001:db8::"), 32, 22))
}

// The chains a job's table has, their hooks and priorities, and the
// pieces of its rules an edit could drop: a guard that needs neither
// root nor a kernel.
func TestRulesShape(t *testing.T) {
	m := shapeManager()
	n := m.newNet("job-1")
	n.addr = m.addrs(3)
	r := m.jobRules(n, shapePolicy())
	if r.table.Name != n.table || r.table.Family != nftables.TableFamilyINet {
		t.Errorf("table %s (family %d), want inet %s", r.table.Name, r.table.Family, n.table)
	}
	type hook struct {
		name string
		typ  nftables.ChainType
		hook nftables.ChainHook
		prio nftables.ChainPriority
	}
	var got []hook
	for _, c := range r.chains {
		h := hook{name: c.Name, typ: c.Type}
		if c.Hooknum != nil {
			h.hook, h.prio = *c.Hooknum, *c.Priority
			if c.Policy == nil || *c.Policy != nftables.ChainPolicyAccept {
				t.Errorf("chain %s: policy %v, want accept", c.Name, c.Policy)
			}
		}
		got = append(got, h)
	}
	want := []hook{
		{"prerouting", nftables.ChainTypeFilter, *nftables.ChainHookPrerouting, -300},
		{"from_job_pre", "", 0, 0},
		{"input", nftables.ChainTypeFilter, *nftables.ChainHookInput, 0},
		{"from_job_input", "", 0, 0},
		{"forward", nftables.ChainTypeFilter, *nftables.ChainHookForward, 0},
		{"from_job", "", 0, 0},
		{"to_job", "", 0, 0},
		{"postrouting", nftables.ChainTypeNAT, *nftables.ChainHookPostrouting, 100},
	}
	if !slices.Equal(got, want) {
		t.Errorf("chains\n got %v\nwant %v", got, want)
	}

	perChain := map[string]int{}
	var connlimit, reject, masq, portSets int
	ids := map[uint32]bool{}
	for _, rl := range r.rules {
		perChain[rl.chain.Name]++
		for _, s := range rl.sets {
			if ids[s.set.ID] || !s.set.Anonymous || !s.set.Constant {
				t.Errorf("set %d: want anonymous, constant and an id of its own", s.set.ID)
			}
			ids[s.set.ID] = true
			if s.set.KeyType == nftables.TypeInetService {
				portSets++
			}
		}
		for _, e := range rl.exprs {
			switch e := e.(type) {
			case *expr.Connlimit:
				connlimit++
				if e.Count != 77 || e.Flags != expr.NFT_CONNLIMIT_F_INV {
					t.Errorf("connection limit %+v, want over 77", e)
				}
			case *expr.Reject:
				reject++
				if e.Type != unix.NFT_REJECT_ICMPX_UNREACH || e.Code != unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED {
					t.Errorf("reject %+v, want icmpx admin-prohibited", e)
				}
			case *expr.Masq:
				masq++
			}
		}
	}
	// from_job: 2 source checks, 2 deny sets, the cap, 3 allow rules, drop.
	wantRules := map[string]int{"prerouting": 1, "from_job_pre": 3, "input": 1, "from_job_input": 1, "forward": 2, "from_job": 9, "to_job": 2, "postrouting": 2}
	for c, w := range wantRules {
		if perChain[c] != w {
			t.Errorf("chain %s has %d rules, want %d", c, perChain[c], w)
		}
	}
	if connlimit != 1 || reject != 1 || masq != 2 || portSets != 1 {
		t.Errorf("%d connection limits, %d rejects, %d masquerades, %d port sets; want 1, 1, 2 (IPv4 and IPv6), 1 (one port is a comparison)", connlimit, reject, masq, portSets)
	}

	// Without an IPv6 pool, the job's IPv6 is dropped and not masqueraded.
	m.cfg.Pool6 = netip.Prefix{}
	n.addr = m.addrs(3)
	r = m.jobRules(n, Policy{})
	masq = 0
	for _, rl := range r.rules {
		for _, e := range rl.exprs {
			if _, ok := e.(*expr.Masq); ok {
				masq++
			}
		}
	}
	if masq != 1 {
		t.Errorf("%d masquerades without Pool6, want 1", masq)
	}
}

// The always-denied prefixes become sorted ranges, one inside another or
// next to it merged (an interval set refuses overlaps), a range up to the
// last address without an end.
func TestIntervals(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{[]string{"169.254.169.254/32", "169.254.0.0/16", "10.0.0.0/8"}, []string{"10.0.0.0-11.0.0.0", "169.254.0.0-169.255.0.0"}},
		{[]string{"10.0.0.0/9", "10.128.0.0/9", "12.0.0.0/8"}, []string{"10.0.0.0-11.0.0.0", "12.0.0.0-13.0.0.0"}},
		{[]string{"224.0.0.0/3", "240.0.0.0/4", "10.0.0.1/32"}, []string{"10.0.0.1-10.0.0.2", "224.0.0.0-"}},
		{[]string{"0.0.0.0/0", "10.0.0.0/8"}, []string{"0.0.0.0-"}},
		{[]string{"10.0.0.5/30"}, []string{"10.0.0.4-10.0.0.8"}},
		{[]string{"::ffff:0:0/96", "::1/128", "fe80::/10"}, []string{"::1-::2", "::ffff:0.0.0.0-::1:0:0:0", "fe80::-fec0::"}},
		{[]string{"ff00::/8"}, []string{"ff00::-"}},
	} {
		var ps []netip.Prefix
		for _, s := range tc.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		var got []string
		for _, r := range intervals(ps) {
			end := ""
			if r.end.IsValid() {
				end = r.end.String()
			}
			got = append(got, r.start.String()+"-"+end)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("intervals(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	// nft's form: an end at the lowest address first, unless a range
	// starts there.
	for _, tc := range []struct {
		in       string
		elems    int
		leadHere bool
	}{{"::1/128", 3, true}, {"0.0.0.0/8", 2, false}, {"224.0.0.0/3", 2, true}} {
		es := intervalElems([]netip.Prefix{netip.MustParsePrefix(tc.in)})
		lead := len(es) > 0 && es[0].IntervalEnd && !slices.ContainsFunc(es[0].Key, func(b byte) bool { return b != 0 })
		if len(es) != tc.elems || lead != tc.leadHere {
			t.Errorf("intervalElems(%s) = %+v", tc.in, es)
		}
	}
}

// What the kernel holds after one of our transactions, as nft lists it,
// is what the nft script this package ran before listed, word for word
// (rulesAsNftListedThem). It needs the nft command, only to read.
func TestRulesAsNftListsThem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("the netpolicy tests must run as root, not uid %d", os.Geteuid())
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Skipf("no nft command to list the rules with: %v", err)
	}
	path := filepath.Join(t.TempDir(), "ns")
	if err := os.WriteFile(path, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := makeNetns(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeNetns(path); err != nil {
			t.Error(err)
		}
	})
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	m := shapeManager()
	n := m.newNet("job-1")
	n.addr = m.addrs(3)
	// Twice: the second replaces the first.
	for range 2 {
		if err := m.commitIn(context.Background(), int(ns), m.jobRules(n, shapePolicy()).queue); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("nsenter", "--net="+path, nft, "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	if string(out) != rulesAsNftListedThem {
		t.Errorf("nft lists\n%s\nwant\n%s", out, rulesAsNftListedThem)
	}
}

// rulesAsNftListedThem is how nft 1.0.6 listed what the script of the
// package's nft days made of shapeManager's job-1 in slot 3 under
// shapePolicy.
const rulesAsNftListedThem = `table inet airlock_c6f03a41cef4 {
	chain prerouting {
		type filter hook prerouting priority raw; policy accept;
		iifname "alkc6f03a41cef4" jump from_job_pre
	}

	chain from_job_pre {
		fib daddr type { local, broadcast, anycast, multicast } drop
		ip daddr { 0.0.0.0/8, 10.213.0.0/16, 100.100.100.200, 127.0.0.0/8, 168.63.129.16, 169.254.0.0/16, 192.0.0.192 } drop
		ip6 daddr { ::1, ::ffff:0.0.0.0/96, fd00:1::/48, fd00:ec2::254, fe80::/10 } drop
	}

	chain input {
		type filter hook input priority filter; policy accept;
		iifname "alkc6f03a41cef4" jump from_job_input
	}

	chain from_job_input {
		drop
	}

	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname "alkc6f03a41cef4" jump from_job
		oifname "alkc6f03a41cef4" jump to_job
	}

	chain from_job {
		ip saddr != 10.213.0.14 drop
		ip6 saddr != fd00:1:0:3::2 drop
		ip daddr { 0.0.0.0/8, 10.213.0.0/16, 100.100.100.200, 127.0.0.0/8, 168.63.129.16, 169.254.0.0/16, 192.0.0.192 } drop
		ip6 daddr { ::1, ::ffff:0.0.0.0/96, fd00:1::/48, fd00:ec2::254, fe80::/10 } drop
		ct state new ct count over 77 reject with icmpx admin-prohibited
		ip daddr 192.0.2.0/24 tcp dport { 80, 443 } accept
		ip daddr 198.51.100.7 accept
		ip6 daddr 2001:db8::/32 tcp dport 22 accept
		drop
	}

	chain to_job {
		ct state established,related accept
		drop
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.213.0.14 oifname != "alkc6f03a41cef4" masquerade
		ip6 saddr fd00:1:0:3::2 oifname != "alkc6f03a41cef4" masquerade
	}
}
`

// The executor needs no nft command: with nothing on PATH, New, a job's
// network with an allow policy, its changes and its removal, and Recover
// all work, and the rules do what they say.
func TestNoNftCommand(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if p, err := exec.LookPath("nft"); !errors.Is(err, exec.ErrNotFound) {
		t.Fatalf("nft found on an empty PATH: %s, %v", p, err)
	}
	m := newManager(t, true)
	th := startTestHost(t, m)
	ctx := context.Background()
	n := create(t, m, allow(rule(th.ip, 32, th.ports[0])))
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), true, "allowed"},
		probe{th.addr(th.ip, th.ports[1]), false, "not this port"},
	)
	if err := n.Apply(ctx, allow(rule(th.ip, 32, th.ports[1]), rule(th.ip6, 128)), 2); err != nil {
		t.Fatal(err)
	}
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), false, "narrowed away"},
		probe{th.addr(th.ip, th.ports[1]), true, "widened to"},
		probe{th.addr(th.ip6, th.ports[0]), true, "IPv6, any port"},
	)
	if tables, err := m.ourTables(ctx); err != nil || len(tables) != 1 {
		t.Errorf("tables = %v, %v; want the job's", tables, err)
	}
	if err := n.Apply(ctx, Policy{}, 3); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if ids, err := m.Recover(ctx); err != nil || len(ids) != 0 {
		t.Errorf("Recover = %v, %v", ids, err)
	}
}
