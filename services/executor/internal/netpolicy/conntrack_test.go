package netpolicy

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// These tests need root, veth and nf_tables with connection tracking.
// Their test host is a /30 of 198.51.100.0/24 (TEST-NET-2), which exists
// only inside its pair, and their pools are /24s of 10.217.0.0/16.

var ctSeq atomic.Int64

type ctLog struct{ t testing.TB }

func (w ctLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// ctManager is a manager of the test's own, with opts applied to its
// config; its cleanup checks every namespace was closed.
func ctManager(t *testing.T, opts ...func(*Config)) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the netpolicy tests must run as root, not uid %d", os.Geteuid())
	}
	n := int(ctSeq.Add(1))
	cfg := Config{
		Dir:    t.TempDir(),
		Name:   fmt.Sprintf("ctt%d_%d", os.Getpid(), n),
		Pool4:  netip.MustParsePrefix(fmt.Sprintf("10.217.%d.0/24", (os.Getpid()*5+n)%256)),
		Logger: slog.New(slog.NewTextHandler(ctLog{t}, nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Manager.Close: %v", err)
		}
	})
	return m
}

func ctJob(t *testing.T, m *Manager, p Policy, opts ...CreateOption) *Net {
	t.Helper()
	n, err := m.Create(context.Background(), fmt.Sprintf("ct-%d-%d", os.Getpid(), ctSeq.Add(1)), p, opts...)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n
}

// ctTestHost is a test host with a TCP echo listener; it returns the host
// and the listener's port.
func ctTestHost(t *testing.T) (*nettest.Host, int) {
	t.Helper()
	n := int(ctSeq.Add(1))
	th := nettest.Start(t, nettest.Config{
		Name:   fmt.Sprintf("ctt%04x%02x", os.Getpid()&0xffff, n&0xff),
		Prefix: nettest.Subnet(netip.MustParsePrefix("198.51.100.0/24"), 30, (os.Getpid()+n)%64),
	})
	ln := th.Listen(t, "tcp4", net.JoinHostPort(th.IP.String(), "0"))
	nettest.Echo(t, ln)
	return th, ln.Addr().(*net.TCPAddr).Port
}

// jobFlows lists the host's conntrack entries that involve addr.
func jobFlows(t *testing.T, addr netip.Addr) []*netlink.ConntrackFlow {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatalf("list conntrack entries: %v", err)
	}
	f := flowFilter{addrs: []netip.Addr{addr}}
	var out []*netlink.ConntrackFlow
	for _, fl := range flows {
		if f.MatchConntrackFlow(fl) {
			out = append(out, fl)
		}
	}
	return out
}

// A narrower policy cuts the replies of the connections it no longer
// allows, not only what the job sends: a UDP peer the job talked to under
// the old policy cannot reach it any more, while a TCP connection the new
// policy still allows keeps working. Once the namespace is closed no
// conntrack entry of the job's address is left.
func TestNarrowingCutsEstablishedFlows(t *testing.T) {
	m := ctManager(t)
	th, tcpPort := ctTestHost(t)
	var peer net.PacketConn
	if err := th.Do(func() error {
		var err error
		peer, err = net.ListenPacket("udp4", net.JoinHostPort(th.IP.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	udpAddr := peer.LocalAddr().(*net.UDPAddr)

	n := ctJob(t, m, Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(th.IP, 32)}}})
	jobAddr := n.addr.job4.Addr()

	// A TCP connection, allowed throughout.
	c, err := nettest.DialFrom(n.Path(), net.JoinHostPort(th.IP.String(), fmt.Sprint(tcpPort)), 5*time.Second)
	if err != nil {
		t.Fatalf("dial the test host: %v", err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(line string) error {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintln(c, line); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if got != line+"\n" {
			return fmt.Errorf("echo %q, want %q", got, line)
		}
		return nil
	}
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}

	// A UDP flow: the job speaks first, the peer answers to where the
	// job's packet came from (the host's address, masqueraded).
	received := udpFlow(t, n.Path(), peer, udpAddr, "the peer got nothing from the job")
	if !received("answer") {
		t.Fatal("the job did not get the peer's answer while the policy allowed it")
	}

	// Narrowed to the TCP port alone.
	narrow := Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(th.IP, 32), Ports: []uint16{uint16(tcpPort)}}}}
	if err := n.Apply(context.Background(), narrow, 2); err != nil {
		t.Fatal(err)
	}
	if received("after narrowing") {
		t.Error("the peer still reaches the job over a UDP flow the policy no longer allows")
	}
	if err := echo("after"); err != nil {
		t.Errorf("a TCP connection the new policy still allows was cut: %v", err)
	}
	if len(jobFlows(t, jobAddr)) == 0 {
		t.Error("no conntrack entry of the job is left, not even the allowed TCP connection's")
	}

	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if left := jobFlows(t, jobAddr); len(left) > 0 {
		t.Errorf("conntrack entries of the closed job's address %s are left: %v", jobAddr, left)
	}
}

// A job's veth removed by a deny-all policy takes its conntrack entries
// with it, and its addresses are not the next job's.
func TestFreedAddressesAreNotReusedAtOnce(t *testing.T) {
	m := ctManager(t)
	th, tcpPort := ctTestHost(t)
	allow := Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(th.IP, 32)}}}

	a := ctJob(t, m, allow)
	aAddr := a.addr.job4.Addr()
	c, err := nettest.DialFrom(a.Path(), net.JoinHostPort(th.IP.String(), fmt.Sprint(tcpPort)), 5*time.Second)
	if err != nil {
		t.Fatalf("dial the test host: %v", err)
	}
	defer c.Close()
	if len(jobFlows(t, aAddr)) == 0 {
		t.Fatal("no conntrack entry for the job's connection")
	}
	if err := a.Apply(context.Background(), Policy{}, 2); err != nil {
		t.Fatal(err)
	}
	if left := jobFlows(t, aAddr); len(left) > 0 {
		t.Errorf("conntrack entries of %s are left after its veth was removed: %v", aAddr, left)
	}
	b := ctJob(t, m, allow)
	if got := b.addr.job4.Addr(); got == aAddr {
		t.Errorf("the next job got the address %s just freed", got)
	}
}

// The slots go round: a freed slot is taken again only after every other.
func TestTakeSlotGoesRound(t *testing.T) {
	m := &Manager{cfg: Config{Pool4: netip.MustParsePrefix("10.0.0.0/28")}, slots: map[int]bool{}}
	var got []int
	for range 3 {
		s, err := m.takeSlot()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	m.freeSlot(0)
	m.freeSlot(1)
	for range 2 {
		s, err := m.takeSlot()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if want := []int{0, 1, 2, 3, 0}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("slots taken %v, want %v", got, want)
	}
	if _, err := m.takeSlot(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.takeSlot(); err == nil {
		t.Error("a fifth slot of a /28 pool")
	}
}

// A job can have at most MaxConnections connections open at once: one
// more is refused at once, and once some close, new ones work again.
func TestConnectionCap(t *testing.T) {
	const limit = 8
	m := ctManager(t, func(c *Config) { c.MaxConnections = limit })
	th, tcpPort := ctTestHost(t)
	n := ctJob(t, m, Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(th.IP, 32)}}})
	addr := net.JoinHostPort(th.IP.String(), fmt.Sprint(tcpPort))
	dial := func() (net.Conn, error) {
		c, err := nettest.DialFrom(n.Path(), addr, 2*time.Second)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			c.Close()
			return nil, fmt.Errorf("greeting: %w", err)
		}
		return c, nil
	}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := range limit {
		c, err := dial()
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, limit, err)
		}
		open = append(open, c)
	}
	start := time.Now()
	if c, err := dial(); err == nil {
		c.Close()
		t.Fatalf("connection %d of a job limited to %d went through", limit+1, limit)
	} else {
		t.Logf("connection %d: %v after %s", limit+1, err, time.Since(start))
	}
	for _, c := range open[:3] {
		c.Close()
	}
	open = open[3:]
	// The closed connections stop counting once conntrack sees them
	// closed; give that a moment.
	deadline := time.Now().Add(5 * time.Second)
	for len(open) < limit {
		c, err := dial()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("with %d of %d connections open, another one: %v", len(open), limit, err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		open = append(open, c)
	}
	if c, err := dial(); err == nil {
		c.Close()
		t.Errorf("connection %d of a job limited to %d went through after others closed", limit+1, limit)
	}
}

// The forward chain filters the destination after the host's DNAT, and
// so does Apply's choice of which connections to cut: a flow the job
// opened to an address the host rewrites to an allowed one survives a
// policy change that still allows it.
func TestApplyKeepsDNATedFlows(t *testing.T) {
	m := ctManager(t)
	th, _ := ctTestHost(t)
	var peer net.PacketConn
	if err := th.Do(func() error {
		var err error
		peer, err = net.ListenPacket("udp4", net.JoinHostPort(th.IP.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	udpPort := peer.LocalAddr().(*net.UDPAddr).Port

	n := ctJob(t, m, Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(th.IP, 32)}}})
	// A virtual address (TEST-NET-1) the host rewrites to the test host,
	// as a load balancer or a service proxy would.
	vip := netip.MustParseAddr("192.0.2.77")
	dnat := &nftables.Table{Name: fmt.Sprintf("ctdnat%d_%d", os.Getpid(), ctSeq.Add(1)), Family: nftables.TableFamilyIPv4}
	if err := m.commit(context.Background(), func(c *nftables.Conn) error {
		c.AddTable(dnat)
		accept := nftables.ChainPolicyAccept
		pre := c.AddChain(&nftables.Chain{Name: "pre", Table: dnat, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
		// iifname VETH ip daddr VIP udp dport 7777 dnat to TESTHOST:PORT
		c.AddRule(&nftables.Rule{Table: dnat, Chain: pre, Exprs: slices.Concat(
			ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, n.veth),
			addrIs(ipv4.daddr, expr.CmpOpEq, vip),
			[]expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(7777)},
				&expr.Immediate{Register: 1, Data: th.IP.AsSlice()},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(uint16(udpPort))},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
			})})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.deleteTables(context.Background(), dnat.Name); err != nil {
			t.Errorf("remove the DNAT table: %v", err)
		}
	})

	received := udpFlow(t, n.Path(), peer, &net.UDPAddr{IP: vip.AsSlice(), Port: 7777}, "the test host got nothing from the job through the DNAT")
	if !received("answer") {
		t.Fatal("the job did not get the answer while the policy allowed it")
	}
	wider := Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(th.IP, 32)}, {Prefix: netip.MustParsePrefix("203.0.113.0/24")}}}
	if err := n.Apply(context.Background(), wider, 2); err != nil {
		t.Fatal(err)
	}
	if !received("after widening") {
		t.Error("a wider policy cut a flow to an allowed destination the host reached by DNAT")
	}
}

// udpFlow opens a UDP socket in the job's namespace at path, sends to dst
// and waits for the peer to get it (failing with what otherwise); it
// returns a probe that has the peer answer msg and reports whether the
// job received it.
func udpFlow(t *testing.T, path string, peer net.PacketConn, dst net.Addr, what string) func(msg string) bool {
	t.Helper()
	var job net.PacketConn
	if err := nettest.InPath(path, func() error {
		var err error
		job, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Close() })
	if _, err := job.WriteTo([]byte("ping"), dst); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, from, err := peer.ReadFrom(buf)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return func(msg string) bool {
		t.Helper()
		if _, err := peer.WriteTo([]byte(msg), from); err != nil {
			t.Fatal(err)
		}
		_ = job.SetReadDeadline(time.Now().Add(time.Second))
		k, _, err := job.ReadFrom(buf)
		return err == nil && string(buf[:k]) == msg
	}
}
