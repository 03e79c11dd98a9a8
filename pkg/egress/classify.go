package egress

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// The address ranges no job may reach through a name, whatever its policy
// says: where a resolver's answer must never lead (DNS rebinding, a name
// pointed at the host or the cloud's metadata service). As smokescreen
// classifies, an address is checked on its own and on every IPv4 address
// an IPv6 form embeds.
var internalRanges = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (cloud metadata)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments (Oracle Cloud metadata)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("168.63.129.16/32"), "Azure WireServer"},
	{netip.MustParsePrefix("100.100.100.200/32"), "Alibaba Cloud metadata"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fc00::/7"), "unique local"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "AWS metadata"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
}

// Embeddings of an IPv4 address in IPv6 that some host or router will
// take to the IPv4 address.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	nat64Loc  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour = netip.MustParsePrefix("2002::/16")
	teredo    = netip.MustParsePrefix("2001::/32")
	compat    = netip.MustParsePrefix("::/96")
)

// Internal says why a destination address is one no job may reach by a
// name ("" when it may): the ranges above, the IPv4 address any IPv6 form
// embeds (mapped ::ffff:a.b.c.d, IPv4-compatible, NAT64, 6to4, Teredo's
// server and client), and extra (the host's own addresses, the executor's
// job pools, network.always_deny).
func Internal(a netip.Addr, extra []netip.Prefix) string {
	if !a.IsValid() {
		return "not an address"
	}
	a = a.WithZone("")
	// The ranges first, over every form: they say best why (an executor's
	// extra refusals may cover a whole embedding, such as ::ffff:0:0/96).
	for _, v := range candidates(a) {
		// The most specific range names it best (100.100.100.200 is
		// Alibaba's metadata before it is CGNAT).
		best := -1
		for i, r := range internalRanges {
			if r.prefix.Contains(v) && (best < 0 || r.prefix.Bits() > internalRanges[best].prefix.Bits()) {
				best = i
			}
		}
		if best >= 0 {
			return describe(a, v, internalRanges[best].why)
		}
	}
	for _, v := range candidates(a) {
		for _, p := range extra {
			if p.Contains(v) {
				return describe(a, v, "refused by this executor ("+p.String()+")")
			}
		}
	}
	return ""
}

func describe(a, v netip.Addr, why string) string {
	if a == v {
		return fmt.Sprintf("%s is %s", a, why)
	}
	return fmt.Sprintf("%s embeds %s, which is %s", a, v, why)
}

// candidates is a, and every IPv4 address it embeds.
func candidates(a netip.Addr) []netip.Addr {
	out := []netip.Addr{a}
	if a.Is4() {
		return out
	}
	if a.Is4In6() {
		return append(out, a.Unmap())
	}
	b := a.As16()
	v4 := func(off int) netip.Addr { return netip.AddrFrom4([4]byte(b[off : off+4])) }
	switch {
	case compat.Contains(a):
		out = append(out, v4(12))
	case nat64.Contains(a):
		out = append(out, v4(12))
	case nat64Loc.Contains(a):
		// RFC 6052's /48 form: the IPv4 address around the u octet (bits
		// 64-71) — bytes 6,7 then 9,10.
		out = append(out, netip.AddrFrom4([4]byte{b[6], b[7], b[9], b[10]}))
	case sixToFour.Contains(a):
		out = append(out, v4(2))
	case teredo.Contains(a):
		// Server in bytes 4-7; the client's address obfuscated (XOR) in 12-15.
		client := binary.BigEndian.Uint32(b[12:16]) ^ 0xffffffff
		var c [4]byte
		binary.BigEndian.PutUint32(c[:], client)
		out = append(out, v4(4), netip.AddrFrom4(c))
	}
	return out
}
