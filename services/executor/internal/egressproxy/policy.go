package egressproxy

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/pkg/egress"
)

// splitTarget splits "host:port" (or a bare host, which gets def), with
// IPv6 literals in brackets.
func splitTarget(s string, def uint16) (string, uint16, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// No port: the whole of s is the host.
		if strings.Count(s, ":") > 0 && !(strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]")) {
			return "", 0, fmt.Errorf("%q is not host:port", s)
		}
		host, port = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"), ""
	}
	if host == "" {
		return "", 0, fmt.Errorf("%q names no host", s)
	}
	if port == "" {
		return host, def, nil
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("%q: %q is not a TCP port", s, port)
	}
	return host, uint16(n), nil
}

// nameOf is host as the policy compares names, or why host is not a name
// the proxy will look up (with host as given, for the record).
func nameOf(host string) (string, string) {
	if _, err := netip.ParseAddr(host); err == nil {
		return host, fmt.Sprintf("%s is an IP address: a domain policy allows names only", host)
	}
	if strings.HasPrefix(host, "*.") {
		return host, fmt.Sprintf("%q is a wildcard, not a name", host)
	}
	name, err := egress.NormalizeName(host)
	if err != nil {
		return host, err.Error()
	}
	// No top-level domain is all digits; a resolver's inet_aton may take
	// "127.1" or "0x7f.1" for an address.
	last := name[strings.LastIndexByte(name, '.')+1:]
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return host, fmt.Sprintf("%s looks like an IP address: a domain policy allows names only", host)
	}
	return name, ""
}
