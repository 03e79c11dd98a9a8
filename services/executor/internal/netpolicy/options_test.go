package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// New refuses a pool that overlaps a subnet on one of the host's
// interfaces, naming the config field to change.
func TestNewRefusesAPoolInUse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("the netpolicy tests must run as root, not uid %d", os.Geteuid())
	}
	n := int(ctSeq.Add(1))
	name := fmt.Sprintf("ctd%04x%02x", os.Getpid()&0xffff, n&0xff)
	subnet := netip.MustParsePrefix(fmt.Sprintf("10.218.%d.0/24", (os.Getpid()*3+n)%256))
	// A veth pair, not a dummy link: the tests' kernels need veth anyway.
	pair := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(pair); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netlink.LinkDel(pair); err != nil {
			t.Errorf("delete %s: %v", name, err)
		}
	})
	ip := subnet.Addr().Next()
	if err := netlink.AddrAdd(pair, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pool string
		ok   bool
	}{
		{subnet.String(), false},
		{netip.PrefixFrom(subnet.Addr(), 16).Masked().String(), false},         // contains it
		{netip.PrefixFrom(ip.Next().Next().Next().Next(), 30).String(), false}, // inside it
		{fmt.Sprintf("10.219.%d.0/24", (os.Getpid()*3+n)%256), true},
	} {
		m, err := New(Config{Dir: t.TempDir(), Name: fmt.Sprintf("ctd%d_%d", os.Getpid(), n), Pool4: netip.MustParsePrefix(tc.pool)})
		if err == nil {
			if cerr := m.Close(); cerr != nil {
				t.Error(cerr)
			}
		}
		switch {
		case tc.ok && err != nil:
			t.Errorf("pool %s: %v", tc.pool, err)
		case !tc.ok && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network.pool4") || !strings.Contains(err.Error(), name)):
			t.Errorf("pool %s: %v; want invalid argument naming network.pool4 and %s", tc.pool, err, name)
		default:
			t.Logf("pool %s: %v", tc.pool, err)
		}
	}
}

// The generation of the policy Create puts in force is the caller's (a
// grant's network_policy_generation), at least 1; CanApply reports what
// Apply would refuse, without changing anything.
func TestCreateGenerationAndCanApply(t *testing.T) {
	m := ctManager(t)
	if _, err := m.Create(context.Background(), fmt.Sprintf("ct-%d-%d", os.Getpid(), ctSeq.Add(1)), Policy{}, Generation(0)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Create with generation 0: %v, want invalid argument", err)
	}
	n := ctJob(t, m, Policy{}, Generation(5), FixedInterfaces())
	if _, gen := n.Current(); gen != 5 {
		t.Fatalf("generation %d, want 5", gen)
	}
	allow := Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("192.0.2.0/24")}}}
	for _, tc := range []struct {
		name string
		p    Policy
		gen  int64
		want error
	}{
		{"same generation", Policy{}, 5, errdefs.ErrFailedPrecondition},
		{"deny-all gains an interface", allow, 6, ErrFixedInterfaces},
		{"invalid policy", Policy{Allow: []Rule{{}}}, 6, errdefs.ErrInvalidArgument},
		{"fine", Policy{}, 6, nil},
	} {
		err := n.CanApply(tc.p, tc.gen)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: CanApply: %v, want %v", tc.name, err, tc.want)
		}
		if aerr := n.Apply(context.Background(), tc.p, tc.gen); (aerr == nil) != (err == nil) {
			t.Errorf("%s: Apply %v but CanApply %v", tc.name, aerr, err)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.CanApply(Policy{}, 7); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("CanApply on a closed namespace: %v", err)
	}
}

// The well-known cloud metadata addresses are refused whatever a policy
// says.
func TestMetadataAddressesAlwaysDenied(t *testing.T) {
	for _, a := range []string{"169.254.169.254", "168.63.129.16", "100.100.100.200", "192.0.0.192", "fd00:ec2::254"} {
		addr := netip.MustParseAddr(a)
		found := false
		for _, p := range alwaysDeny {
			found = found || p.Contains(addr)
		}
		if !found {
			t.Errorf("%s is not always denied", a)
		}
	}
}

// TestDefaultPoolMovesOffTheHostsNetworks puts an address of a default
// pool on an interface of the host: New moves the pool to the next
// free one instead of refusing, while an explicit pool there is refused.
func TestDefaultPoolMovesOffTheHostsNetworks(t *testing.T) {
	tg, n := tag()
	pool := netip.MustParsePrefix(fmt.Sprintf("10.207.%d.0/24", (os.Getpid()*3+n)%256))
	// A veth pair stands in for a host interface (this kernel has no dummy
	// links).
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "npd" + tg + "a"}, PeerName: "npd" + tg + "b"}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(link) })
	addr, _ := netlink.ParseAddr(pool.Addr().Next().String() + "/24")
	if err := netlink.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: t.TempDir(), Name: "npd" + tg, Pool4: pool}); err == nil || !strings.Contains(err.Error(), "network.pool4") {
		t.Fatalf("an explicit pool on the host's network: %v, want refused naming network.pool4", err)
	}
	m, err := New(Config{Dir: t.TempDir(), Name: "npd" + tg, Pool4: pool, MovablePool4: true})
	if err != nil {
		t.Fatalf("a default pool on the host's network: %v, want it moved", err)
	}
	defer m.Close()
	if got := m.cfg.Pool4; got == pool || got.Overlaps(pool) || got.Bits() != pool.Bits() {
		t.Fatalf("moved pool = %s; want another /%d than %s", got, pool.Bits(), pool)
	}
}
