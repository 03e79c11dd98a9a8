package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

var movableRanges = []netip.Prefix{
	netip.MustParsePrefix("10.200.0.0/13"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("100.64.0.0/10"),
}

// claimPool4 checks the pools against the host's networks and the other
// managers' claims, moves a movable Pool4 if it must, and claims the pool
// it returns.
func claimPool4(cfg Config) (netip.Prefix, *poolClaim, error) {
	cl, err := lockClaims()
	if err != nil {
		return netip.Prefix{}, nil, err
	}
	defer cl.unlock()
	if cfg.MovablePool4 {
		p, err := freePool4(cfg, cl)
		if err != nil {
			return netip.Prefix{}, nil, err
		}
		if p != cfg.Pool4 {
			cfg.Logger.Info("netpolicy: the default pool is another executor's or overlaps the host's networks; using another", "default", cfg.Pool4, "pool4", p)
			cfg.Pool4 = p
		}
	}
	if err := checkPoolsFree(cfg, cl); err != nil {
		return netip.Prefix{}, nil, err
	}
	pc, err := cl.claim(cfg.Pool4)
	if err != nil {
		return netip.Prefix{}, nil, err
	}
	return cfg.Pool4, pc, nil
}

// freePool4 returns cfg.Pool4 if it is free (no other manager holds an
// overlapping pool, and no host subnet, route other than a default one,
// or always-denied prefix overlaps it), else the first free prefix of its
// size, starting after it, in movableRanges.
func freePool4(cfg Config, cl *claims) (netip.Prefix, error) {
	taken, err := hostSubnets(cfg)
	if err != nil {
		return netip.Prefix{}, err
	}
	routes, err := hostRoutes(cfg)
	if err != nil {
		return netip.Prefix{}, err
	}
	taken = append(taken, routes...)
	for _, d := range append(slices.Clone(alwaysDeny), cfg.AlwaysDeny...) {
		taken = append(taken, hostSubnet{subnet: d.Masked(), link: "always denied"})
	}
	free := func(p netip.Prefix) bool {
		if _, held := cl.heldOverlapping(p); held {
			return false
		}
		for _, t := range taken {
			if t.subnet.Overlaps(p) {
				return false
			}
		}
		return true
	}
	if free(cfg.Pool4) {
		return cfg.Pool4, nil
	}
	bits := cfg.Pool4.Bits()
	for _, r := range movableRanges {
		if r.Bits() > bits {
			continue
		}
		n := uint32(1) << (bits - r.Bits())
		base := binary.BigEndian.Uint32(r.Addr().AsSlice())
		start := uint32(0)
		if r.Contains(cfg.Pool4.Addr()) {
			start = (binary.BigEndian.Uint32(cfg.Pool4.Addr().AsSlice()) - base) >> (32 - bits)
		}
		for i := uint32(0); i < n; i++ {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], base+((start+i)%n)<<(32-bits))
			if p := netip.PrefixFrom(netip.AddrFrom4(b), bits); free(p) {
				return p, nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: netpolicy: no /%d free of the host's networks and other executors' pools in %v; set network.pool4", errdefs.ErrInvalidArgument, bits, movableRanges)
}

// hostSubnet is a subnet configured on one of the host's interfaces.
type hostSubnet struct {
	subnet netip.Prefix
	link   string
}

// hostLinks maps the index of each of the host's interfaces, other than
// this manager's own veths, to its name; own are the veths' indexes.
func hostLinks(cfg Config) (names map[int]string, own map[int]bool, err error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: list the host's interfaces: %v", ErrUnavailable, err)
	}
	names, own = map[int]string{}, map[int]bool{}
	for _, l := range links {
		if l.Type() == "veth" && strings.HasPrefix(l.Attrs().Alias, cfg.Name+":") {
			own[l.Attrs().Index] = true
			continue
		}
		names[l.Attrs().Index] = l.Attrs().Name
	}
	return names, own, nil
}

// hostRoutes lists the destinations of the host's IPv4 routes in every
// routing table, leaving out default routes and routes through this
// manager's own veths. A pool there would take traffic meant for where
// the route leads (a VPN, a container network, a cloud's metadata range).
func hostRoutes(cfg Config) ([]hostSubnet, error) {
	names, own, err := hostLinks(cfg)
	if err != nil {
		return nil, err
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("%w: list the host's routes: %v", ErrUnavailable, err)
	}
	var out []hostSubnet
	for _, r := range routes {
		if r.Dst == nil || own[r.LinkIndex] {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		if !ok || ones == 0 {
			continue
		}
		where := fmt.Sprintf("a route in table %d", r.Table)
		if name, ok := names[r.LinkIndex]; ok {
			where = fmt.Sprintf("a route via %s in table %d", name, r.Table)
		}
		out = append(out, hostSubnet{netip.PrefixFrom(ip.Unmap(), ones).Masked(), where})
	}
	return out, nil
}

// hostSubnets lists the subnets of the addresses on the host's
// interfaces, leaving out this manager's own veths.
func hostSubnets(cfg Config) ([]hostSubnet, error) {
	names, _, err := hostLinks(cfg)
	if err != nil {
		return nil, err
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("%w: list the host's addresses: %v", ErrUnavailable, err)
	}
	var out []hostSubnet
	for _, a := range addrs {
		name, ok := names[a.LinkIndex]
		if !ok || a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, hostSubnet{netip.PrefixFrom(ip.Unmap(), ones).Masked(), name})
	}
	return out, nil
}

// checkPoolsFree refuses pools that overlap a subnet of the host's (the
// jobs' routes would shadow its neighbours, or a job would get an address
// the host has) and a Pool4 that overlaps another manager's, and warns
// about a Pool4 that overlaps a route. This manager's own veths (left by
// a killed executor, for Recover) do not count.
func checkPoolsFree(cfg Config, cl *claims) error {
	if h, held := cl.heldOverlapping(cfg.Pool4); held {
		return fmt.Errorf("%w: netpolicy: network.pool4 %s overlaps pool %s, which another executor on this host holds; set network.pool4 to a prefix of its own",
			errdefs.ErrInvalidArgument, cfg.Pool4, h)
	}
	taken, err := hostSubnets(cfg)
	if err != nil {
		return err
	}
	routes, err := hostRoutes(cfg)
	if err != nil {
		return err
	}
	for _, r := range routes {
		if r.subnet.Overlaps(cfg.Pool4) {
			cfg.Logger.Warn("netpolicy: network.pool4 overlaps a route of the host's; jobs' addresses shadow part of it", "pool4", cfg.Pool4, "route", r.subnet, "where", r.link)
		}
	}
	for _, t := range taken {
		for _, pool := range []struct {
			field string
			p     netip.Prefix
		}{{"network.pool4", cfg.Pool4}, {"network.pool6", cfg.Pool6}} {
			if pool.p.IsValid() && pool.p.Overlaps(t.subnet) {
				return fmt.Errorf("%w: netpolicy: %s %s overlaps %s on the host's interface %s (another executor's jobs, or the host's own network); set %s to a prefix of its own",
					errdefs.ErrInvalidArgument, pool.field, pool.p, t.subnet, t.link, pool.field)
			}
		}
	}
	return nil
}
