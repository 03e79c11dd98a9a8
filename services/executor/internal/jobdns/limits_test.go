package jobdns

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"golang.org/x/net/dns/dnsmessage"
)

// A narrowing applies to the next query, and the names it removed are no
// longer looked up; a policy that does not normalise changes nothing.
func TestSetPolicy(t *testing.T) {
	h := newHarness(t)
	if r := h.ask("udp", "x.pkg.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeSuccess || len(r.answers) != 1 {
		t.Fatalf("before: %v %v", r.rcode, r.answers)
	}
	if err := h.srv.SetPolicy(egress.Policy{Names: []egress.Name{{Name: "api.example.com"}}}); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []string{"udp", "tcp"} {
		if r := h.ask(proto, "x.pkg.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeRefused {
			t.Errorf("%s after narrowing: %v, want REFUSED", proto, r.rcode)
		}
		if r := h.ask(proto, "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeSuccess {
			t.Errorf("%s, a name kept: %v", proto, r.rcode)
		}
	}
	if got := h.upstream.lookups(); slices.Contains(got[1:], "x.pkg.example.com") {
		t.Errorf("a name no longer allowed was looked up: %q", got)
	}
	if err := h.srv.SetPolicy(egress.Policy{Names: []egress.Name{{Name: "a.*.example.com"}}}); err == nil {
		t.Error("a policy that does not normalise was taken")
	}
	if r := h.ask("udp", "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeSuccess {
		t.Errorf("after a refused SetPolicy: %v", r.rcode)
	}
	if err := h.srv.SetPolicy(egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	if r := h.ask("udp", "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeRefused {
		t.Errorf("deny-all: %v, want REFUSED", r.rcode)
	}
}

// Past the bucket's burst, queries are refused without a lookup, allowed
// names included, until tokens come back.
func TestRateLimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Burst, c.QueriesPerSecond = 5, 2 })
	var answered, refused int
	for i := range 12 {
		proto := []string{"udp", "tcp"}[i%2]
		switch r := h.ask(proto, "api.example.com", dnsmessage.TypeA); r.rcode {
		case dnsmessage.RCodeSuccess:
			answered++
		case dnsmessage.RCodeRefused:
			refused++
		}
	}
	// 2 a second refill a little while the loop runs; far fewer than 12.
	if answered < 5 || answered > 8 || refused == 0 {
		t.Errorf("%d answered, %d refused; want the burst of 5 (and a few refilled) answered", answered, refused)
	}
	if got := len(h.upstream.lookups()); got != answered {
		t.Errorf("%d lookups for %d answers: a refused query was looked up", got, answered)
	}
	recs := h.recorded()
	if !slices.ContainsFunc(recs, func(d QueryDecision) bool {
		return !d.Allowed && d.Name == "api.example.com" && strings.Contains(d.Reason, "rate limited")
	}) {
		t.Errorf("no rate-limited refusal recorded: %+v", recs)
	}
	time.Sleep(600 * time.Millisecond)
	if r := h.ask("udp", "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeSuccess {
		t.Errorf("after tokens came back: %v", r.rcode)
	}
}

// TCP carries length-prefixed messages, several on one connection in
// order; a length beyond a query's ends the connection after REFUSED.
func TestTCPFraming(t *testing.T) {
	h := newHarness(t)
	resps := h.exchangeTCP(
		query(1, "api.example.com", dnsmessage.TypeA),
		query(2, "denied.example.com", dnsmessage.TypeA),
		query(3, "v6.example.com", dnsmessage.TypeAAAA),
	)
	want := []struct {
		rcode dnsmessage.RCode
		ans   []netip.Addr
	}{{dnsmessage.RCodeSuccess, addrs("203.0.113.10")}, {dnsmessage.RCodeRefused, nil}, {dnsmessage.RCodeSuccess, addrs("2001:db8::10")}}
	for i, b := range resps {
		r := parse(t, b)
		if r.id != uint16(i+1) || r.rcode != want[i].rcode || !slices.Equal(r.answers, want[i].ans) {
			t.Errorf("response %d: id %d %v %v, want id %d %v %v", i, r.id, r.rcode, r.answers, i+1, want[i].rcode, want[i].ans)
		}
	}

	c, err := net.Dial("tcp", h.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := make([]byte, 2+4000)
	binary.BigEndian.PutUint16(big, 4000)
	copy(big[2:], query(9, "api.example.com", dnsmessage.TypeA))
	c.Write(big)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	var size [2]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		t.Fatalf("no response to an oversize message: %v", err)
	}
	resp := make([]byte, binary.BigEndian.Uint16(size[:]))
	io.ReadFull(c, resp)
	if r := parse(t, resp); r.id != 9 || r.rcode != dnsmessage.RCodeRefused {
		t.Errorf("oversize over TCP: id %d %v, want 9 REFUSED", r.id, r.rcode)
	}
	// Closed with the rest of the message unread: EOF or a reset.
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("the connection stayed open after an oversize message: %v", err)
	}

	// A length prefix and then silence, or half a message, does not hold
	// a query; the server goes on answering others.
	half, _ := net.Dial("tcp", h.tcp)
	defer half.Close()
	half.Write([]byte{0, 40, 1, 2, 3})
	if r := h.ask("tcp", "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeSuccess {
		t.Errorf("beside a stalled connection: %v", r.rcode)
	}
}

// A UDP message past 512 bytes is refused from its header, a tiny one and
// a response are not answered at all, and none is looked up.
func TestUDPOddities(t *testing.T) {
	h := newHarness(t)
	big := append(query(5, "api.example.com", dnsmessage.TypeA), make([]byte, 600)...)
	if r := parse(t, h.exchangeUDP(big)); r.id != 5 || r.rcode != dnsmessage.RCodeRefused {
		t.Errorf("oversize: id %d %v, want 5 REFUSED", r.id, r.rcode)
	}
	if b := h.exchangeUDP([]byte{1, 2, 3}); b != nil {
		t.Errorf("a 3-byte message was answered: %x", b)
	}
	resp := query(6, "api.example.com", dnsmessage.TypeA)
	resp[2] |= 0x80
	if b := h.exchangeUDP(resp); b != nil {
		t.Errorf("a response was answered: %x", b)
	}
	if got := h.upstream.lookups(); len(got) != 0 {
		t.Errorf("looked up: %q", got)
	}
	recs := h.recorded()
	for i, why := range []string{"oversize", "shorter than a DNS header", "a response, not a query"} {
		if i >= len(recs) || !strings.Contains(recs[i].Reason, why) {
			t.Errorf("record %d: %+v, want %q", i, recs, why)
		}
	}
}

// Refusals of one name past the cap are counted into one summary, which
// Close records; other names and allowed queries are recorded one by one.
func TestRecordCap(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.DenialsPerMinute = 3 })
	for range 10 {
		h.ask("udp", "denied.example.com", dnsmessage.TypeA)
	}
	h.ask("udp", "other.attacker.test", dnsmessage.TypeA)
	for range 5 {
		h.ask("udp", "api.example.com", dnsmessage.TypeA)
	}
	h.close()
	var denied, summaries, other, allowed int
	for _, d := range h.recorded() {
		switch {
		case d.Suppressed > 0:
			summaries++
			if d.Name != "denied.example.com" || d.Suppressed != 7 || !strings.Contains(d.Reason, "7 more refused queries of denied.example.com") {
				t.Errorf("summary %+v", d)
			}
		case d.Name == "denied.example.com":
			denied++
		case d.Name == "other.attacker.test":
			other++
		case d.Allowed:
			allowed++
			if !slices.Equal(d.Answers, addrs("203.0.113.10")) || d.Type != dnsmessage.TypeA || d.Proto != "udp" || d.Reason != "allowed by api.example.com" {
				t.Errorf("allowed record %+v", d)
			}
		}
	}
	if denied != 3 || summaries != 1 || other != 1 || allowed != 5 {
		t.Errorf("recorded %d refusals of the name, %d summaries, %d of another, %d allowed; want 3, 1, 1, 5", denied, summaries, other, allowed)
	}
}

// Close stops both loops (the harness checks ErrClosed), closes open TCP
// connections, and Serve after Close returns ErrClosed at once.
func TestClose(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TCPIdleTimeout = time.Minute })
	c, err := net.Dial("tcp", h.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h.exchangeTCP(query(1, "api.example.com", dnsmessage.TypeA)) // the listener is serving
	closed := make(chan struct{})
	go func() { h.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatal("Close waited on an idle TCP connection")
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("an open TCP connection after Close: %v", err)
	}
	pc, _ := net.ListenPacket("udp", "127.0.0.1:0")
	if err := h.srv.Serve(pc); !errors.Is(err, ErrClosed) {
		t.Errorf("Serve after Close: %v", err)
	}
	if _, err := pc.WriteTo([]byte{0}, pc.LocalAddr()); err == nil {
		t.Error("Serve after Close left its socket open")
	}
}

func TestNew(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("no Resolver")
	}
	r := &fakeResolver{}
	if _, err := New(Config{Resolver: r, Policy: egress.Policy{Names: []egress.Name{{Name: "localhost"}}}}); err == nil {
		t.Error("a policy that does not normalise")
	}
	if _, err := New(Config{Resolver: r, Extra: []netip.Prefix{{}}}); err == nil {
		t.Error("an invalid Extra prefix")
	}
}
