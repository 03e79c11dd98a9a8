package netpolicy

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// These tests need root, nft and kernel support for veth and nf_tables.
// They send traffic only to namespaces they make: the test host's
// addresses are from 198.18.0.0/15 (RFC 2544), and a policy-routing rule
// per test sends everything from its jobs' pools (and from the host's
// address facing the test host) into the test host, which owns the
// metadata and link-local addresses the tests probe. So even a broken rule
// set sends nothing off the machine, and test processes running at once
// do not share a route.

var seq atomic.Int64

// tag is unique per test process and call, for link names and subnets.
func tag() (string, int) {
	n := int(seq.Add(1))
	return fmt.Sprintf("%04x%02x", os.Getpid()&0xffff, n&0xff), n
}

// inNS runs fn on a thread inside the namespace at path. The thread is
// never unlocked, so it ends with the goroutine and is never reused.
func inNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// dialFrom connects from inside the namespace at path to addr and reads
// the test host's greeting.
func dialFrom(path, addr string, timeout time.Duration) error {
	return inNS(path, func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read greeting: %w", err)
		}
		if line != greeting+"\n" {
			return fmt.Errorf("greeting %q", line)
		}
		return nil
	})
}

// connFrom opens a connection from inside the namespace at path; the
// connection stays usable from any thread.
func connFrom(path, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNS(path, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 700*time.Millisecond)
		return err
	})
	return c, err
}

const greeting = "hello from the test host"

// testHost is a namespace of the test's own, joined to the host by a veth
// pair, with TCP listeners that greet and then echo lines.
type testHost struct {
	path     string
	hostIP   netip.Addr // the host's end of the pair: a host address
	ip       netip.Addr // the test host's address on the pair
	other    netip.Addr // a second address of the test host
	meta     netip.Addr // 169.254.169.254, on the test host
	ll       netip.Addr // another link-local address, on the test host
	ports    [2]int     // listening on every address of the test host
	hostPort int        // a listener on the host's own addresses (hostIP, 127.0.0.1)
	ip6      netip.Addr // the test host's IPv6 address (fd... ULA)
}

// startTestHost makes the test host and routes everything from m's pools
// to it.
func startTestHost(t *testing.T, m *Manager) *testHost {
	t.Helper()
	tg, n := tag()
	hostIf, peerIf := "npt"+tg+"h", "npt"+tg+"p"
	base := ((os.Getpid()%256)*64 + n%64) * 4
	pfx := fmt.Sprintf("198.18.%d.%d", base>>8&0xff, base&0xff)
	th := &testHost{
		hostIP: netip.MustParseAddr(pfx).Next(),
		meta:   netip.MustParseAddr("169.254.169.254"),
		ll:     netip.MustParseAddr("169.254.77.1"),
		other:  netip.MustParseAddr(fmt.Sprintf("198.19.%d.%d", base>>8&0xff, base&0xff+1)),
		ip6:    netip.MustParseAddr(fmt.Sprintf("fd8e:7a1c:%x:%x::2", os.Getpid()&0xffff, n&0xffff)),
	}
	th.ip = th.hostIP.Next()

	dir := t.TempDir()
	th.path = filepath.Join(dir, "testhost")
	if err := os.WriteFile(th.path, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := makeNetns(th.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeNetns(th.path); err != nil {
			t.Error(err)
		}
	})
	ns, err := netns.GetFromPath(th.path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: peerIf, PeerNamespace: netlink.NsFd(ns)}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	t.Cleanup(func() { _ = deleteLink(hostIf) })
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	host6 := th.ip6.Prev()
	must(netlink.LinkSetIP6AddrGenMode(host, nl.IN6_ADDR_GEN_MODE_NONE))
	must(netlink.AddrAdd(host, nlAddr(netip.PrefixFrom(th.hostIP, 30))))
	must(netlink.AddrAdd(host, nlAddr(netip.PrefixFrom(host6, 64))))
	must(netlink.LinkSetUp(host))
	// Everything from the jobs, and from the host's address facing the
	// test host (for the control dials), goes to the test host, whatever
	// its destination.
	table := 20000 + (os.Getpid()%1000)*64 + n%64
	must(netlink.RouteAdd(&netlink.Route{Table: table, LinkIndex: host.Attrs().Index, Gw: th.ip.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}))
	must(netlink.RouteAdd(&netlink.Route{Table: table, LinkIndex: host.Attrs().Index, Gw: th.ip6.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}))
	for _, src := range []netip.Prefix{m.cfg.Pool4, m.cfg.Pool6, netip.PrefixFrom(th.hostIP, 32), netip.PrefixFrom(host6, 128)} {
		if !src.IsValid() {
			continue
		}
		rule := netlink.NewRule()
		rule.Table = table
		rule.Priority = 100
		rule.Src = &net.IPNet{IP: src.Addr().AsSlice(), Mask: net.CIDRMask(src.Bits(), src.Addr().BitLen())}
		rule.Family = unix.AF_INET
		if src.Addr().Is6() {
			rule.Family = unix.AF_INET6
		}
		must(netlink.RuleAdd(rule))
		t.Cleanup(func() {
			if err := netlink.RuleDel(rule); err != nil {
				t.Errorf("delete rule %v: %v", rule, err)
			}
		})
	}

	h, err := netlink.NewHandleAt(ns)
	must(err)
	defer h.Close()
	peer, err := h.LinkByName(peerIf)
	must(err)
	must(h.LinkSetIP6AddrGenMode(peer, nl.IN6_ADDR_GEN_MODE_NONE))
	must(h.AddrAdd(peer, nlAddr(netip.PrefixFrom(th.ip, 30))))
	must(h.AddrAdd(peer, nlAddr(netip.PrefixFrom(th.ip6, 64))))
	must(h.LinkSetUp(peer))
	lo, err := h.LinkByName("lo")
	must(err)
	for _, a := range []netip.Addr{th.other, th.meta, th.ll} {
		must(h.AddrAdd(lo, nlAddr(netip.PrefixFrom(a, 32))))
	}
	waitFor(t, "the test host's veth to come up", func() bool {
		a, err1 := netlink.LinkByName(hostIf)
		b, err2 := h.LinkByName(peerIf)
		return err1 == nil && err2 == nil && a.Attrs().OperState == netlink.OperUp && b.Attrs().OperState == netlink.OperUp
	})
	// Replies go back to the host, which routes them on to the jobs.
	must(h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: th.hostIP.AsSlice()}))
	must(h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: host6.AsSlice()}))

	for i := range th.ports {
		var ln net.Listener
		must(inNS(th.path, func() error {
			var err error
			ln, err = net.Listen("tcp", ":0")
			return err
		}))
		th.ports[i] = ln.Addr().(*net.TCPAddr).Port
		serve(t, ln)
	}
	// The host's own services: a job must reach none of them, on any of
	// the host's addresses.
	for _, a := range []string{th.hostIP.String(), "127.0.0.1"} {
		ln, err := net.Listen("tcp4", net.JoinHostPort(a, fmt.Sprint(th.hostPort)))
		must(err)
		th.hostPort = ln.Addr().(*net.TCPAddr).Port
		serve(t, ln)
	}
	return th
}

// serve greets every connection, then echoes its lines.
func serve(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(time.Minute))
				fmt.Fprintln(c, greeting)
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func (th *testHost) addr(a netip.Addr, port int) string {
	return net.JoinHostPort(a.String(), fmt.Sprint(port))
}

// linksIn lists the link names in the namespace at path.
func linksIn(t *testing.T, path string) []string {
	t.Helper()
	h, err := handleAt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names
}

func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
