package netpolicy

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// These tests need root and kernel support for veth and nf_tables.
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

// dialFrom connects from inside the namespace at path to addr and reads
// the test host's greeting.
func dialFrom(path, addr string, timeout time.Duration) error {
	c, err := nettest.DialFrom(path, addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if line != nettest.Greeting+"\n" {
		return fmt.Errorf("greeting %q", line)
	}
	return nil
}

// testHost is a test host (package nettest) with TCP listeners that greet
// and then echo lines.
type testHost struct {
	hostIP   netip.Addr // the host's end of the pair: a host address
	ip       netip.Addr // the test host's address on the pair
	other    netip.Addr // a second address of the test host
	meta     netip.Addr // 169.254.169.254, on the test host
	ll       netip.Addr // another link-local address, on the test host
	ports    [2]int     // listening on every address of the test host
	hostPort int        // a listener on the host's own addresses (hostIP, 127.0.0.1)
	ip6      netip.Addr // the test host's IPv6 address (fd... ULA)
	host     *nettest.Host
}

// startTestHost makes the test host and routes everything from m's pools
// to it.
func startTestHost(t *testing.T, m *Manager) *testHost {
	t.Helper()
	tg, n := tag()
	i := (os.Getpid()%256)*64 + n%64
	cfg := nettest.Config{
		Name:    "npt" + tg,
		Prefix:  nettest.Subnet(netip.MustParsePrefix("198.18.0.0/16"), 30, i),
		Prefix6: nettest.Subnet(netip.MustParsePrefix("fd8e:7a1c::/32"), 64, (os.Getpid()&0xffff)<<16|n&0xffff),
		Local: []netip.Addr{
			nettest.Subnet(netip.MustParsePrefix("198.19.0.0/16"), 30, i).Addr().Next(),
			netip.MustParseAddr("169.254.169.254"),
			netip.MustParseAddr("169.254.77.1"),
		},
		Table: 20000 + (os.Getpid()%1000)*64 + n%64,
	}
	// Everything from the jobs, and from the host's address facing the
	// test host (for the control dials), goes to the test host, whatever
	// its destination.
	for _, src := range []netip.Prefix{m.cfg.Pool4, m.cfg.Pool6,
		netip.PrefixFrom(cfg.Prefix.Addr().Next(), 32), netip.PrefixFrom(cfg.Prefix6.Addr().Next(), 128)} {
		if src.IsValid() {
			cfg.RouteFrom = append(cfg.RouteFrom, src)
		}
	}
	h := nettest.Start(t, cfg)
	th := &testHost{hostIP: h.HostIP, ip: h.IP, other: cfg.Local[0], meta: cfg.Local[1], ll: cfg.Local[2], ip6: h.IP6, host: h}
	for i := range th.ports {
		ln := h.Listen(t, "tcp", ":0")
		th.ports[i] = ln.Addr().(*net.TCPAddr).Port
		nettest.Echo(t, ln)
	}
	// The host's own services: a job must reach none of them, on any of
	// the host's addresses.
	for _, a := range []string{th.hostIP.String(), "127.0.0.1"} {
		ln, err := net.Listen("tcp4", net.JoinHostPort(a, fmt.Sprint(th.hostPort)))
		if err != nil {
			t.Fatal(err)
		}
		th.hostPort = ln.Addr().(*net.TCPAddr).Port
		nettest.Echo(t, ln)
	}
	return th
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
