package jobdns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"golang.org/x/net/dns/dnsmessage"
)

// testPolicy is the harness's policy unless a test sets another.
var testPolicy = egress.Policy{Names: []egress.Name{
	{Name: "api.example.com"},
	{Name: "*.pkg.example.com"},
	{Name: "v6.example.com"},
	{Name: "dual.example.com", Ports: []uint16{443}},
	{Name: "mapped.example.com"},
	{Name: "*.rebind.example.com"},
	{Name: "gone.example.com"},
	{Name: "broken.example.com"},
}}

// testExtra is the executor's own refusals: the host's address, public-
// looking so only Extra refuses it.
var testExtra = []netip.Prefix{netip.MustParsePrefix("203.0.113.77/32")}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

// testAnswers are what the fake upstream answers.
func testAnswers() map[string][]netip.Addr {
	return map[string][]netip.Addr{
		"api.example.com":   addrs("203.0.113.10"),
		"x.pkg.example.com": addrs("203.0.113.11"),
		"pkg.example.com":   addrs("203.0.113.12"),
		"v6.example.com":    addrs("2001:db8::10"),
		"dual.example.com":  addrs("203.0.113.10", "2001:db8::10", "203.0.113.10", "198.51.100.1"),
		// A public address in its IPv4-mapped form answers A.
		"mapped.example.com":        addrs("::ffff:203.0.113.10"),
		"lo.rebind.example.com":     addrs("127.0.0.1"),
		"meta.rebind.example.com":   addrs("169.254.169.254"),
		"mapped.rebind.example.com": addrs("::ffff:127.0.0.1"),
		"six.rebind.example.com":    addrs("2002:7f00:1::"),
		"host.rebind.example.com":   addrs("203.0.113.77"),
		"mixed.rebind.example.com":  addrs("203.0.113.10", "10.0.0.5"),
		"mixed6.rebind.example.com": addrs("2001:db8::10", "fd00:ec2::254"),
		"denied.example.com":        addrs("203.0.113.10"),
	}
}

// fakeResolver is the upstream: it answers from a table and logs every
// lookup it is asked for, so a test can tell what reached it.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	asked   []string
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, host)
	if network != "ip" {
		return nil, fmt.Errorf("fake resolver: network %q", network)
	}
	if host == "broken.example.com" {
		return nil, errors.New("fake resolver: upstream timed out")
	}
	a, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(a), nil
}

// lookups is every name the upstream was asked for, in order.
func (r *fakeResolver) lookups() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.asked)
}

// harness is a server on a loopback UDP socket and TCP listener.
type harness struct {
	t        *testing.T
	srv      *Server
	upstream *fakeResolver
	udp, tcp string

	mu      sync.Mutex
	records []QueryDecision
	served  chan error
	once    sync.Once
}

func newHarness(t *testing.T, tweak ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, upstream: &fakeResolver{answers: testAnswers()}, served: make(chan error, 2)}
	cfg := Config{
		Policy:   testPolicy,
		Resolver: h.upstream,
		Extra:    testExtra,
		Record: func(d QueryDecision) {
			h.mu.Lock()
			h.records = append(h.records, d)
			h.mu.Unlock()
		},
	}
	for _, f := range tweak {
		f(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.udp, h.tcp = pc.LocalAddr().String(), l.Addr().String()
	go func() { h.served <- srv.Serve(pc) }()
	go func() { h.served <- srv.ServeTCP(l) }()
	t.Cleanup(func() { h.close() })
	return h
}

// close closes the server once and checks both loops ended with ErrClosed.
func (h *harness) close() {
	h.once.Do(h.closeOnce)
}

func (h *harness) closeOnce() {
	h.srv.Close()
	for range 2 {
		select {
		case err := <-h.served:
			if !errors.Is(err, ErrClosed) {
				h.t.Errorf("a serve loop returned %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			h.t.Error("a serve loop did not end after Close")
		}
	}
}

func (h *harness) recorded() []QueryDecision {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.records)
}

// query builds a query of one question (name in the wire's form, with or
// without its trailing dot).
func query(id uint16, name string, t dnsmessage.Type) []byte {
	return buildQuery(id, dnsmessage.ClassINET, t, true, name)
}

func buildQuery(id uint16, class dnsmessage.Class, t dnsmessage.Type, edns bool, names ...string) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	for _, n := range names {
		if n == "" || n[len(n)-1] != '.' {
			n += "."
		}
		if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(n), Type: t, Class: class}); err != nil {
			panic(err)
		}
	}
	if edns {
		b.StartAdditionals()
		var rh dnsmessage.ResourceHeader
		if err := rh.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
			panic(err)
		}
		b.OPTResource(rh, dnsmessage.OPTResource{})
	}
	out, err := b.Finish()
	if err != nil {
		panic(err)
	}
	return out
}

// exchangeUDP sends msg and returns the response (nil when none comes).
func (h *harness) exchangeUDP(msg []byte) []byte {
	h.t.Helper()
	c, err := net.Dial("udp", h.udp)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(msg); err != nil {
		h.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// exchangeTCP sends each message framed on one connection, then reads one
// framed response for each (nil for one that does not come).
func (h *harness) exchangeTCP(msgs ...[]byte) [][]byte {
	h.t.Helper()
	c, err := net.Dial("tcp", h.tcp)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	var out []byte
	for _, m := range msgs {
		out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	if _, err := c.Write(out); err != nil {
		h.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	resps := make([][]byte, len(msgs))
	for i := range msgs {
		var size [2]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			break
		}
		resps[i] = make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(c, resps[i]); err != nil {
			h.t.Fatal(err)
		}
	}
	return resps
}

// response is a parsed response.
type response struct {
	id      uint16
	rcode   dnsmessage.RCode
	qs      []dnsmessage.Question
	answers []netip.Addr
	ttls    []uint32
}

func parse(t *testing.T, b []byte) response {
	t.Helper()
	if b == nil {
		t.Fatal("no response")
	}
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		t.Fatalf("response does not parse: %v", err)
	}
	if !m.Header.Response {
		t.Fatal("the response is not marked a response")
	}
	r := response{id: m.Header.ID, rcode: m.Header.RCode, qs: m.Questions}
	for _, a := range m.Answers {
		switch body := a.Body.(type) {
		case *dnsmessage.AResource:
			r.answers = append(r.answers, netip.AddrFrom4(body.A))
		case *dnsmessage.AAAAResource:
			r.answers = append(r.answers, netip.AddrFrom16(body.AAAA))
		default:
			t.Fatalf("an answer of type %v", a.Header.Type)
		}
		r.ttls = append(r.ttls, a.Header.TTL)
	}
	return r
}

// ask queries name for t over proto and parses the response.
func (h *harness) ask(proto, name string, t dnsmessage.Type) response {
	h.t.Helper()
	q := query(0x1234, name, t)
	var b []byte
	if proto == "tcp" {
		b = h.exchangeTCP(q)[0]
	} else {
		b = h.exchangeUDP(q)
	}
	r := parse(h.t, b)
	if r.id != 0x1234 {
		h.t.Fatalf("response ID %#x, want 0x1234", r.id)
	}
	return r
}
