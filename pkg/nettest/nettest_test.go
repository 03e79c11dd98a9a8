package nettest

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestSubnet(t *testing.T) {
	for _, tc := range []struct {
		p      string
		length int
		i      int
		want   string
	}{
		{"198.18.0.0/15", 30, 0, "198.18.0.0/30"},
		{"198.18.0.0/15", 30, 1, "198.18.0.4/30"},
		{"198.18.0.0/15", 30, 64, "198.18.1.0/30"},
		{"198.18.0.0/15", 30, 16384, "198.19.0.0/30"},
		{"198.18.0.0/15", 30, 32767, "198.19.255.252/30"},
		{"203.0.113.0/24", 30, 5, "203.0.113.20/30"},
		{"203.0.113.7/24", 24, 0, "203.0.113.0/24"},
		{"fd8e:7a1c::/32", 64, 0x1234<<16 | 0x56, "fd8e:7a1c:1234:56::/64"},
		{"fd00::/8", 72, 1, "fd00:0:0:0:100::/72"},
		{"fd00::/8", 64, 1<<56 - 1, "fdff:ffff:ffff:ffff::/64"},
	} {
		if got := Subnet(netip.MustParsePrefix(tc.p), tc.length, tc.i); got != netip.MustParsePrefix(tc.want) {
			t.Errorf("Subnet(%s, %d, %d) = %s, want %s", tc.p, tc.length, tc.i, got, tc.want)
		}
	}
	for _, tc := range []struct {
		p         string
		length, i int
	}{
		{"203.0.113.0/24", 30, 64},
		{"203.0.113.0/24", 30, -1},
		{"203.0.113.0/24", 16, 0},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Subnet(%s, %d, %d) did not panic", tc.p, tc.length, tc.i)
				}
			}()
			Subnet(netip.MustParsePrefix(tc.p), tc.length, tc.i)
		}()
	}
}

// A test host answers on its pair's addresses, on its loopback addresses
// for traffic routed to it, and from inside itself; when its test ends
// nothing of it is left on the host.
func TestHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("the nettest tests must run as root, not uid %d", os.Geteuid())
	}
	pid := os.Getpid()
	name := fmt.Sprintf("ntt%06x", pid&0xffffff)
	cfg := Config{
		Name:    name,
		Prefix:  Subnet(netip.MustParsePrefix("10.216.0.0/16"), 30, pid%16384),
		Prefix6: Subnet(netip.MustParsePrefix("fd8e:7a1e::/32"), 64, pid&0xffffffff),
		Local:   []netip.Addr{netip.MustParseAddr("169.254.169.254")},
		Table:   1<<24 + pid,
	}
	cfg.RouteFrom = []netip.Prefix{netip.PrefixFrom(cfg.Prefix.Addr().Next(), 32)}
	t.Run("serve", func(t *testing.T) {
		th := Start(t, cfg)
		if th.HostIP != cfg.Prefix.Addr().Next() || th.IP != th.HostIP.Next() || th.IP6 != cfg.Prefix6.Addr().Next().Next() {
			t.Fatalf("addresses %s %s %s %s from %s %s", th.HostIP, th.IP, th.HostIP6, th.IP6, cfg.Prefix, cfg.Prefix6)
		}
		greet := th.Listen(t, "tcp4", net.JoinHostPort(th.IP.String(), "0"))
		Greet(t, greet)
		echo := th.Listen(t, "tcp", ":0")
		Echo(t, echo)
		echoPort := fmt.Sprint(echo.Addr().(*net.TCPAddr).Port)

		hello(t, "the greeter", nil, greet.Addr().String())
		c := hello(t, "the echo over IPv6", nil, net.JoinHostPort(th.IP6.String(), echoPort))
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		fmt.Fprintln(c, "ping")
		if line, err := bufio.NewReader(c).ReadString('\n'); line != "ping\n" {
			t.Errorf("echo: %q, %v", line, err)
		}
		c.Close()
		// Only traffic from the routed source reaches the test host's
		// loopback address.
		local := net.JoinHostPort(cfg.Local[0].String(), echoPort)
		hello(t, "a local address, routed", &net.TCPAddr{IP: th.HostIP.AsSlice()}, local).Close()

		var inside bool
		if err := th.Do(func() error {
			here, err := netns.Get()
			if err != nil {
				return err
			}
			defer here.Close()
			inside = here.Equal(th.ns)
			return nil
		}); err != nil || !inside {
			t.Errorf("Do: inside the test host %v, %v", inside, err)
		}
		c, err := DialFrom(fmt.Sprintf("/proc/self/fd/%d", th.ns), net.JoinHostPort("127.0.0.1", echoPort), time.Second)
		if err != nil {
			t.Fatalf("DialFrom inside the test host: %v", err)
		}
		c.Close()
	})
	if _, err := netlink.LinkByName(name + "h"); err == nil {
		t.Errorf("link %sh left after the test", name)
	}
	rules, err := netlink.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.Table == cfg.Table {
			t.Errorf("rule left after the test: %v", r)
		}
	}
}

// hello dials addr from the host, from the source local if set, and checks
// the greeting.
func hello(t *testing.T, what string, local *net.TCPAddr, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 3 * time.Second}
	if local != nil {
		d.LocalAddr = local
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("%s: dial %s: %v", what, addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); line != Greeting+"\n" {
		t.Fatalf("%s: greeting %q, %v", what, line, err)
	}
	return c
}
