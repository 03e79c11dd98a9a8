package netpolicy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// serveAs listens on addr:port and greets every connection with who, so a
// probe can tell which service the rules delivered it to.
func serveAs(t *testing.T, addr netip.Addr, port int, who string) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr.String(), fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, who)
			c.Close()
		}
	}()
}

// serveUDPAs answers every datagram on addr:port with who.
func serveUDPAs(t *testing.T, addr netip.Addr, port int, who string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", net.JoinHostPort(addr.String(), fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(who), from)
		}
	}()
}

// greetingFrom connects from the namespace at path and returns the first
// line it is sent.
func greetingFrom(path, addr string, timeout time.Duration) (string, error) {
	c, err := nettest.DialFrom(path, addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// udpFrom sends one datagram from the namespace at path and returns the
// answer.
func udpFrom(path, addr string) (string, error) {
	var got string
	err := nettest.InPath(path, func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(700 * time.Millisecond))
		if _, err := c.Write([]byte("query")); err != nil {
			return err
		}
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		got = string(buf[:n])
		return err
	})
	return got, err
}

// toJobsInMain routes what goes to m's pools by the main table, ahead of
// the test host's rules, which would send the host end's answers (from an
// address of the pool) to the test host.
func toJobsInMain(t *testing.T, m *Manager) {
	t.Helper()
	for _, p := range []netip.Prefix{m.cfg.Pool4, m.cfg.Pool6} {
		if !p.IsValid() {
			continue
		}
		rule := netlink.NewRule()
		rule.Table = unix.RT_TABLE_MAIN
		rule.Priority = 99
		rule.Dst = &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
		rule.Family = unix.AF_INET
		if p.Addr().Is6() {
			rule.Family = unix.AF_INET6
		}
		if err := netlink.RuleAdd(rule); err != nil {
			t.Fatalf("rule to %s by the main table: %v", p, err)
		}
		t.Cleanup(func() { netlink.RuleDel(rule) })
	}
}

func hostsOf(n *Net) []netip.Addr { return n.ProxyAddrs() }

// countOn53 listens on the test host's UDP and TCP 53 and counts what
// arrives; it answers nothing.
func countOn53(t *testing.T, th *testHost, hits *atomic.Int64) {
	t.Helper()
	ln := th.host.Listen(t, "tcp", ":53")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			hits.Add(1)
			c.Close()
		}
	}()
	var pc net.PacketConn
	if err := th.host.Do(func() (err error) { pc, err = net.ListenPacket("udp", ":53"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			hits.Add(1)
		}
	}()
}

// A proxied job reaches exactly its own egress services at the host end of
// its veth: the explicit proxy and DNS where they listen, and every TCP
// connection to port 80 or 443, whatever the address, at the transparent
// listener. Nothing else gets out, not another job's services, not the
// host's, and not after a narrowing that takes the services away.
func TestProxied(t *testing.T) {
	m := newManager(t, true)
	th := startTestHost(t, m)
	checkControl(t, th)
	toJobsInMain(t, m)
	n := create(t, m, Policy{Proxied: true})
	other := create(t, m, Policy{Proxied: true})
	hosts := n.ProxyAddrs()
	if len(hosts) != 2 || !hosts[0].Is4() || !hosts[1].Is6() {
		t.Fatalf("ProxyAddrs = %v, want an IPv4 and an IPv6 address", hosts)
	}
	for _, h := range hosts {
		serveAs(t, h, ExplicitProxyPort, "explicit")
		serveAs(t, h, TransparentPort, "transparent")
		serveAs(t, h, DNSPort, "dns-tcp")
		serveUDPAs(t, h, DNSPort, "dns-udp")
		serveAs(t, h, 2222, "not a service")
	}
	otherHost := other.ProxyAddrs()[0]
	serveAs(t, otherHost, ExplicitProxyPort, "the other job's proxy")
	serveAs(t, otherHost, 2222, "not a service")
	// Control: the host reaches the other job's host end itself, on a
	// port that is not a service's.
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(otherHost.String(), "2222"), time.Second); err != nil {
		t.Fatalf("control: %v", err)
	} else {
		c.Close()
	}
	// But not a job's services: they are for what comes in by its veth.
	for _, a := range []netip.Addr{hostsOf(n)[0], otherHost} {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(a.String(), fmt.Sprint(ExplicitProxyPort)), 700*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("a host process reached the job's proxy at %s", a)
		}
	}
	// The test host counts what reaches its port 53: a refused probe
	// must not be one that got out and found nothing listening.
	var dnsHits atomic.Int64
	countOn53(t, th, &dnsHits)

	h4, h6 := hosts[0], hosts[1]
	at := func(a netip.Addr, port int) string { return net.JoinHostPort(a.String(), fmt.Sprint(port)) }
	type tcpProbe struct {
		addr, want, why string // want "" means refused
	}
	probeAll := func(probes []tcpProbe) {
		t.Helper()
		var wg sync.WaitGroup
		got := make([]string, len(probes))
		errs := make([]error, len(probes))
		for i, p := range probes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				timeout := 700 * time.Millisecond
				if p.want != "" {
					timeout = 3 * time.Second
				}
				got[i], errs[i] = greetingFrom(n.Path(), p.addr, timeout)
			}()
		}
		wg.Wait()
		for i, p := range probes {
			switch {
			case p.want == "" && errs[i] == nil:
				t.Errorf("%s (%s): REACHED %q, want refused", p.addr, p.why, got[i])
			case p.want != "" && (errs[i] != nil || got[i] != p.want):
				t.Errorf("%s (%s): got %q, %v; want %q", p.addr, p.why, got[i], errs[i], p.want)
			default:
				t.Logf("%s (%s): %q %v", p.addr, p.why, got[i], errs[i])
			}
		}
	}
	probeAll([]tcpProbe{
		{at(h4, ExplicitProxyPort), "explicit", "the explicit proxy"},
		{at(h6, ExplicitProxyPort), "explicit", "the explicit proxy over IPv6"},
		{at(th.ip, 443), "transparent", "443 to the test host, redirected"},
		{at(th.ip, 80), "transparent", "80 to the test host, redirected"},
		{at(netip.MustParseAddr("198.51.100.77"), 443), "transparent", "443 to any address, redirected"},
		{at(th.ip6, 443), "transparent", "443 over IPv6, redirected"},
		{at(h4, 53), "dns-tcp", "DNS over TCP, redirected"},
		{at(th.ip, th.ports[0]), "", "another port of the test host"},
		{at(h4, 2222), "", "another port of the host end"},
		{at(th.hostIP, th.hostPort), "", "the host's own address"},
		{at(th.meta, 80), "", "metadata on port 80 (dropped before any redirect)"},
		{at(otherHost, ExplicitProxyPort), "", "another job's proxy"},
		{at(th.ip, 53), "", "TCP 53 of another address"},
	})
	if got, err := udpFrom(n.Path(), at(h4, 53)); err != nil || got != "dns-udp" {
		t.Errorf("UDP 53 to the host end: %q, %v; want the DNS server's answer", got, err)
	}
	if got, err := udpFrom(n.Path(), at(th.ip, 53)); err == nil {
		t.Errorf("UDP 53 to the test host: answered %q, want nothing", got)
	}
	if hits := dnsHits.Load(); hits != 0 {
		t.Errorf("%d packets or connections reached the test host's port 53", hits)
	}

	// Narrowed to nothing: the services are out of reach at once.
	if err := n.Apply(context.Background(), Policy{}, 2); err != nil {
		t.Fatal(err)
	}
	probeAll([]tcpProbe{
		{at(h4, ExplicitProxyPort), "", "the explicit proxy after a narrowing"},
		{at(th.ip, 443), "", "443 after a narrowing"},
	})
}

// A domains job's namespace keeps its veth (FixedInterfaces, as the run
// manager makes it): narrowed to nothing, the rules alone take the
// services away, an open connection to them included, and a later widening
// brings them back at the same addresses.
func TestProxiedFixedNarrowAndWiden(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	toJobsInMain(t, m)
	n := create(t, m, Policy{Proxied: true}, FixedInterfaces())
	h4 := n.ProxyAddrs()[0]
	serveAs(t, h4, ExplicitProxyPort, "explicit")
	// An echo on the transparent port, to hold a connection open.
	ln, err := net.Listen("tcp", net.JoinHostPort(h4.String(), fmt.Sprint(TransparentPort)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					k, err := c.Read(buf)
					if err != nil {
						return
					}
					c.Write(buf[:k])
				}
			}()
		}
	}()
	at := func(port int) string { return net.JoinHostPort(h4.String(), fmt.Sprint(port)) }
	open, err := nettest.DialFrom(n.Path(), net.JoinHostPort(th.ip.String(), "443"), 3*time.Second)
	if err != nil {
		t.Fatalf("the redirected connection: %v", err)
	}
	defer open.Close()
	echo := func() error {
		open.SetDeadline(time.Now().Add(time.Second))
		if _, err := open.Write([]byte("ping")); err != nil {
			return err
		}
		_, err := open.Read(make([]byte, 4))
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("echo before the narrowing: %v", err)
	}
	if got, err := greetingFrom(n.Path(), at(ExplicitProxyPort), 3*time.Second); err != nil || got != "explicit" {
		t.Fatalf("explicit proxy before the narrowing: %q %v", got, err)
	}

	if err := n.Apply(context.Background(), Policy{}, 2); err != nil {
		t.Fatal(err)
	}
	if a := n.ProxyAddrs(); len(a) != 1 || a[0] != h4 {
		t.Fatalf("after the narrowing ProxyAddrs = %v, want the veth kept at %s", a, h4)
	}
	if err := echo(); err == nil {
		t.Error("the open connection to the transparent listener still echoes after the narrowing")
	}
	if got, err := greetingFrom(n.Path(), at(ExplicitProxyPort), 700*time.Millisecond); err == nil {
		t.Errorf("the explicit proxy answered %q after the narrowing", got)
	}

	if err := n.Apply(context.Background(), Policy{Proxied: true}, 3); err != nil {
		t.Fatal(err)
	}
	if got, err := greetingFrom(n.Path(), at(ExplicitProxyPort), 3*time.Second); err != nil || got != "explicit" {
		t.Errorf("explicit proxy after widening again: %q %v", got, err)
	}
}
