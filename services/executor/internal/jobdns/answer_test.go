package jobdns

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// An allowed name gets the upstream's vetted addresses of the type asked,
// with the short TTL, over UDP and TCP.
func TestAllowedNames(t *testing.T) {
	h := newHarness(t)
	for _, proto := range []string{"udp", "tcp"} {
		for _, tc := range []struct {
			name string
			typ  dnsmessage.Type
			want []netip.Addr
		}{
			{"api.example.com", dnsmessage.TypeA, addrs("203.0.113.10")},
			{"API.Example.COM.", dnsmessage.TypeA, addrs("203.0.113.10")},
			{"x.pkg.example.com", dnsmessage.TypeA, addrs("203.0.113.11")},
			{"v6.example.com", dnsmessage.TypeAAAA, addrs("2001:db8::10")},
			{"v6.example.com", dnsmessage.TypeA, nil}, // no IPv4: NOERROR, no answers
			{"dual.example.com", dnsmessage.TypeA, addrs("203.0.113.10", "198.51.100.1")},
			{"dual.example.com", dnsmessage.TypeAAAA, addrs("2001:db8::10")},
			{"mapped.example.com", dnsmessage.TypeA, addrs("203.0.113.10")},
		} {
			r := h.ask(proto, tc.name, tc.typ)
			if r.rcode != dnsmessage.RCodeSuccess || !slices.Equal(r.answers, tc.want) {
				t.Errorf("%s %s %v: %v %v, want NOERROR %v", proto, tc.name, tc.typ, r.rcode, r.answers, tc.want)
			}
			for _, ttl := range r.ttls {
				if ttl != 5 {
					t.Errorf("%s %s: TTL %d, want 5", proto, tc.name, ttl)
				}
			}
			if len(r.qs) != 1 || !strings.EqualFold(r.qs[0].Name.String(), strings.TrimSuffix(tc.name, ".")+".") {
				t.Errorf("%s %s: question echoed as %v", proto, tc.name, r.qs)
			}
		}
	}
	if r := h.ask("udp", "gone.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeNameError {
		t.Errorf("an allowed name the upstream does not know: %v, want NXDOMAIN", r.rcode)
	}
	if r := h.ask("udp", "broken.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeServerFailure {
		t.Errorf("an upstream failure: %v, want SERVFAIL", r.rcode)
	}
}

// Go's own resolver, pointed at the server as a job's libc would be, gets
// the allowed name and nothing else.
func TestGoResolver(t *testing.T) {
	h := newHarness(t)
	for _, proto := range []string{"udp", "tcp"} {
		addr := h.udp
		if proto == "tcp" {
			addr = h.tcp
		}
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, proto, addr)
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := r.LookupNetIP(ctx, "ip", "dual.example.com")
		cancel()
		slices.SortFunc(got, netip.Addr.Compare)
		if want := addrs("198.51.100.1", "203.0.113.10", "2001:db8::10"); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: LookupNetIP(dual.example.com) = %v, %v; want %v", proto, got, err, want)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		got, err = r.LookupNetIP(ctx, "ip", "denied.example.com")
		cancel()
		if err == nil {
			t.Errorf("%s: LookupNetIP(denied.example.com) = %v, want an error", proto, got)
		}
	}
	for _, name := range h.upstream.lookups() {
		if name != "dual.example.com" {
			t.Errorf("the upstream was asked for %s", name)
		}
	}
}

// Everything but an A or AAAA question for an allowed name is refused, and
// none of it reaches the upstream.
func TestRefusedNeverUpstream(t *testing.T) {
	h := newHarness(t)
	withRecord := func(section string) []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("api.example.com."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		rh := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("x.attacker.test."), Class: dnsmessage.ClassINET}
		switch section {
		case "answer":
			b.StartAnswers()
		case "authority":
			b.StartAuthorities()
		default:
			b.StartAdditionals()
		}
		b.TXTResource(rh, dnsmessage.TXTResource{TXT: []string{"secret"}})
		out, _ := b.Finish()
		return out
	}
	twoOPT := func() []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("api.example.com."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		b.StartAdditionals()
		for range 2 {
			var rh dnsmessage.ResourceHeader
			rh.SetEDNS0(1232, dnsmessage.RCodeSuccess, false)
			b.OPTResource(rh, dnsmessage.OPTResource{})
		}
		out, _ := b.Finish()
		return out
	}
	opcode := func() []byte {
		q := query(7, "api.example.com", dnsmessage.TypeA)
		q[2] |= 5 << 3 // UPDATE
		return q
	}
	for _, tc := range []struct {
		what  string
		msg   []byte
		rcode dnsmessage.RCode
		why   string
	}{
		{"a name not in the policy", query(7, "denied.example.com", dnsmessage.TypeA), dnsmessage.RCodeRefused, "denied.example.com is not in the policy"},
		{"AAAA for a name not in the policy", query(7, "denied.example.com", dnsmessage.TypeAAAA), dnsmessage.RCodeRefused, "not in the policy"},
		{"a wildcard's apex", query(7, "pkg.example.com", dnsmessage.TypeA), dnsmessage.RCodeRefused, "*.pkg.example.com matches only names below it"},
		{"two labels below a wildcard", query(7, "a.b.pkg.example.com", dnsmessage.TypeA), dnsmessage.RCodeRefused, "not in the policy"},
		{"the wildcard itself", query(7, "*.pkg.example.com", dnsmessage.TypeA), dnsmessage.RCodeRefused, "not a host name"},
		{"TXT for an allowed name", query(7, "api.example.com", dnsmessage.TypeTXT), dnsmessage.RCodeRefused, "type TXT is not answered"},
		{"ANY for an allowed name", query(7, "api.example.com", dnsmessage.TypeALL), dnsmessage.RCodeRefused, "type ALL is not answered"},
		{"MX for an allowed name", query(7, "api.example.com", dnsmessage.TypeMX), dnsmessage.RCodeRefused, "type MX is not answered"},
		{"CNAME for an allowed name", query(7, "api.example.com", dnsmessage.TypeCNAME), dnsmessage.RCodeRefused, "type CNAME"},
		{"PTR", query(7, "10.113.0.203.in-addr.arpa", dnsmessage.TypePTR), dnsmessage.RCodeRefused, "not in the policy"},
		{"class CHAOS", buildQuery(7, dnsmessage.ClassCHAOS, dnsmessage.TypeA, false, "api.example.com"), dnsmessage.RCodeRefused, "only IN"},
		{"two questions", buildQuery(7, dnsmessage.ClassINET, dnsmessage.TypeA, false, "api.example.com", "x.attacker.test"), dnsmessage.RCodeRefused, "2 questions"},
		{"no question", buildQuery(7, dnsmessage.ClassINET, dnsmessage.TypeA, false), dnsmessage.RCodeRefused, "0 questions"},
		{"a record in the answer section", withRecord("answer"), dnsmessage.RCodeRefused, "answer section"},
		{"a record in the authority section", withRecord("authority"), dnsmessage.RCodeRefused, "authority section"},
		{"a TXT in the additional section", withRecord("additional"), dnsmessage.RCodeRefused, "other than one EDNS OPT"},
		{"two OPT records", twoOPT(), dnsmessage.RCodeRefused, "other than one EDNS OPT"},
		{"an UPDATE", opcode(), dnsmessage.RCodeRefused, "opcode 5"},
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x.attacker.test\r\n\r\n"), dnsmessage.RCodeFormatError, "malformed"},
		{"a truncated question", query(7, "api.example.com", dnsmessage.TypeA)[:20], dnsmessage.RCodeFormatError, "malformed"},
	} {
		for _, proto := range []string{"udp", "tcp"} {
			before := len(h.recorded())
			var b []byte
			if proto == "tcp" {
				b = h.exchangeTCP(tc.msg)[0]
			} else {
				b = h.exchangeUDP(tc.msg)
			}
			r := parse(t, b)
			if r.rcode != tc.rcode || len(r.answers) != 0 {
				t.Errorf("%s over %s: %v %v, want %v", tc.what, proto, r.rcode, r.answers, tc.rcode)
			}
			recs := h.recorded()[before:]
			if len(recs) != 1 || recs[0].Allowed || recs[0].RCode != tc.rcode || !strings.Contains(recs[0].Reason, tc.why) {
				t.Errorf("%s over %s: recorded %+v, want one refusal with %q", tc.what, proto, recs, tc.why)
			}
		}
	}
	if got := h.upstream.lookups(); len(got) != 0 {
		t.Errorf("refused queries reached the upstream: %q", got)
	}
	// And the server still answers.
	if r := h.ask("udp", "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeSuccess || len(r.answers) != 1 {
		t.Errorf("after the refusals: %v %v", r.rcode, r.answers)
	}
}

// A job cannot carry data out in the names it looks up: queries for
// <data>.attacker.test, of every type, never reach the upstream.
func TestExfiltration(t *testing.T) {
	h := newHarness(t)
	types := []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA, dnsmessage.TypeTXT, dnsmessage.TypeALL}
	for i := range 100 {
		name := strings.Repeat("5365637265742d", 3) + string(rune('a'+i%26)) + strings.Repeat("0", i%7) + ".attacker.test"
		proto := "udp"
		if i%2 == 1 {
			proto = "tcp"
		}
		if r := h.ask(proto, name, types[i%len(types)]); r.rcode != dnsmessage.RCodeRefused {
			t.Fatalf("query %d for %s: %v, want REFUSED", i, name, r.rcode)
		}
	}
	if got := h.upstream.lookups(); len(got) != 0 {
		t.Errorf("the upstream was asked %d times: %q", len(got), got)
	}
}

// An allowed name that resolves to any address no job may reach is
// refused whole: no partial answer, of either type.
func TestRebinding(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct{ name, why string }{
		{"lo.rebind.example.com", "127.0.0.1 is loopback"},
		{"meta.rebind.example.com", "169.254.169.254 is link-local"},
		{"mapped.rebind.example.com", "embeds 127.0.0.1"},
		{"six.rebind.example.com", "embeds 127.0.0.1"},
		{"host.rebind.example.com", "refused by this executor"},
		{"mixed.rebind.example.com", "10.0.0.5 is private"},
		{"mixed6.rebind.example.com", "AWS metadata"},
	} {
		for _, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} {
			before := len(h.upstream.lookups())
			r := h.ask("udp", tc.name, typ)
			if r.rcode != dnsmessage.RCodeRefused || len(r.answers) != 0 {
				t.Errorf("%s %v: %v %v, want REFUSED and nothing", tc.name, typ, r.rcode, r.answers)
			}
			if len(h.upstream.lookups()) != before+1 {
				t.Errorf("%s %v: the allowed name was not looked up once", tc.name, typ)
			}
			recs := h.recorded()
			if d := recs[len(recs)-1]; d.Allowed || d.Name != tc.name || !strings.Contains(d.Reason, tc.why) {
				t.Errorf("%s %v: recorded %+v, want a refusal with %q", tc.name, typ, d, tc.why)
			}
		}
	}
}

// What Config.Refused says is asked at every lookup: an address the host
// gains while the job runs is refused from then on.
func TestRefusedIsAskedEachTime(t *testing.T) {
	var refused atomic.Pointer[[]netip.Prefix]
	refused.Store(&[]netip.Prefix{})
	h := newHarness(t, func(c *Config) { c.Refused = func() []netip.Prefix { return *refused.Load() } })
	if r := h.ask("udp", "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeSuccess || len(r.answers) == 0 {
		t.Fatalf("before: %v %v", r.rcode, r.answers)
	}
	answer := h.ask("udp", "api.example.com", dnsmessage.TypeA).answers[0]
	refused.Store(&[]netip.Prefix{netip.PrefixFrom(answer, answer.BitLen())})
	if r := h.ask("udp", "api.example.com", dnsmessage.TypeA); r.rcode != dnsmessage.RCodeRefused || len(r.answers) != 0 {
		t.Fatalf("after the host took %s: %v %v, want REFUSED", answer, r.rcode, r.answers)
	}
}
