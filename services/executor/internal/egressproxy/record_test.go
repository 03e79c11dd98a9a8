package egressproxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The record lists every attempt, in the order they ended, each with its
// mode, name, port, outcome, reason and the address dialled.
func TestDecisionLog(t *testing.T) {
	h := newHarness(t)
	pc, rc := h.proxyClient(), h.redirectedClient()
	steps := []struct {
		do   func()
		want want
	}{
		{func() { get(t, pc, "https://api.example.com/") },
			want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com ports [80 443]", Addr: "203.0.113.10:443", End: endedByPeers}},
		{func() { h.connect("denied.example.com:443") },
			want{Mode: ModeConnect, Name: "denied.example.com", Port: 443, Reason: "denied.example.com is not in the policy"}},
		{func() { h.connect("pkg.example.com:443") },
			want{Mode: ModeConnect, Name: "pkg.example.com", Port: 443, Reason: "(*.pkg.example.com matches only names below it)"}},
		{func() { h.connect("203.0.113.10:443") },
			want{Mode: ModeConnect, Name: "203.0.113.10", Port: 443, Reason: "203.0.113.10 is an IP address"}},
		{func() {
			c, _, _, _ := h.connect("api.example.com:443")
			handshake(&tls.Config{ServerName: "other.example.com"})(h, c)
		}, want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Reason: `the ClientHello's SNI "other.example.com" is not the CONNECT name api.example.com`}},
		{func() {
			c, _, _, _ := h.connect("api.example.com:443")
			handshake(&tls.Config{InsecureSkipVerify: true})(h, c)
		}, want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Reason: "has no SNI"}},
		{func() { h.connect("lo.rebind.example.com:443") },
			want{Mode: ModeConnect, Name: "lo.rebind.example.com", Port: 443, Reason: "127.0.0.1 is loopback"}},
		{func() { h.connect("mixed.rebind.example.com:443") },
			want{Mode: ModeConnect, Name: "mixed.rebind.example.com", Port: 443, Reason: "10.0.0.5 is private"}},
		{func() { h.connect("api.example.com:22") },
			want{Mode: ModeConnect, Name: "api.example.com", Port: 22, Reason: "port 22 is not allowed for api.example.com"}},
		{func() { get(t, pc, "http://api.example.com/p") },
			want{Mode: ModeHTTP, Name: "api.example.com", Port: 80, Allowed: true, Reason: "allowed by api.example.com", Addr: "203.0.113.10:80", End: endedByPeers}},
		{func() { raw(t, h.explicit, "GET http://api.example.com/ HTTP/1.1\r\nHost: other.example.com\r\n\r\n") },
			want{Mode: ModeHTTP, Name: "api.example.com", Port: 80, Reason: "does not name the request's host"}},
		{func() { get(t, rc, "https://x.pkg.example.com/") },
			want{Mode: ModeTransparent, Name: "x.pkg.example.com", Port: 443, Allowed: true, Reason: "allowed by *.pkg.example.com", Addr: "203.0.113.10:443", End: endedByPeers}},
		{func() { get(t, rc, "http://denied.example.com/") },
			want{Mode: ModeTransparent, Name: "denied.example.com", Port: 80, Reason: "denied.example.com is not in the policy"}},
		{func() {
			c, _ := dialTimeout(h.trans)
			defer c.Close()
			handshake(&tls.Config{InsecureSkipVerify: true})(h, c)
		}, want{Mode: ModeTransparent, Port: 443, Reason: "the ClientHello has no SNI"}},
	}
	for i, s := range steps {
		s.do()
		h.waitDecisions(i + 1)
	}
	got := h.waitDecisions(len(steps))
	if len(got) != len(steps) {
		t.Fatalf("%d decisions for %d attempts", len(got), len(steps))
	}
	for i, s := range steps {
		s.want.check(t, got[i])
	}
}

// A ClientHello that arrives a byte at a time is still read whole, and
// replayed whole: the handshake completes end to end.
func TestHelloInPieces(t *testing.T) {
	h := newHarness(t)
	var d net.Dialer
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := d.DialContext(ctx, "tcp", h.trans)
			if err != nil {
				return nil, err
			}
			return &trickle{Conn: c, left: 1 << 20}, nil
		},
		TLSClientConfig:   &tls.Config{RootCAs: h.roots},
		DisableKeepAlives: true,
	}}
	status, body := get(t, c, "https://api.example.com/slow")
	if want := "host=api.example.com path=/slow sni=api.example.com"; status != http.StatusOK || body != want {
		t.Errorf("%d %q, want 200 %q", status, body, want)
	}
	want{Mode: ModeTransparent, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com", Addr: "203.0.113.10:443", End: endedByPeers}.check(t, h.nth(1))
}

// trickle writes its first writes a byte at a time, each in its own
// segment.
type trickle struct {
	net.Conn
	left int
}

func (t *trickle) Write(p []byte) (int, error) {
	if t.left <= 0 {
		return t.Conn.Write(p)
	}
	for i := range p {
		if _, err := t.Conn.Write(p[i : i+1]); err != nil {
			return i, err
		}
		time.Sleep(50 * time.Microsecond)
	}
	t.left -= len(p)
	return len(p), nil
}

// A request head past maxHead is refused; so is a job that sends nothing
// within ConnectTimeout.
func TestSetupLimits(t *testing.T) {
	h := newHarness(t, withConfig(func(c *Config) { c.ConnectTimeout = 300 * time.Millisecond }))
	status, body := raw(t, h.explicit, "GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\nX-Pad: "+strings.Repeat("a", maxHead)+"\r\n\r\n")
	if status != http.StatusBadRequest || !strings.Contains(body, "the request head is longer than 65536 bytes") {
		t.Errorf("long head: %d %q", status, body)
	}
	want{Mode: ModeHTTP, Reason: "the request head is longer than 65536 bytes"}.check(t, h.nth(1))

	c, err := dialTimeout(h.trans)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{0x16, 0x03}) // the start of a hello, and then nothing
	start := time.Now()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a silent connection read something")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a silent connection lasted %s", d)
	}
	want{Mode: ModeTransparent, Reason: "no TLS ClientHello: read tcp"}.check(t, h.nth(2))
}

func TestSplitTarget(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string
		port uint16
		err  string
	}{
		{"api.example.com:443", "api.example.com", 443, ""},
		{"api.example.com", "api.example.com", 80, ""},
		{"[2001:db8::1]:8443", "2001:db8::1", 8443, ""},
		{"[2001:db8::1]", "2001:db8::1", 80, ""},
		{"2001:db8::1", "", 0, "is not host:port"},
		{"api.example.com:0", "", 0, "is not a TCP port"},
		{"api.example.com:65536", "", 0, "is not a TCP port"},
		{"api.example.com:https", "", 0, "is not a TCP port"},
		{":443", "", 0, "names no host"},
	} {
		host, port, err := splitTarget(tc.in, 80)
		if host != tc.host || port != tc.port || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("splitTarget(%q) = %q, %d, %v; want %q, %d, %q", tc.in, host, port, err, tc.host, tc.port, tc.err)
		}
	}
}

func TestNameOf(t *testing.T) {
	for _, tc := range []struct{ in, name, why string }{
		{"API.Example.com.", "api.example.com", ""},
		{"bücher.example", "xn--bcher-kva.example", ""},
		{"127.0.0.1", "127.0.0.1", "is an IP address"},
		{"::1", "::1", "is an IP address"},
		{"127.1", "127.1", "looks like an IP address"},
		{"0x7f.0x1", "0x7f.0x1", "looks like an IP address"},
		{"*.example.com", "*.example.com", "is a wildcard, not a name"},
		{"localhost", "localhost", "is not a fully qualified name"},
		{"a..b", "a..b", "is not a valid domain name"},
	} {
		name, why := nameOf(tc.in)
		if name != tc.name || (why == "") != (tc.why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("nameOf(%q) = %q, %q; want %q, %q", tc.in, name, why, tc.name, tc.why)
		}
	}
}
