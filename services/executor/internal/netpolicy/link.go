package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// jobIf is the job's end of the veth, inside its namespace.
const jobIf = "eth0"

// makeNetns makes a network namespace, owned by the caller's (the host's)
// user namespace, bind-mounted on the existing file path, with its
// loopback up.
func makeNetns(path string) error {
	errc := make(chan error, 1)
	go func() {
		// The thread switches namespace and is never unlocked: when this
		// goroutine ends the runtime ends the thread too, so no other
		// goroutine ever runs in the job's namespace.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare a network namespace: %w", err)
			}
			// Any port is the job's to bind in a namespace of its own, as
			// under runsc (gVisor's netstack has no privileged ports) and
			// as Docker sets it: the sandbox package's permission parity.
			// This thread's /proc/sys/net is the new namespace's.
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0\n"), 0o644); err != nil {
				return fmt.Errorf("let the job bind any port: %w", err)
			}
			src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s on %s: %w", src, path, err)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		return err
	}
	h, err := handleAt(path)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bring lo up in %s: %w", path, err)
	}
	return nil
}

// handleAt is a netlink handle inside the namespace at path.
func handleAt(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in namespace %s: %w", path, err)
	}
	return h, nil
}

// removeNetns unmounts the namespace at path and removes the file. The
// namespace itself goes when its last process (the sandbox's) is gone.
func removeNetns(path string) error {
	var err error
	for try := 0; try < 50; try++ {
		err = unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			err = nil
			break
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err != nil {
		if derr := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); derr != nil {
			return fmt.Errorf("unmount %s: %v (lazy: %v)", path, err, derr)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// makeVeth makes n's veth pair with the job's end in its namespace,
// addresses it, and routes the job's traffic through the host end.
func (m *Manager) makeVeth(n *Net) error {
	ns, err := netns.GetFromPath(n.path)
	if err != nil {
		return fmt.Errorf("open namespace %s: %w", n.path, err)
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: n.veth},
		PeerName:      jobIf,
		PeerNamespace: netlink.NsFd(ns),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s (peer %s in %s): %w", n.veth, jobIf, n.path, err)
	}
	host, err := netlink.LinkByName(n.veth)
	if err != nil {
		return fmt.Errorf("find veth %s: %w", n.veth, err)
	}
	// The alias ties the veth to its job for Recover.
	if err := netlink.LinkSetAlias(host, m.cfg.Name+":"+n.id); err != nil {
		return fmt.Errorf("set alias of %s: %w", n.veth, err)
	}
	// No IPv6 link-local addresses: the pair needs none (routes name
	// global gateways and neighbours are static), and the job then has
	// no link-local address to talk from.
	if err := netlink.LinkSetIP6AddrGenMode(host, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("address generation mode of %s: %w", n.veth, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in namespace %s: %w", n.path, err)
	}
	defer h.Close()
	peer, err := h.LinkByName(jobIf)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", jobIf, n.path, err)
	}
	if err := h.LinkSetIP6AddrGenMode(peer, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("address generation mode of %s in %s: %w", jobIf, n.path, err)
	}
	hostH, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink on the host: %w", err)
	}
	defer hostH.Close()
	a := n.addr
	ends := []struct {
		h       *netlink.Handle
		link    netlink.Link
		where   string
		addrs   []netip.Prefix // its own
		peers   []netip.Prefix // the other end's
		peerMAC net.HardwareAddr
	}{
		{hostH, host, "on the host", []netip.Prefix{a.host4, a.host6}, []netip.Prefix{a.job4, a.job6}, peer.Attrs().HardwareAddr},
		{h, peer, "in " + n.path, []netip.Prefix{a.job4, a.job6}, []netip.Prefix{a.host4, a.host6}, host.Attrs().HardwareAddr},
	}
	for _, e := range ends {
		name := e.link.Attrs().Name
		for _, p := range e.addrs {
			if p.IsValid() {
				if err := e.h.AddrAdd(e.link, nlAddr(p)); err != nil {
					return fmt.Errorf("address %s on %s %s: %w", p, name, e.where, err)
				}
			}
		}
		// Each end knows the other's link-layer address for good: no
		// ARP or neighbour discovery (whose first packets a new link
		// can lose), and nothing the job says can change the host's
		// entry.
		for _, p := range e.peers {
			if p.IsValid() {
				ne := &netlink.Neigh{LinkIndex: e.link.Attrs().Index, State: netlink.NUD_PERMANENT, IP: net.IP(p.Addr().AsSlice()), HardwareAddr: e.peerMAC}
				if err := e.h.NeighSet(ne); err != nil {
					return fmt.Errorf("neighbour %s on %s %s: %w", p.Addr(), name, e.where, err)
				}
			}
		}
		if err := e.h.LinkSetUp(e.link); err != nil {
			return fmt.Errorf("bring %s up %s: %w", name, e.where, err)
		}
	}
	for _, gw := range []netip.Prefix{a.host4, a.host6} {
		if !gw.IsValid() {
			continue
		}
		r := &netlink.Route{LinkIndex: peer.Attrs().Index, Gw: net.IP(gw.Addr().AsSlice())}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("default route via %s in %s: %w", gw.Addr(), n.path, err)
		}
	}
	// The kernel turns a new link's carrier on, and only then gives it a
	// queue that passes packets, from a deferred work item (up to a
	// second later): until then every packet is dropped. Return once
	// both ends pass packets.
	deadline := time.Now().Add(linkUpTimeout)
	for {
		hl, herr := netlink.LinkByName(n.veth)
		pl, perr := h.LinkByName(jobIf)
		if err := errors.Join(herr, perr); err != nil {
			return fmt.Errorf("wait for %s to come up: %w", n.veth, err)
		}
		if hl.Attrs().OperState == netlink.OperUp && pl.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (host end %s, job end %s) did not come up within %s", n.veth, hl.Attrs().OperState, pl.Attrs().OperState, linkUpTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const linkUpTimeout = 5 * time.Second

func nlAddr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		// The pair is alone on its link: duplicate address detection
		// would only delay the address by a second or more.
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// deleteLink deletes the host's link name, if there is one; deleting one
// end of a veth deletes the other, in whatever namespace it is. It
// returns what crossed it (jobBytes) as read just before.
func deleteLink(name string) (sent, received int64, err error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return 0, 0, nil
		}
		return 0, 0, fmt.Errorf("find link %s: %w", name, err)
	}
	sent, received = jobBytes(l)
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return 0, 0, fmt.Errorf("delete link %s: %w", name, err)
	}
	return sent, received, nil
}

// jobBytes are the bytes a job's veth carried, from the counters of its
// host end l: what the host received the job sent, and what the host
// transmitted the job received. Every packet the job exchanges with
// anything but its own loopback crosses it, whatever the policy: the
// executor's egress services and DNS server at the host end too. The
// counts are of whole frames (Ethernet, IP and TCP or UDP headers
// included), not of payload alone.
func jobBytes(l netlink.Link) (sent, received int64) {
	s := l.Attrs().Statistics
	if s == nil {
		return 0, 0
	}
	return int64(s.RxBytes), int64(s.TxBytes) //nolint:gosec // a counter below 2^63
}

// ourLinks maps the name of each host link carrying this manager's alias
// to its job id.
func (m *Manager) ourLinks() (map[string]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[string]string{}
	for _, l := range links {
		if id, ok := strings.CutPrefix(l.Attrs().Alias, m.cfg.Name+":"); ok && l.Type() == "veth" {
			out[l.Attrs().Name] = id
		}
	}
	return out, nil
}
