package egressproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A tool that ignores proxy variables reaches an allowed name over TLS and
// plain HTTP through the redirect: the proxy decides on the SNI or the Host
// header and connects to the name's vetted address, not to the address the
// tool dialled (which the redirect hides and the proxy never asks).
func TestTransparentAllowed(t *testing.T) {
	h := newHarness(t)
	c := h.redirectedClient()
	status, body := get(t, c, "https://api.example.com/t")
	if want := "host=api.example.com path=/t sni=api.example.com"; status != http.StatusOK || body != want {
		t.Errorf("https: %d %q, want 200 %q", status, body, want)
	}
	want{Mode: ModeTransparent, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com", Addr: "203.0.113.10:443", End: endedByPeers}.check(t, h.nth(1))

	status, body = get(t, c, "http://x.pkg.example.com/u")
	if want := "host=x.pkg.example.com path=/u sni=-"; status != http.StatusOK || body != want {
		t.Errorf("http: %d %q, want 200 %q", status, body, want)
	}
	want{Mode: ModeTransparent, Name: "x.pkg.example.com", Port: 80, Allowed: true, Reason: "allowed by *.pkg.example.com", Addr: "203.0.113.10:80", End: endedByPeers}.check(t, h.nth(2))

	status, body = get(t, c, "https://v6.example.com/w")
	if status != http.StatusOK || !strings.HasSuffix(body, "sni=v6.example.com") {
		t.Errorf("https over IPv6: %d %q", status, body)
	}
	want{Mode: ModeTransparent, Name: "v6.example.com", Port: 443, Allowed: true, Reason: "allowed by v6.example.com", Addr: "[2001:db8::10]:443", End: endedByPeers}.check(t, h.nth(3))
}

// On the redirect, a hello without SNI, or with an SNI or Host the policy
// does not allow (or that resolves inward), goes nowhere.
func TestTransparentRefused(t *testing.T) {
	h := newHarness(t)
	hello := func(cfg *tls.Config) func(net.Conn) {
		return func(c net.Conn) {
			cfg.RootCAs = h.roots
			tc := tls.Client(c, cfg)
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tc.Handshake(); err == nil {
				t.Errorf("SNI %q: the handshake succeeded", cfg.ServerName)
			}
		}
	}
	request := func(req string, status int) func(net.Conn) {
		return func(c net.Conn) {
			io.WriteString(c, req)
			b, _ := io.ReadAll(c)
			if want := fmt.Sprintf("HTTP/1.1 %d %s\r\n", status, http.StatusText(status)); !strings.HasPrefix(string(b), want) {
				t.Errorf("%q: answered %q, want %q", req, b, want)
			}
		}
	}
	for i, tc := range []struct {
		what   string
		send   func(net.Conn)
		name   string
		port   uint16
		reason string
	}{
		{"no SNI", hello(&tls.Config{InsecureSkipVerify: true}), "", 443, "the ClientHello has no SNI"},
		{"SNI not listed", hello(&tls.Config{ServerName: "denied.example.com"}), "denied.example.com", 443, "denied.example.com is not in the policy"},
		{"SNI a wildcard's apex", hello(&tls.Config{ServerName: "pkg.example.com"}), "pkg.example.com", 443, "matches only names below it"},
		{"SNI resolving inward", hello(&tls.Config{ServerName: "mixed.rebind.example.com"}), "mixed.rebind.example.com", 443, "10.0.0.5 is private"},
		{"SNI resolving to the metadata service", hello(&tls.Config{ServerName: "meta.rebind.example.com"}), "meta.rebind.example.com", 443, "169.254.169.254 is link-local"},
		{"Host not listed", request("GET / HTTP/1.1\r\nHost: denied.example.com\r\n\r\n", 403), "denied.example.com", 80, "denied.example.com is not in the policy"},
		{"Host an address", request("GET / HTTP/1.1\r\nHost: 203.0.113.10\r\n\r\n", 403), "203.0.113.10", 80, "is an IP address"},
		{"no Host", request("GET / HTTP/1.0\r\n\r\n", 400), "", 0, "the request has no Host header"},
		{"CONNECT", request("CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 405), "", 0, "CONNECT is for the explicit proxy"},
	} {
		c, err := net.DialTimeout("tcp", h.trans, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		tc.send(c)
		c.Close()
		want{Mode: ModeTransparent, Name: tc.name, Port: tc.port, Reason: tc.reason}.check(t, h.nth(i+1))
	}
	if d := h.dials(); len(d) != 0 {
		t.Errorf("dialled %v, want nothing", d)
	}
}

// An allowed SNI sent to an attacker's address (the kernel redirects it
// all the same) reaches the allowed name's vetted address, never the one
// the job dialled.
func TestTransparentIgnoresDestination(t *testing.T) {
	h := newHarness(t)
	var asked []string
	var d net.Dialer
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			asked = append(asked, addr)
			return d.DialContext(ctx, "tcp", h.trans)
		},
		TLSClientConfig:   &tls.Config{RootCAs: h.roots, ServerName: "api.example.com"},
		DisableKeepAlives: true,
	}}
	status, body := get(t, c, "https://198.51.100.66/x")
	if want := "host=198.51.100.66 path=/x sni=api.example.com"; status != http.StatusOK || body != want {
		t.Errorf("%d %q, want 200 %q", status, body, want)
	}
	if len(asked) != 1 || asked[0] != "198.51.100.66:443" {
		t.Errorf("the client dialled %v", asked)
	}
	want{Mode: ModeTransparent, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com", Addr: "203.0.113.10:443", End: endedByPeers}.check(t, h.nth(1))
	if got := h.dials(); len(got) != 1 || got[0].String() != "203.0.113.10:443" {
		t.Errorf("the proxy dialled %v, want only 203.0.113.10:443", got)
	}
}
