package sandbox

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const testHostGreeting = "hello from the test host"

// startTestHost makes a network namespace of its own with a TCP listener
// in it, reachable from the host's namespace over a veth pair: the
// destination a deny-all sandbox must not reach while the host can. The
// addresses are from 198.18.0.0/15 (RFC 2544, benchmarking), which exist
// only inside the pair. It returns "ip:port".
func startTestHost(t *testing.T) string {
	t.Helper()
	n := testSeq.Add(1)
	// Names and subnets unique per test process too: two test binaries
	// may run at once.
	tag := fmt.Sprintf("%x%02x", os.Getpid()&0xffff, n&0xff)
	hostIf, peerIf := "alk"+tag+"h", "alk"+tag+"p"
	base := ((os.Getpid()%512)*64 + int(n%64)) * 4 // a /30 in 198.18.0.0/15
	prefix := fmt.Sprintf("198.%d.%d.", 18+base>>16, base>>8&0xff)
	hostAddr := fmt.Sprintf("%s%d/30", prefix, base&0xff+1)
	peerIP := fmt.Sprintf("%s%d", prefix, base&0xff+2)

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: peerIf}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})

	// netns.New switches the calling thread into the new namespace: do it
	// on a locked thread and switch straight back.
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		// This thread is stuck in the wrong namespace; never reuse it.
		t.Fatalf("back to the host netns: %v", err)
	}
	runtime.UnlockOSThread()
	t.Cleanup(func() { ns.Close(); orig.Close() })

	peer, err := netlink.LinkByName(peerIf)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		t.Fatalf("move veth peer: %v", err)
	}
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(hostAddr)
	if err := netlink.AddrAdd(host, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p, err := h.LinkByName(peerIf)
	if err != nil {
		t.Fatal(err)
	}
	paddr, _ := netlink.ParseAddr(peerIP + "/30")
	if err := h.AddrAdd(p, paddr); err != nil {
		t.Fatal(err)
	}
	for _, l := range []netlink.Link{p} {
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}

	// The listening socket belongs to the namespace it was made in.
	ln := func() net.Listener {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := netns.Set(ns); err != nil {
			t.Fatal(err)
		}
		ln, lerr := net.Listen("tcp4", peerIP+":0")
		if err := netns.Set(orig); err != nil {
			fmt.Fprintln(os.Stderr, "cannot return to the host netns:", err)
			os.Exit(1)
		}
		if lerr != nil {
			t.Fatal(lerr)
		}
		return ln
	}()
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, testHostGreeting)
			c.Close()
		}
	}()
	return ln.Addr().String()
}
