package qemu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// JobIf is the job's end of the veth in its network namespace (package
// netpolicy's), which the tap is joined to.
const JobIf = "eth0"

// ErrNoEth is ReadNet's error for a namespace without JobIf: a job whose
// policy is deny-all has no veth (package netpolicy), and its guest then
// gets no NIC at all.
var ErrNoEth = errors.New("the network namespace has no " + JobIf)

// TapName is the tap's name inside the job's namespace.
const TapName = "tap0"

// NetInfo is what the guest's NIC takes from the namespace's eth0: the
// host end of the veth already knows eth0's MAC for the job's addresses
// (static neighbours), so the guest answers as eth0 did.
type NetInfo struct {
	MAC       string
	MTU       int
	Addresses []string // CIDR prefixes of global scope
	// Gateway4 and Gateway6 are the default routes' next hops; GatewayMAC
	// is their link-layer address (the veth's host end).
	Gateway4, Gateway6 string
	GatewayMAC         string
}

// handleAt is a netlink handle inside the namespace at path.
func handleAt(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in network namespace %s: %w", path, err)
	}
	return h, nil
}

// ethIn is a netlink handle in the namespace at path and its eth0.
func ethIn(path string) (*netlink.Handle, netlink.Link, error) {
	h, err := handleAt(path)
	if err != nil {
		return nil, nil, err
	}
	link, err := h.LinkByName(JobIf)
	if err != nil {
		h.Close()
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil, fmt.Errorf("%s: %w", path, ErrNoEth)
		}
		return nil, nil, fmt.Errorf("%s in %s: %w", JobIf, path, err)
	}
	return h, link, nil
}

// ReadNet reads eth0's configuration in the namespace at path.
func ReadNet(path string) (NetInfo, error) {
	h, link, err := ethIn(path)
	if err != nil {
		return NetInfo{}, err
	}
	defer h.Close()
	a := link.Attrs()
	ni := NetInfo{MAC: a.HardwareAddr.String(), MTU: a.MTU}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return NetInfo{}, fmt.Errorf("addresses of %s in %s: %w", JobIf, path, err)
	}
	for _, ad := range addrs {
		if ad.Scope == unix.RT_SCOPE_UNIVERSE {
			ni.Addresses = append(ni.Addresses, ad.IPNet.String())
		}
	}
	routes, err := h.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return NetInfo{}, fmt.Errorf("routes of %s in %s: %w", JobIf, path, err)
	}
	var gws []net.IP
	for _, r := range routes {
		if r.Gw == nil || (r.Dst != nil && !isDefault(r.Dst)) {
			continue
		}
		if r.Gw.To4() != nil && ni.Gateway4 == "" {
			ni.Gateway4 = r.Gw.String()
		} else if r.Gw.To4() == nil && ni.Gateway6 == "" {
			ni.Gateway6 = r.Gw.String()
		}
		gws = append(gws, r.Gw)
	}
	neighs, err := h.NeighList(a.Index, netlink.FAMILY_ALL)
	if err != nil {
		return NetInfo{}, fmt.Errorf("neighbours of %s in %s: %w", JobIf, path, err)
	}
	for _, n := range neighs {
		if len(n.HardwareAddr) == 6 && slices.ContainsFunc(gws, n.IP.Equal) {
			ni.GatewayMAC = n.HardwareAddr.String()
			break
		}
	}
	if len(ni.Addresses) == 0 || (ni.Gateway4 == "" && ni.Gateway6 == "") || ni.GatewayMAC == "" {
		return NetInfo{}, fmt.Errorf("%s in %s: want global addresses, a default route and its gateway's static neighbour, found %+v", JobIf, path, ni)
	}
	return ni, nil
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// openTap makes a non-persistent tap in the calling thread's network
// namespace (the caller has entered the job's) and returns its queue: the
// tap is gone when the last descriptor of it is closed, that is, when
// QEMU exits.
func openTap() (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(TapName)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("make tap %s: %w", TapName, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), nil
}

// connectTap joins the tap to eth0 in the namespace at path: every frame
// arriving on one leaves by the other (tc ingress with a match-everything u32 filter
// and a mirred redirect, each way), so the guest's NIC stands in for eth0
// on the veth. The tap takes eth0's MTU and comes up.
func connectTap(path string) error {
	h, eth, err := ethIn(path)
	if err != nil {
		return err
	}
	defer h.Close()
	tap, err := h.LinkByName(TapName)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", TapName, path, err)
	}
	if err := h.LinkSetMTU(tap, eth.Attrs().MTU); err != nil {
		return fmt.Errorf("mtu of %s in %s: %w", TapName, path, err)
	}
	for _, p := range [][2]netlink.Link{{eth, tap}, {tap, eth}} {
		from, to := p[0].Attrs(), p[1].Attrs()
		if err := h.QdiscAdd(ingress(from.Index)); err != nil {
			return fmt.Errorf("ingress qdisc on %s in %s: %w", from.Name, path, err)
		}
		// A u32 filter matching every packet (one key, mask 0): u32 is
		// in kernels that lack matchall.
		f := &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: from.Index, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: unix.ETH_P_ALL,
			},
			Sel: &netlink.TcU32Sel{
				Flags: netlink.TC_U32_TERMINAL,
				Nkeys: 1,
				Keys:  []netlink.TcU32Key{{Mask: 0, Val: 0, Off: 0}},
			},
			Actions: []netlink.Action{netlink.NewMirredAction(to.Index)},
		}
		if err := h.FilterAdd(f); err != nil {
			return fmt.Errorf("redirect %s to %s in %s: %w", from.Name, to.Name, path, err)
		}
	}
	if err := h.LinkSetUp(tap); err != nil {
		return fmt.Errorf("bring %s up in %s: %w", TapName, path, err)
	}
	return nil
}

// ingress is the link's ingress qdisc, which holds its redirect filter.
func ingress(index int) *netlink.Ingress {
	return &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
}

// Disconnect removes eth0's ingress qdisc (and with it the redirect to
// the tap), so a later machine in the same namespace can join it again.
// The tap's own goes with the tap.
func Disconnect(path string) error {
	h, eth, err := ethIn(path)
	if err != nil {
		// A namespace (or eth0) already gone holds no redirect.
		return nil
	}
	defer h.Close()
	if err := h.QdiscDel(ingress(eth.Attrs().Index)); err != nil && err != unix.ENOENT && err != unix.EINVAL {
		return fmt.Errorf("remove the ingress qdisc of %s in %s: %w", JobIf, path, err)
	}
	return nil
}
