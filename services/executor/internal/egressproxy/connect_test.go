package egressproxy

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// An allowed name goes through CONNECT end to end: the client verifies the
// upstream's certificate for the name, and the upstream saw the name as SNI
// and Host. Each connection is one lookup and one dial, to the address the
// lookup gave (IPv6, and a mapped IPv4 answer dialled as IPv4).
func TestConnectAllowed(t *testing.T) {
	h := newHarness(t)
	c := h.proxyClient()
	for i, tc := range []struct {
		name, addr, rule string
	}{
		{"api.example.com", "203.0.113.10:443", "allowed by api.example.com ports [80 443]"},
		{"x.pkg.example.com", "203.0.113.10:443", "allowed by *.pkg.example.com ports [80 443]"},
		{"only443.example.com", "203.0.113.10:443", "allowed by only443.example.com ports [443]"},
		{"v6.example.com", "[2001:db8::10]:443", "allowed by v6.example.com"},
		{"mapped.example.com", "203.0.113.10:443", "allowed by mapped.example.com"},
	} {
		status, body := get(t, c, "https://"+tc.name+"/hello")
		if want := "host=" + tc.name + " path=/hello sni=" + tc.name; status != http.StatusOK || body != want {
			t.Errorf("%s: %d %q, want 200 %q", tc.name, status, body, want)
		}
		want{Mode: ModeConnect, Name: tc.name, Port: 443, Allowed: true, Reason: tc.rule, Addr: tc.addr, End: endedByPeers}.check(t, h.nth(i+1))
		if n := h.res.count(tc.name); n != 1 {
			t.Errorf("%s was looked up %d times, want 1", tc.name, n)
		}
		if d := h.dials(); len(d) != i+1 || d[i].String() != tc.addr {
			t.Errorf("dialled %v, want %s last of %d", d, tc.addr, i+1)
		}
	}
}

// Names the policy does not allow, addresses, and ports it does not list
// are refused before anything is looked up or dialled; names that resolve
// to an internal address (in any form, or among public ones) are refused
// before anything is dialled, saying which address and why.
func TestConnectRefused(t *testing.T) {
	h := newHarness(t)
	for i, tc := range []struct {
		target string
		status int
		name   string
		port   uint16
		reason string
		lookup bool
	}{
		{"denied.example.com:443", 403, "denied.example.com", 443, "denied.example.com is not in the policy", false},
		{"pkg.example.com:443", 403, "pkg.example.com", 443, "pkg.example.com is not in the policy (*.pkg.example.com matches only names below it)", false},
		{"a.b.pkg.example.com:443", 403, "a.b.pkg.example.com", 443, "a.b.pkg.example.com is not in the policy", false},
		{"203.0.113.10:443", 403, "203.0.113.10", 443, "203.0.113.10 is an IP address: a domain policy allows names only", false},
		{"[2001:db8::10]:443", 403, "2001:db8::10", 443, "2001:db8::10 is an IP address", false},
		{"127.1:443", 403, "127.1", 443, "127.1 looks like an IP address", false},
		{"api.example.com:8443", 403, "api.example.com", 8443, "port 8443 is not allowed for api.example.com (the policy has api.example.com ports [80 443])", false},
		{"only443.example.com:80", 403, "only443.example.com", 80, "port 80 is not allowed for only443.example.com", false},
		{"API.Example.COM.:22", 403, "api.example.com", 22, "port 22 is not allowed for api.example.com", false},
		{"lo.rebind.example.com:443", 403, "lo.rebind.example.com", 443, "lo.rebind.example.com resolves to an internal address, so the name is refused whatever else it resolves to: 127.0.0.1 is loopback", true},
		{"meta.rebind.example.com:443", 403, "meta.rebind.example.com", 443, "169.254.169.254 is link-local (cloud metadata)", true},
		{"mapped.rebind.example.com:443", 403, "mapped.rebind.example.com", 443, "::ffff:127.0.0.1 embeds 127.0.0.1, which is loopback", true},
		{"sixtofour.rebind.example.com:443", 403, "sixtofour.rebind.example.com", 443, "2002:7f00:1:: embeds 127.0.0.1, which is loopback", true},
		{"host.rebind.example.com:443", 403, "host.rebind.example.com", 443, "203.0.113.77 is refused by this executor (203.0.113.77/32)", true},
		{"pool.rebind.example.com:443", 403, "pool.rebind.example.com", 443, "2001:db8:77::5 is refused by this executor (2001:db8:77::/48)", true},
		{"mixed.rebind.example.com:443", 403, "mixed.rebind.example.com", 443, "10.0.0.5 is private", true},
		{"mixed6.rebind.example.com:443", 403, "mixed6.rebind.example.com", 443, "fd00:ec2::254 is AWS metadata", true},
		{"nxdomain.rebind.example.com:443", 502, "nxdomain.rebind.example.com", 443, "resolving nxdomain.rebind.example.com: lookup nxdomain.rebind.example.com: no such host", true},
	} {
		_, _, status, body := h.connect(tc.target)
		if status != tc.status || !strings.Contains(body, tc.reason) {
			t.Errorf("CONNECT %s: %d %q, want %d %q", tc.target, status, body, tc.status, tc.reason)
		}
		want{Mode: ModeConnect, Name: tc.name, Port: tc.port, Reason: tc.reason}.check(t, h.nth(i+1))
		if looked := h.res.count(tc.name) > 0; looked != tc.lookup {
			t.Errorf("CONNECT %s: looked up %v, want %v", tc.target, looked, tc.lookup)
		}
	}
	if d := h.dials(); len(d) != 0 {
		t.Errorf("dialled %v, want nothing", d)
	}
}

// The tunnel carries a TLS ClientHello whose SNI is the CONNECT name, or
// nothing is dialled: another allowed name's SNI, no SNI, or no TLS at all
// is refused once the hello is read.
func TestConnectSNI(t *testing.T) {
	h := newHarness(t)
	for i, tc := range []struct {
		what   string
		send   func(*harness, net.Conn) error
		reason string
	}{
		{"another allowed name's SNI", handshake(&tls.Config{ServerName: "other.example.com"}),
			`the ClientHello's SNI "other.example.com" is not the CONNECT name api.example.com`},
		{"no SNI", handshake(&tls.Config{InsecureSkipVerify: true}),
			"the ClientHello for api.example.com has no SNI"},
		{"plain HTTP in the tunnel", func(_ *harness, c net.Conn) error {
			_, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
			if err == nil {
				_, err = c.Read(make([]byte, 1))
			}
			return err
		}, "CONNECT carries TLS only: no TLS ClientHello"},
	} {
		c, br, status, _ := h.connect("api.example.com:443")
		if status != http.StatusOK {
			t.Fatalf("%s: CONNECT answered %d", tc.what, status)
		}
		if br.Buffered() != 0 {
			t.Fatalf("%s: bytes after the 200", tc.what)
		}
		if err := tc.send(h, c); err == nil {
			t.Errorf("%s: the tunnel worked", tc.what)
		}
		want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Reason: tc.reason}.check(t, h.nth(i+1))
	}
	if d := h.dials(); len(d) != 0 {
		t.Errorf("dialled %v, want nothing", d)
	}
}

// handshake is a TLS client's hello and handshake, with the test's roots.
func handshake(cfg *tls.Config) func(*harness, net.Conn) error {
	return func(h *harness, c net.Conn) error {
		cfg := cfg.Clone()
		cfg.RootCAs = h.roots
		tc := tls.Client(c, cfg)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		return tc.Handshake()
	}
}

// A resolver that answers public first and loopback next gets the second
// connection refused: each connection looks the name up once, and dials
// what that lookup vetted.
func TestRebindingBetweenConnections(t *testing.T) {
	h := newHarness(t)
	status, body := get(t, h.proxyClient(), "https://flip.rebind.example.com/")
	if status != http.StatusOK || !strings.Contains(body, "sni=flip.rebind.example.com") {
		t.Fatalf("first: %d %q", status, body)
	}
	want{Mode: ModeConnect, Name: "flip.rebind.example.com", Port: 443, Allowed: true, Reason: "allowed by *.rebind.example.com", Addr: "203.0.113.10:443", End: endedByPeers}.check(t, h.nth(1))
	_, _, status, body = h.connect("flip.rebind.example.com:443")
	if status != http.StatusForbidden || !strings.Contains(body, "127.0.0.1 is loopback") {
		t.Errorf("second: %d %q, want 403 loopback", status, body)
	}
	want{Mode: ModeConnect, Name: "flip.rebind.example.com", Port: 443, Reason: "127.0.0.1 is loopback"}.check(t, h.nth(2))
	if n := h.res.count("flip.rebind.example.com"); n != 2 {
		t.Errorf("%d lookups, want 2 (one a connection)", n)
	}
	if d := h.dials(); len(d) != 1 || d[0].String() != "203.0.113.10:443" {
		t.Errorf("dialled %v, want only 203.0.113.10:443", d)
	}
}

// What Config.Refused says is asked at every decision: an address the host
// gains while the job runs is refused from then on.
func TestRefusedIsAskedEachTime(t *testing.T) {
	var refused atomic.Pointer[[]netip.Prefix]
	refused.Store(&[]netip.Prefix{})
	h := newHarness(t, withConfig(func(c *Config) {
		c.Refused = func() []netip.Prefix { return *refused.Load() }
	}))
	if status, _ := get(t, h.proxyClient(), "http://api.example.com/plain"); status != http.StatusOK {
		t.Fatalf("before: %d", status)
	}
	refused.Store(&[]netip.Prefix{netip.MustParsePrefix("203.0.113.10/32")})
	if status, _ := get(t, h.proxyClient(), "http://api.example.com/plain"); status != http.StatusForbidden {
		t.Fatalf("after the host took the address: %d, want 403", status)
	}
	// The first connection's decision may come second: it is recorded
	// when that connection ends.
	var refusedOne *Decision
	for _, d := range h.waitDecisions(2) {
		if !d.Allowed {
			refusedOne = &d
		}
	}
	if refusedOne == nil || !strings.Contains(refusedOne.Reason, "refused by this executor (203.0.113.10/32)") {
		t.Errorf("decisions %+v; want a refusal naming the address", h.waitDecisions(2))
	}
}
