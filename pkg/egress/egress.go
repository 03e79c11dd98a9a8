// Package egress owns Airlock's model of where a job may connect: rules
// of a prefix (CIDR) with optional TCP ports, and rules of a domain name
// (exact, or "*.suffix" for one label below the suffix, never the suffix
// itself) with optional ports, 443 and 80 when none are given. It parses
// and normalises them the one way every part of Airlock takes them (the
// authority at submit and at a change, a tenant's egress ceiling, the
// executor before it enforces them), and tells whether one policy covers
// another: what a change asks beyond the policy in force is a widening;
// what a job asks beyond its tenant's ceiling is refused. It imports no
// grpc or proto.
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/net/idna"
)

// Rule permits egress to one prefix.
type Rule struct {
	Prefix netip.Prefix
	// Ports are TCP destination ports; empty means every port and protocol.
	Ports []uint16
}

// Name permits egress to one domain name.
type Name struct {
	// Name is normalised (NormalizeName): an exact name, or "*.suffix".
	Name string
	// Ports are TCP destination ports; empty means DefaultPorts.
	Ports []uint16
}

// DefaultPorts are a name rule's ports when it gives none: HTTPS and HTTP.
var DefaultPorts = []uint16{80, 443}

// Policy is a set of rules; none at all is deny-all (loopback only).
type Policy struct {
	Rules []Rule
	Names []Name
}

// DenyAll reports whether p permits nothing.
func (p Policy) DenyAll() bool { return len(p.Rules) == 0 && len(p.Names) == 0 }

// CheckPrefix checks a prefix as rules carry it: valid, IPv4 written as
// IPv4, no host bits.
func CheckPrefix(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return errors.New("not a valid prefix")
	case p.Addr().Is4In6():
		return fmt.Errorf("%s is an IPv4-mapped IPv6 prefix; write it as IPv4", p)
	case p.Masked() != p:
		return fmt.Errorf("%s has host bits set; write %s", p, p.Masked())
	}
	return nil
}

// ParsePrefix parses and checks a rule's CIDR.
func ParsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	if err := CheckPrefix(p); err != nil {
		return netip.Prefix{}, err
	}
	return p, nil
}

// PortError is a port out of range, at index Index of its list.
type PortError struct {
	Index int
	Port  uint32
}

func (e *PortError) Error() string { return fmt.Sprintf("%d is not a TCP port (1 to 65535)", e.Port) }

// Ports checks a list of ports and returns it sorted, without repeats.
func Ports(ports []uint32) ([]uint16, error) {
	out := make([]uint16, 0, len(ports))
	for i, p := range ports {
		if p == 0 || p > 65535 {
			return nil, &PortError{Index: i, Port: p}
		}
		out = append(out, uint16(p))
	}
	return sortedPorts(out), nil
}

func sortedPorts(p []uint16) []uint16 {
	p = slices.Clone(p)
	slices.Sort(p)
	return slices.Compact(p)
}

// NormalizeName checks a domain rule's name and returns it in the one form
// rules are compared in: IDNA (punycode) ASCII, lower case, no trailing
// dot; a wildcard only as a whole first label ("*.example.com"). Names are
// fully qualified: at least two labels.
func NormalizeName(s string) (string, error) {
	wild := strings.HasPrefix(s, "*.")
	name := strings.TrimSuffix(strings.TrimPrefix(s, "*."), ".")
	if strings.ContainsAny(name, "*") {
		return "", fmt.Errorf("%q: a wildcard is allowed only as the whole first label (*.example.com)", s)
	}
	ascii, err := idna.Lookup.ToASCII(name)
	if err != nil {
		return "", fmt.Errorf("%q is not a valid domain name: %v", s, err)
	}
	ascii = strings.ToLower(ascii)
	if len(ascii) > 253 {
		return "", fmt.Errorf("%q is longer than 253 characters", s)
	}
	labels := strings.Split(ascii, ".")
	if len(labels) < 2 {
		return "", fmt.Errorf("%q is not a fully qualified name", s)
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("%q is not a valid domain name", s)
		}
		for _, r := range l {
			if !('a' <= r && r <= 'z') && !('0' <= r && r <= '9') && r != '-' {
				return "", fmt.Errorf("%q is not a valid domain name", s)
			}
		}
	}
	if _, err := netip.ParseAddr(ascii); err == nil {
		return "", fmt.Errorf("%q is an address, not a name: write it as a CIDR rule", s)
	}
	if wild {
		return "*." + ascii, nil
	}
	return ascii, nil
}

// Matches reports whether host (normalised) is n's name, or one label
// below a wildcard's suffix; a wildcard never matches its apex.
func (n Name) Matches(host string) bool {
	suffix, wild := strings.CutPrefix(n.Name, "*.")
	if !wild {
		return host == n.Name
	}
	label, rest, ok := strings.Cut(host, ".")
	return ok && label != "" && label != "*" && rest == suffix
}

// Normalize checks p and returns it with masked prefixes, normalised
// names and sorted ports, rules in a stable order.
func (p Policy) Normalize() (Policy, error) {
	var out Policy
	for i, r := range p.Rules {
		if err := CheckPrefix(r.Prefix); err != nil {
			return Policy{}, fmt.Errorf("rules[%d]: %v", i, err)
		}
		for _, port := range r.Ports {
			if port == 0 {
				return Policy{}, fmt.Errorf("rules[%d]: port 0", i)
			}
		}
		out.Rules = append(out.Rules, Rule{Prefix: r.Prefix, Ports: sortedPorts(r.Ports)})
	}
	for i, n := range p.Names {
		name, err := NormalizeName(n.Name)
		if err != nil {
			return Policy{}, fmt.Errorf("names[%d]: %v", i, err)
		}
		for _, port := range n.Ports {
			if port == 0 {
				return Policy{}, fmt.Errorf("names[%d]: port 0", i)
			}
		}
		out.Names = append(out.Names, Name{Name: name, Ports: sortedPorts(n.Ports)})
	}
	return out, nil
}

// Covers lists what q permits that p does not, one entry per rule of q
// ("allow 10.1.0.0/16 ports [443]", "domain *.npmjs.org ports [443]");
// none means p covers q. A prefix rule is covered by one of p's whose
// prefix contains it with all its ports (every port only by a rule of
// every port); a name rule by one of p's that matches the name (a
// wildcard only by the same wildcard) with all its ports. Rules that do
// not normalise are never covered.
func (p Policy) Covers(q Policy) []string {
	var out []string
	for _, r := range q.Rules {
		if !p.coversRule(r) {
			out = append(out, "allow "+ruleText(r.Prefix.String(), r.Ports, "all ports"))
		}
	}
	for _, n := range q.Names {
		if !p.coversName(n) {
			out = append(out, "domain "+ruleText(n.Name, n.Ports, "ports [80 443]"))
		}
	}
	return out
}

func (p Policy) coversRule(r Rule) bool {
	if CheckPrefix(r.Prefix) != nil {
		return false
	}
	for _, have := range p.Rules {
		if have.Prefix.Addr().Is4() != r.Prefix.Addr().Is4() || have.Prefix.Bits() > r.Prefix.Bits() || !have.Prefix.Contains(r.Prefix.Addr()) {
			continue
		}
		if portsCover(have.Ports, r.Ports, nil) {
			return true
		}
	}
	return false
}

func (p Policy) coversName(n Name) bool {
	name, err := NormalizeName(n.Name)
	if err != nil {
		return false
	}
	for _, have := range p.Names {
		hn, err := NormalizeName(have.Name)
		if err != nil {
			continue
		}
		same := hn == name || (!strings.HasPrefix(name, "*.") && Name{Name: hn}.Matches(name))
		if same && portsCover(have.Ports, n.Ports, DefaultPorts) {
			return true
		}
	}
	return false
}

// portsCover reports whether the ports have permit every one of want;
// empty means def, or every port when def is nil.
func portsCover(have, want, def []uint16) bool {
	if len(have) == 0 {
		have = def
	}
	if len(want) == 0 {
		want = def
	}
	if have == nil {
		return true // every port
	}
	if want == nil {
		return false // every port, and have is not
	}
	for _, p := range want {
		if !slices.Contains(have, p) {
			return false
		}
	}
	return true
}

func ruleText(what string, ports []uint16, none string) string {
	if len(ports) == 0 {
		return what + " (" + none + ")"
	}
	return fmt.Sprintf("%s ports %v", what, ports)
}

// AllowsPrefix reports whether every address of pfx lies within one of
// p's prefixes (whatever the ports).
func (p Policy) AllowsPrefix(pfx netip.Prefix) bool {
	return len(Policy{Rules: allPorts(p.Rules)}.Covers(Policy{Rules: []Rule{{Prefix: pfx.Masked()}}})) == 0
}

// AllowsName reports whether name (normalised, or a "*." wildcard) is one
// of p's names or one label below one of its wildcards (a wildcard only
// by the same wildcard), whatever the ports.
func (p Policy) AllowsName(name string) bool {
	name, err := NormalizeName(name)
	if err != nil {
		return false
	}
	for _, have := range p.Names {
		if have.Name == name || (!strings.HasPrefix(name, "*.") && have.Matches(name)) {
			return true
		}
	}
	return false
}

func allPorts(rules []Rule) []Rule {
	out := make([]Rule, len(rules))
	for i, r := range rules {
		out[i] = Rule{Prefix: r.Prefix}
	}
	return out
}

// Decide says whether the name rules allow name (normalised) on port, and
// why: the rule that allows it, or why none does. Port 0 asks about the
// name alone, as a DNS question does.
func Decide(names []Name, name string, port uint16) (bool, string) {
	var other []string // rules of the name on other ports
	for _, n := range names {
		if !n.Matches(name) {
			continue
		}
		if port == 0 {
			return true, "allowed by " + n.Name
		}
		ports := n.Ports
		if len(ports) == 0 {
			ports = DefaultPorts
		}
		if slices.Contains(ports, port) {
			return true, fmt.Sprintf("allowed by %s ports %v", n.Name, ports)
		}
		other = append(other, fmt.Sprintf("%s ports %v", n.Name, ports))
	}
	if len(other) > 0 {
		return false, fmt.Sprintf("port %d is not allowed for %s (the policy has %s)", port, name, strings.Join(other, ", "))
	}
	for _, n := range names {
		if n.Name == "*."+name {
			return false, fmt.Sprintf("%s is not in the policy (%s matches only names below it)", name, n.Name)
		}
	}
	return false, name + " is not in the policy"
}
