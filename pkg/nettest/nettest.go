// Package nettest makes test hosts for tests of network isolation: a
// network namespace of the test's own, joined to the host by a veth pair,
// with TCP listeners that greet, which sandboxed jobs must (or must not)
// reach. It also runs code inside a network namespace on a thread that is
// never reused. Only tests import it.
package nettest

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Greeting is the line a test host's listener sends first.
const Greeting = "hello from the test host"

// Config says what a test host looks like. Every name and address must be
// unique to the test and to its process: test binaries run at once on one
// machine.
type Config struct {
	// Name stems the pair's links: Name+"h" on the host, Name+"p" in the
	// test host. At most 14 characters.
	Name string
	// Prefix is the pair's IPv4 subnet, one that is routed nowhere (such
	// as a /30 of 198.18.0.0/15): the host's end takes its first address,
	// the test host its second.
	Prefix netip.Prefix
	// Prefix6, if valid, is the pair's IPv6 subnet, addressed the same way.
	Prefix6 netip.Prefix
	// Local are more addresses of the test host, on its loopback.
	Local []netip.Addr
	// RouteFrom, if set, sends everything from these sources to the test
	// host whatever its destination: a policy-routing rule per source into
	// Table, so even traffic a broken rule set lets out stays on the
	// machine.
	RouteFrom []netip.Prefix
	// Table is the routing table RouteFrom uses, unique to the test.
	Table int
}

// Host is a running test host. The test's cleanup closes its listeners,
// rules and links, and with the last of them its namespace.
type Host struct {
	Prefix, Prefix6 netip.Prefix // the pair's subnets, as configured
	HostIP, IP      netip.Addr   // the host's end of the pair, and the test host's
	HostIP6, IP6    netip.Addr   // the same for IPv6, if Config.Prefix6 was set
	ns              netns.NsHandle
}

// Start makes a test host.
func Start(t testing.TB, cfg Config) *Host {
	t.Helper()
	if len(cfg.Name) == 0 || len(cfg.Name) > unix.IFNAMSIZ-2 {
		t.Fatalf("nettest: link name stem %q: want 1 to %d characters", cfg.Name, unix.IFNAMSIZ-2)
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("nettest: %s: %v", what, err)
		}
	}
	th := &Host{Prefix: cfg.Prefix.Masked(), Prefix6: cfg.Prefix6.Masked(), HostIP: cfg.Prefix.Masked().Addr().Next()}
	th.IP = th.HostIP.Next()
	if cfg.Prefix6.IsValid() {
		th.HostIP6 = cfg.Prefix6.Masked().Addr().Next()
		th.IP6 = th.HostIP6.Next()
	}
	hostIf, peerIf := cfg.Name+"h", cfg.Name+"p"

	var err error
	th.ns, err = newNS()
	must("new network namespace", err)
	t.Cleanup(func() { th.ns.Close() })
	must("add veth", netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf},
		PeerName: peerIf, PeerNamespace: netlink.NsFd(th.ns)}))
	t.Cleanup(func() {
		// Deleting one end deletes the other, and the routes through it.
		if l, err := netlink.LinkByName(hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	h, err := netlink.NewHandleAt(th.ns)
	must("netlink in the test host", err)
	defer h.Close()

	host, err := netlink.LinkByName(hostIf)
	must("find "+hostIf, err)
	peer, err := h.LinkByName(peerIf)
	must("find "+peerIf, err)
	lo, err := h.LinkByName("lo")
	must("find the test host's lo", err)
	// No link-local IPv6 addresses on the pair: only the ones asked for.
	must("IPv6 address generation", netlink.LinkSetIP6AddrGenMode(host, nl.IN6_ADDR_GEN_MODE_NONE))
	must("IPv6 address generation", h.LinkSetIP6AddrGenMode(peer, nl.IN6_ADDR_GEN_MODE_NONE))
	must("address the host end", netlink.AddrAdd(host, addr(th.HostIP, cfg.Prefix.Bits())))
	must("address the test host", h.AddrAdd(peer, addr(th.IP, cfg.Prefix.Bits())))
	if cfg.Prefix6.IsValid() {
		must("address the host end", netlink.AddrAdd(host, addr(th.HostIP6, cfg.Prefix6.Bits())))
		must("address the test host", h.AddrAdd(peer, addr(th.IP6, cfg.Prefix6.Bits())))
	}
	for _, a := range cfg.Local {
		must("address the test host's lo", h.AddrAdd(lo, addr(a, a.BitLen())))
	}
	must("host end up", netlink.LinkSetUp(host))
	must("test host end up", h.LinkSetUp(peer))
	must("test host lo up", h.LinkSetUp(lo))
	end := time.Now().Add(5 * time.Second)
	for {
		a, err1 := netlink.LinkByName(hostIf)
		b, err2 := h.LinkByName(peerIf)
		if err1 == nil && err2 == nil && a.Attrs().OperState == netlink.OperUp && b.Attrs().OperState == netlink.OperUp {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("nettest: timed out waiting for the veth %s to come up", hostIf)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Replies go back to the host, which routes them on (to the jobs).
	must("test host's default route", h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: th.HostIP.AsSlice()}))
	if cfg.Prefix6.IsValid() {
		must("test host's default route", h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: th.HostIP6.AsSlice()}))
	}

	if len(cfg.RouteFrom) > 0 {
		th.routeFrom(t, cfg, host.Attrs().Index)
	}
	return th
}

// routeFrom sends everything from cfg.RouteFrom through the link at index
// to the test host.
func (th *Host) routeFrom(t testing.TB, cfg Config, index int) {
	t.Helper()
	gw := map[int][]byte{unix.AF_INET: th.IP.AsSlice()}
	if th.IP6.IsValid() {
		gw[unix.AF_INET6] = th.IP6.AsSlice()
	}
	for family, ip := range gw {
		if err := netlink.RouteAdd(&netlink.Route{Table: cfg.Table, LinkIndex: index, Gw: ip,
			Dst: &net.IPNet{IP: make(net.IP, len(ip)), Mask: net.CIDRMask(0, 8*len(ip))}}); err != nil {
			t.Fatalf("nettest: default route (family %d) in table %d: %v", family, cfg.Table, err)
		}
	}
	for _, src := range cfg.RouteFrom {
		rule := netlink.NewRule()
		rule.Table = cfg.Table
		rule.Priority = 100
		rule.Src = &net.IPNet{IP: src.Addr().AsSlice(), Mask: net.CIDRMask(src.Bits(), src.Addr().BitLen())}
		rule.Family = unix.AF_INET
		if src.Addr().Is6() {
			rule.Family = unix.AF_INET6
		}
		if err := netlink.RuleAdd(rule); err != nil {
			t.Fatalf("nettest: rule from %s to table %d: %v", src, cfg.Table, err)
		}
		t.Cleanup(func() {
			if err := netlink.RuleDel(rule); err != nil {
				t.Errorf("nettest: delete rule %v: %v", rule, err)
			}
		})
	}
}

// Listen opens a listener inside the test host, closed when the test ends.
func (th *Host) Listen(t testing.TB, network, address string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := In(th.ns, func() error {
		var err error
		ln, err = net.Listen(network, address)
		return err
	})
	if err != nil {
		t.Fatalf("nettest: listen on %s in the test host: %v", address, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Do runs fn inside the test host (see In).
func (th *Host) Do(fn func() error) error { return In(th.ns, fn) }

// Subnet is the i-th subnet of the given length in p: how tests spread
// their pairs over a range by process and call. It panics if p has no i-th.
func Subnet(p netip.Prefix, length, i int) netip.Prefix {
	if n := length - p.Bits(); i < 0 || n < 0 || n < 63 && i >= 1<<n {
		panic(fmt.Sprintf("nettest: %s has no subnet /%d number %d", p, length, i))
	}
	a := p.Masked().Addr().As16()
	hi, lo := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
	shift := uint(p.Addr().BitLen() - length) // the subnet's host bits
	var offHi, offLo uint64
	if shift >= 64 {
		offHi = uint64(i) << (shift - 64)
	} else {
		offHi, offLo = uint64(i)>>(64-shift), uint64(i)<<shift
	}
	lo, carry := bits.Add64(lo, offLo, 0)
	hi, _ = bits.Add64(hi, offHi, carry)
	binary.BigEndian.PutUint64(a[:8], hi)
	binary.BigEndian.PutUint64(a[8:], lo)
	r := netip.AddrFrom16(a)
	if p.Addr().Is4() {
		r = r.Unmap()
	}
	return netip.PrefixFrom(r, length)
}

// Greet serves ln until the test ends: every connection gets Greeting and
// is closed.
func Greet(t testing.TB, ln net.Listener) {
	serve(t, ln, func(c net.Conn) { fmt.Fprintln(c, Greeting) })
}

// Echo serves ln until the test ends: every connection gets Greeting, then
// each line it sends back, for up to a minute.
func Echo(t testing.TB, ln net.Listener) {
	serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		fmt.Fprintln(c, Greeting)
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
	})
}

// Sink serves ln until the test ends: it reads each connection until it
// has read perConn bytes (or it ends, for up to a minute), then closes it,
// so a sender that waits for the close knows all it sent arrived. It
// returns the count of the bytes read so far, across them all.
func Sink(t testing.TB, ln net.Listener, perConn int64) *atomic.Int64 {
	var n atomic.Int64
	serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		read, _ := io.Copy(io.Discard, io.LimitReader(c, perConn))
		n.Add(read)
	})
	return &n
}

func serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// In runs fn on a thread inside the namespace ns. The thread is never
// unlocked, so it ends with its goroutine and no other goroutine ever runs
// in the namespace; what fn makes there (a socket) stays usable from any
// thread.
func In(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// InPath is In for the namespace bound at path.
func InPath(path string, fn func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer ns.Close()
	return In(ns, fn)
}

// DialFrom connects from inside the namespace bound at path.
func DialFrom(path, address string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := InPath(path, func() error {
		var err error
		c, err = net.DialTimeout("tcp", address, timeout)
		return err
	})
	return c, err
}

// newNS makes a network namespace, held by the handle returned, on a
// thread that ends with it.
func newNS() (netns.NsHandle, error) {
	type res struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// netns.New moves the calling thread into the new namespace; the
		// thread is never unlocked, so it is never reused.
		runtime.LockOSThread()
		ns, err := netns.New()
		ch <- res{ns, err}
	}()
	r := <-ch
	return r.ns, r.err
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}}
	if a.Is6() {
		// The pair is alone on its link: duplicate address detection
		// would only delay the address by a second or more.
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}
