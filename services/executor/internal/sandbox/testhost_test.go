package sandbox

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// newTestHost makes a test host of the test's own (package nettest). Its
// links and its /30 of 198.18.0.0/15 (RFC 2544, benchmarking) are unique
// per test process and call, since two test binaries may run at once, and
// exist only inside the pair. Everything from routeFrom, if given, goes to
// the test host whatever its destination.
func newTestHost(t *testing.T, routeFrom ...netip.Prefix) *nettest.Host {
	t.Helper()
	n := testSeq.Add(1)
	cfg := nettest.Config{
		Name:   fmt.Sprintf("alk%x%02x", os.Getpid()&0xffff, n&0xff),
		Prefix: nettest.Subnet(netip.MustParsePrefix("198.18.0.0/15"), 30, (os.Getpid()%512)*64+int(n%64)),
	}
	if len(routeFrom) > 0 {
		cfg.RouteFrom = routeFrom
		cfg.Table = 30000 + int(n%64) + (os.Getpid()%1000)*64
	}
	return nettest.Start(t, cfg)
}

// startTestHost makes a test host with a TCP listener that greets: the
// destination a deny-all sandbox must not reach while the host can. It
// returns "ip:port".
func startTestHost(t *testing.T) string {
	t.Helper()
	th := newTestHost(t)
	ln := th.Listen(t, "tcp4", net.JoinHostPort(th.IP.String(), "0"))
	nettest.Greet(t, ln)
	return ln.Addr().String()
}
