package egress

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestNormalizeName(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "proxy.golang.org", want: "proxy.golang.org"},
		{in: "Proxy.GoLang.ORG.", want: "proxy.golang.org"},
		{in: "*.npmjs.org", want: "*.npmjs.org"},
		{in: "bücher.example", want: "xn--bcher-kva.example"},
		{in: "*.Bücher.example", want: "*.xn--bcher-kva.example"},
		{in: "localhost", err: "not a fully qualified name"},
		{in: "a.*.example.com", err: "only as the whole first label"},
		{in: "*example.com", err: "only as the whole first label"},
		{in: "-bad.example.com", err: "not a valid domain name"},
		{in: "under_score.example.com", err: "not a valid domain name"},
		{in: "10.0.0.1", err: "an address, not a name"},
		{in: strings.Repeat("a", 64) + ".example.com", err: "not a valid domain name"},
		{in: "", err: "not a fully qualified name"},
	} {
		got, err := NormalizeName(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("NormalizeName(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestMatches(t *testing.T) {
	wild := Name{Name: "*.example.com"}
	for host, want := range map[string]bool{
		"a.example.com":   true,
		"example.com":     false, // never the apex
		"a.b.example.com": false, // one label only
		"aexample.com":    false,
		"a.example.com.x": false,
	} {
		if got := wild.Matches(host); got != want {
			t.Errorf("*.example.com matches %q = %v, want %v", host, got, want)
		}
	}
	if !(Name{Name: "example.com"}).Matches("example.com") || (Name{Name: "example.com"}).Matches("a.example.com") {
		t.Error("an exact name matches only itself")
	}
}

func TestParsePrefixAndPorts(t *testing.T) {
	if _, err := ParsePrefix("10.0.0.1/8"); err == nil || !strings.Contains(err.Error(), "write 10.0.0.0/8") {
		t.Errorf("host bits: %v", err)
	}
	if _, err := ParsePrefix("::ffff:10.0.0.0/104"); err == nil || !strings.Contains(err.Error(), "IPv4-mapped") {
		t.Errorf("mapped: %v", err)
	}
	if _, err := ParsePrefix("nonsense"); err == nil || !strings.Contains(err.Error(), "not a CIDR") {
		t.Errorf("nonsense: %v", err)
	}
	got, err := Ports([]uint32{443, 80, 443})
	if err != nil || !slices.Equal(got, []uint16{80, 443}) {
		t.Errorf("Ports = %v, %v", got, err)
	}
	var pe *PortError
	if _, err := Ports([]uint32{443, 70000}); !errors.As(err, &pe) || pe.Index != 1 {
		t.Errorf("a port beyond 65535: %v", err)
	}
}

func rule(cidr string, ports ...uint16) Rule {
	return Rule{Prefix: netip.MustParsePrefix(cidr), Ports: ports}
}

func TestCovers(t *testing.T) {
	have := Policy{
		Rules: []Rule{rule("10.0.0.0/8", 443), rule("192.0.2.0/24"), rule("2001:db8::/32", 443)},
		Names: []Name{{Name: "*.example.com"}, {Name: "proxy.golang.org", Ports: []uint16{443}}},
	}
	for _, tc := range []struct {
		want      Policy
		uncovered int
	}{
		{Policy{}, 0},
		{Policy{Rules: []Rule{rule("10.1.0.0/16", 443)}}, 0},
		{Policy{Rules: []Rule{rule("10.1.0.0/16", 443, 22)}}, 1}, // a port more
		{Policy{Rules: []Rule{rule("10.1.0.0/16")}}, 1},          // every port, have one
		{Policy{Rules: []Rule{rule("192.0.2.128/25", 22)}}, 0},   // every port covers any
		{Policy{Rules: []Rule{rule("0.0.0.0/0", 443)}}, 1},
		{Policy{Rules: []Rule{rule("2001:db8:1::/48", 443)}}, 0},
		{Policy{Rules: []Rule{rule("::ffff:10.0.0.0/104", 443)}}, 1}, // not in the form rules take
		{Policy{Names: []Name{{Name: "a.example.com"}}}, 0},
		{Policy{Names: []Name{{Name: "example.com"}}}, 1},      // the apex
		{Policy{Names: []Name{{Name: "*.example.com"}}}, 0},    // the same wildcard
		{Policy{Names: []Name{{Name: "*.a.example.com"}}}, 1},  // a wider reach
		{Policy{Names: []Name{{Name: "proxy.golang.org"}}}, 1}, // 80 and 443, have 443
		{Policy{Names: []Name{{Name: "PROXY.golang.org.", Ports: []uint16{443}}}}, 0},
		{Policy{Names: []Name{{Name: "a.example.com", Ports: []uint16{8443}}}}, 1},
	} {
		if got := have.Covers(tc.want); len(got) != tc.uncovered {
			t.Errorf("Covers(%+v) = %q, want %d uncovered", tc.want, got, tc.uncovered)
		}
	}
}

func TestCeiling(t *testing.T) {
	c := Policy{Rules: []Rule{rule("10.0.0.0/8", 443)}, Names: []Name{{Name: "*.example.com"}}}
	if !c.AllowsPrefix(netip.MustParsePrefix("10.1.2.0/24")) || c.AllowsPrefix(netip.MustParsePrefix("11.0.0.0/8")) {
		t.Error("AllowsPrefix")
	}
	if !c.AllowsName("a.example.com") || !c.AllowsName("*.example.com") || c.AllowsName("example.com") || c.AllowsName("*.a.example.com") {
		t.Error("AllowsName")
	}
}

func TestNormalize(t *testing.T) {
	p, err := Policy{Rules: []Rule{rule("10.0.0.0/8", 443, 80, 443)}, Names: []Name{{Name: "Example.COM.", Ports: []uint16{443}}}}.Normalize()
	if err != nil || !slices.Equal(p.Rules[0].Ports, []uint16{80, 443}) || p.Names[0].Name != "example.com" {
		t.Fatalf("Normalize = %+v, %v", p, err)
	}
	if _, err := (Policy{Rules: []Rule{{Prefix: netip.MustParsePrefix("10.0.0.1/8")}}}).Normalize(); err == nil || !strings.Contains(err.Error(), "rules[0]") {
		t.Errorf("host bits: %v", err)
	}
	if _, err := (Policy{Names: []Name{{Name: "x"}}}).Normalize(); err == nil || !strings.Contains(err.Error(), "names[0]") {
		t.Errorf("bad name: %v", err)
	}
	if !(Policy{}).DenyAll() || p.DenyAll() {
		t.Error("DenyAll")
	}
}

// Decide names the rule that allows a name and port, or why none does;
// port 0 asks about the name alone.
func TestDecide(t *testing.T) {
	names := []Name{{Name: "api.example.com", Ports: []uint16{443}}, {Name: "*.pkg.example.com"}}
	for _, tc := range []struct {
		name string
		port uint16
		ok   bool
		why  string
	}{
		{"api.example.com", 443, true, "allowed by api.example.com ports [443]"},
		{"api.example.com", 80, false, "port 80 is not allowed for api.example.com (the policy has api.example.com ports [443])"},
		{"x.pkg.example.com", 80, true, "allowed by *.pkg.example.com ports [80 443]"},
		{"x.pkg.example.com", 8080, false, "port 8080 is not allowed for x.pkg.example.com (the policy has *.pkg.example.com ports [80 443])"},
		{"pkg.example.com", 443, false, "pkg.example.com is not in the policy (*.pkg.example.com matches only names below it)"},
		{"a.x.pkg.example.com", 443, false, "a.x.pkg.example.com is not in the policy"},
		{"example.com", 443, false, "example.com is not in the policy"},
		{"api.example.com", 0, true, "allowed by api.example.com"},
		{"pkg.example.com", 0, false, "pkg.example.com is not in the policy (*.pkg.example.com matches only names below it)"},
	} {
		ok, why := Decide(names, tc.name, tc.port)
		if ok != tc.ok || why != tc.why {
			t.Errorf("Decide(%s, %d) = %v, %q; want %v, %q", tc.name, tc.port, ok, why, tc.ok, tc.why)
		}
	}
}
