package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A job's rules accept replies by connection state, so the kernel's
// connection tracking decides what reaches the job: an entry that outlives
// the policy that let its connection out lets the peer keep talking to the
// job, and an entry that outlives the job lets its peers talk to whichever
// job takes its addresses next. Every change of rules and every release of
// a job's addresses therefore removes the entries they no longer allow.

// flowFilter matches the conntrack entries of one job (any of whose
// addresses is one of addrs, in either direction) that keep does not
// still allow.
type flowFilter struct {
	addrs []netip.Addr
	keep  func(f *netlink.ConntrackFlow) bool
}

func (f flowFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	mine := false
	for _, ip := range []net.IP{fl.Forward.SrcIP, fl.Forward.DstIP, fl.Reverse.SrcIP, fl.Reverse.DstIP} {
		if a, ok := netip.AddrFromSlice(ip); ok && slices.Contains(f.addrs, a.Unmap()) {
			mine = true
			break
		}
	}
	return mine && (f.keep == nil || !f.keep(fl))
}

// prefixFilter matches every entry with an address in one of its prefixes.
type prefixFilter []netip.Prefix

func (f prefixFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	for _, ip := range []net.IP{fl.Forward.SrcIP, fl.Forward.DstIP, fl.Reverse.SrcIP, fl.Reverse.DstIP} {
		if a, ok := netip.AddrFromSlice(ip); ok && slices.ContainsFunc(f, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) }) {
			return true
		}
	}
	return false
}

// forgetFlows removes the conntrack entries of n's addresses that p does
// not allow; with p nil, all of them. It needs n's addresses (slot >= 0).
func (n *Net) forgetFlows(p *Policy) error {
	a := n.addr
	f := flowFilter{addrs: []netip.Addr{a.job4.Addr()}}
	if a.job6.IsValid() {
		f.addrs = append(f.addrs, a.job6.Addr())
	}
	if p != nil {
		f.keep = func(fl *netlink.ConntrackFlow) bool { return n.m.allows(*p, a, fl) }
	}
	if err := deleteFlows(f, a.job6.IsValid()); err != nil {
		return fmt.Errorf("netpolicy: job %s: remove connection tracking entries: %w", n.id, err)
	}
	return nil
}

// allows reports whether a connection the job at a opened is one p lets
// out: the forward chain's rules, read the same way. The forward chain
// sees the destination after any DNAT of the host's, which is where the
// replies come from: the reply direction's source, not the original
// direction's destination.
func (m *Manager) allows(p Policy, a jobAddrs, fl *netlink.ConntrackFlow) bool {
	src, ok1 := netip.AddrFromSlice(fl.Forward.SrcIP)
	dst, ok2 := netip.AddrFromSlice(fl.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return false
	}
	src, dst = src.Unmap(), dst.Unmap()
	if src != a.job4.Addr() && (!a.job6.IsValid() || src != a.job6.Addr()) {
		return false // not opened by the job: no rule ever let it in
	}
	if p.Proxied && (dst == a.host4.Addr() || a.host6.IsValid() && dst == a.host6.Addr()) {
		return true // to the egress services, which decide for themselves
	}
	if slices.ContainsFunc(m.deny, func(d netip.Prefix) bool { return d.Contains(dst) }) {
		return false
	}
	for _, r := range p.Allow {
		if !r.Prefix.Contains(dst) {
			continue
		}
		if len(r.Ports) == 0 || fl.Forward.Protocol == unix.IPPROTO_TCP && slices.Contains(r.Ports, fl.Reverse.SrcPort) {
			return true
		}
	}
	return false
}

// deleteFlows removes every conntrack entry f matches, IPv6 ones too if v6.
func deleteFlows(f netlink.CustomConntrackFilter, v6 bool) error {
	families := []netlink.InetFamily{unix.AF_INET}
	if v6 {
		families = append(families, unix.AF_INET6)
	}
	for _, fam := range families {
		var err error
		// A dump the kernel interrupts (the table changed meanwhile) may
		// have missed entries: go again.
		for try := 0; try < 5; try++ {
			if _, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
