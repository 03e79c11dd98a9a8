// Package netpolicy enforces a job's network policy from outside its
// sandbox. Every job gets a network namespace the executor makes (the
// sandbox joins it, so it is owned by the host's user namespace and nothing
// inside can reconfigure it). Deny-all is loopback only: the namespace has
// no other interface. An allow policy adds a veth pair to the host, and
// nftables rules in the host's namespace — out of the job's reach — let
// through exactly the listed destinations and ports; link-local, metadata,
// other jobs' and the executor's own addresses are always refused. A
// Proxied policy (a domains job's) adds the way to the executor's egress
// services at the host end of the veth and redirects the job's TCP 80
// and 443 there, and lets nothing else through. Apply
// replaces a running job's rules atomically and returns only once they are
// in the kernel.
//
// The rules accept replies by connection state, so Apply also removes the
// kernel's connection tracking entries of the job's connections the new
// policy no longer allows (a peer can then no longer answer on them), and
// a job's addresses are released only once none of their entries is left;
// they are handed out again in turn, not at once.
//
// Host side effects: New turns on IPv4 forwarding (net.ipv4.ip_forward=1),
// and IPv6 forwarding too when Config.Pool6 is set, because a job's packets
// are routed from its veth to the host's other interfaces. The host then
// forwards for every interface; a host that relies on forwarding being off
// must drop forwarded traffic in its own firewall. Each job with a veth has
// one nftables table of its own, "inet <Name>_<hash>", whose chains match
// only packets from or to that job's veth, so other traffic keeps its fate.
// (A drop in another table still wins over our accepts: a host firewall
// that drops forwarded traffic must let the jobs' veths through.) New also
// claims Pool4 host-wide until Close, with a lock file under
// /run/airlock/netpolicy (see claim.go).
//
// The rules are programmed over netlink from the executor's own process
// (package github.com/google/nftables): each change of a job's rules is one
// nftables transaction, which the kernel commits whole or not at all.
//
// Only the executor's run manager and composition root import it. It needs
// root and a kernel with nf_tables, its fib, masquerade, connlimit and
// reject expressions, connection tracking over netlink
// (nf_conntrack_netlink), and veth; no command-line tool.
package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// Rule permits egress to one prefix.
type Rule struct {
	Prefix netip.Prefix
	// Ports are TCP destination ports; empty means every port and protocol.
	Ports []uint16
}

// Policy is what a job may reach. No rules and not Proxied means
// deny-all: loopback only.
type Policy struct {
	Allow []Rule
	// Proxied gives the job the executor's egress services at the host
	// end of its veth (ProxyAddrs), and nothing else beyond Allow: its
	// explicit proxy (TCP ExplicitProxyPort), its DNS server (UDP and TCP
	// 53, redirected to DNSPort) and, for tools that ignore proxy
	// variables, its transparent listener, to which every TCP connection
	// to port 80 or 443 of any address is redirected (TransparentPort).
	// The rules only carry the traffic there: what serves it, and decides
	// on names, is the caller's (packages egressproxy and jobdns).
	Proxied bool
}

// The ports of the egress services on the host end of a proxied job's
// veth, on its own addresses (ProxyAddrs): every job has addresses of its
// own, so the same ports serve every job. A host process that listens on
// one of them on every address keeps proxied jobs from starting.
const (
	ExplicitProxyPort = 15128
	TransparentPort   = 15129
	DNSPort           = 15053
)

// DenyAll reports whether p permits nothing but loopback.
func (p Policy) DenyAll() bool { return len(p.Allow) == 0 && !p.Proxied }

// normalize validates p and returns a copy with masked prefixes and sorted,
// de-duplicated ports, which the caller can no longer change.
// Validate checks p as Create and Apply would: valid, masked prefixes
// and ports 1 to 65535.
func (p Policy) Validate() error {
	_, err := p.normalize()
	return err
}

func (p Policy) normalize() (Policy, error) {
	out := Policy{Proxied: p.Proxied}
	for i, r := range p.Allow {
		// The form the authority checks too (pkg/runspec).
		if err := runspec.CheckPrefix(r.Prefix); err != nil {
			return Policy{}, fmt.Errorf("%w: netpolicy: allow[%d]: %v", errdefs.ErrInvalidArgument, i, err)
		}
		ports := slices.Clone(r.Ports)
		for _, port := range ports {
			if port == 0 {
				return Policy{}, fmt.Errorf("%w: netpolicy: allow[%d]: port 0", errdefs.ErrInvalidArgument, i)
			}
		}
		slices.Sort(ports)
		out.Allow = append(out.Allow, Rule{Prefix: r.Prefix.Masked(), Ports: slices.Compact(ports)})
	}
	return out, nil
}

func (p Policy) clone() Policy {
	out := Policy{Proxied: p.Proxied}
	for _, r := range p.Allow {
		out.Allow = append(out.Allow, Rule{Prefix: r.Prefix, Ports: slices.Clone(r.Ports)})
	}
	return out
}
