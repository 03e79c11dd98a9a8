//go:build linux

package guest

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// setupNetwork brings lo up and, given a Network, configures eth0 as the
// job netns's own interface is: the same addresses, routes via the same
// gateways, whose MAC is a static neighbour (the host side answers no ARP).
func setupNetwork(n *proto.Network) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("network lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("network lo up: %w", err)
	}
	if n == nil {
		return nil
	}
	mac, _ := net.ParseMAC(n.MAC) // validated
	link, err := nicByMAC(mac)
	if err != nil {
		return err
	}
	name := link.Attrs().Name
	if name != "eth0" {
		if err := netlink.LinkSetName(link, "eth0"); err != nil {
			return fmt.Errorf("network: rename %s to eth0: %w", name, err)
		}
	}
	// No IPv6 link-local address: the job's netns has only what the host configured.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/eth0/addr_gen_mode", []byte("1"), 0); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("network eth0 addr_gen_mode: %w", err)
	}
	if n.MTU > 0 {
		if err := netlink.LinkSetMTU(link, n.MTU); err != nil {
			return fmt.Errorf("network eth0 mtu %d: %w", n.MTU, err)
		}
	}
	for _, a := range n.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("network address %s: %w", a, err)
		}
		addr.Flags |= 0x02 // IFA_F_NODAD: the address is ours at once
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("network address %s: %w", a, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("network eth0 up: %w", err)
	}
	for _, gw := range []string{n.Gateway4, n.Gateway6} {
		if gw == "" {
			continue
		}
		ip := net.ParseIP(gw)
		if n.GatewayMAC != "" {
			hw, _ := net.ParseMAC(n.GatewayMAC)
			family := netlink.FAMILY_V4
			if ip.To4() == nil {
				family = netlink.FAMILY_V6
			}
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: family,
				State: netlink.NUD_PERMANENT, IP: ip, HardwareAddr: hw}); err != nil {
				return fmt.Errorf("network neighbour %s: %w", gw, err)
			}
		}
		// onlink: the gateway need not be inside one of our prefixes.
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: ip, Flags: int(netlink.FLAG_ONLINK)}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("network default route via %s: %w", gw, err)
		}
	}
	return nil
}

// nicByMAC finds the virtio NIC QEMU gave the MAC.
func nicByMAC(mac net.HardwareAddr) (netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("network: list links: %w", err)
	}
	var seen []string
	for _, l := range links {
		if strings.EqualFold(l.Attrs().HardwareAddr.String(), mac.String()) {
			return l, nil
		}
		seen = append(seen, l.Attrs().Name+"="+l.Attrs().HardwareAddr.String())
	}
	return nil, fmt.Errorf("network: no interface with MAC %s (have %s)", mac, strings.Join(seen, ", "))
}
