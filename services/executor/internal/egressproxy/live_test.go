package egressproxy

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
)

// Narrowing the policy cuts the open connections to names it no longer
// allows, at once, over CONNECT and the redirect alike; connections to
// names still allowed go on, and the next connection to the removed name
// is refused.
func TestSetPolicyCutsNarrowed(t *testing.T) {
	h := newHarness(t)
	cut := h.openStream("api.example.com", "/stream")
	kept := h.openStream("x.pkg.example.com", "/stream?id=kept")
	cutRedirected := h.openRedirected("api.example.com", "/stream")
	for _, tu := range []*tunnel{cut, kept, cutRedirected} {
		if line, err := tu.readLine(); err != nil || line != "first" {
			t.Fatalf("stream: %q %v", line, err)
		}
	}
	narrowed := egress.Policy{Names: []egress.Name{{Name: "*.pkg.example.com"}}}
	if err := h.p.SetPolicy(narrowed); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, tu := range []*tunnel{cut, cutRedirected} {
		if line, err := tu.readLine(); err == nil {
			t.Fatalf("a narrowed connection still reads: %q", line)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the cut took %s", d)
	}
	// Both are recorded, in either order.
	got := h.waitDecisions(2)
	if got[0].Mode != ModeConnect {
		got[0], got[1] = got[1], got[0]
	}
	for i, mode := range []Mode{ModeConnect, ModeTransparent} {
		want{Mode: mode, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com",
			Addr: "203.0.113.10:443", End: "cut: the policy no longer allows api.example.com port 443"}.check(t, got[i])
	}

	_, _, status, body := h.connect("api.example.com:443")
	if status != http.StatusForbidden || body != "api.example.com is not in the policy" {
		t.Errorf("after narrowing: %d %q", status, body)
	}
	want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Reason: "api.example.com is not in the policy"}.check(t, h.nth(3))

	close(h.end("kept"))
	if line, err := kept.readLine(); err != nil || line != "last" {
		t.Errorf("the connection still allowed: %q %v, want \"last\"", line, err)
	}
	kept.conn.Close()
	want{Mode: ModeConnect, Name: "x.pkg.example.com", Port: 443, Allowed: true, Reason: "allowed by *.pkg.example.com",
		Addr: "203.0.113.10:443", End: endedByPeers}.check(t, h.nth(4))
}

// Narrowing by port cuts too: a name kept only on port 80 loses its TLS
// connections.
func TestSetPolicyCutsPort(t *testing.T) {
	h := newHarness(t)
	tu := h.openStream("api.example.com", "/stream")
	if line, err := tu.readLine(); err != nil || line != "first" {
		t.Fatalf("stream: %q %v", line, err)
	}
	if err := h.p.SetPolicy(egress.Policy{Names: []egress.Name{{Name: "api.example.com", Ports: []uint16{80}}}}); err != nil {
		t.Fatal(err)
	}
	if line, err := tu.readLine(); err == nil {
		t.Fatalf("still reads: %q", line)
	}
	want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com",
		Addr: "203.0.113.10:443", End: "cut: the policy no longer allows api.example.com port 443"}.check(t, h.nth(1))
}

// A policy that does not normalise is refused and changes nothing.
func TestSetPolicyInvalid(t *testing.T) {
	h := newHarness(t)
	err := h.p.SetPolicy(egress.Policy{Names: []egress.Name{{Name: "bad..name"}}})
	if err == nil || !strings.Contains(err.Error(), "names[0]") {
		t.Fatalf("SetPolicy = %v, want a names[0] error", err)
	}
	if status, _ := get(t, h.proxyClient(), "https://api.example.com/"); status != http.StatusOK {
		t.Errorf("after a refused SetPolicy: %d", status)
	}
}

// Close stops both listeners and cuts what is open, each recorded by the
// time it returns.
func TestCloseCuts(t *testing.T) {
	h := newHarness(t)
	tu := h.openStream("api.example.com", "/stream")
	if line, err := tu.readLine(); err != nil || line != "first" {
		t.Fatalf("stream: %q %v", line, err)
	}
	if err := h.p.Close(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	n := len(h.decisions)
	h.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d decisions when Close returned, want 1", n)
	}
	want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com",
		Addr: "203.0.113.10:443", End: "cut: the proxy closed"}.check(t, h.nth(1))
	if line, err := tu.readLine(); err == nil {
		t.Errorf("still reads after Close: %q", line)
	}
	for _, addr := range []string{h.explicit, h.trans} {
		if c, err := dialTimeout(addr); err == nil {
			c.Close()
			t.Errorf("%s still accepts after Close", addr)
		}
	}
	if err := h.p.Serve(mustListen(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Serve after Close = %v, want ErrClosed", err)
	}
}
