package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
)

// policyHost is a network namespace of the test's own with two TCP
// listeners, joined to the host by a veth pair. Everything from the
// netpolicy pool is routed into it (a policy-routing rule, whatever the
// destination), so nothing a job sends leaves the machine even if the
// rules were wrong.
type policyHost struct {
	ip           netip.Addr
	portA, portB int
}

func startPolicyHost(t *testing.T, pool netip.Prefix) policyHost {
	t.Helper()
	n := testSeq.Add(1)
	tag := fmt.Sprintf("%x%02x", os.Getpid()&0xffff, n&0xff)
	hostIf, peerIf := "alk"+tag+"h", "alk"+tag+"p"
	base := ((os.Getpid()%512)*64 + int(n%64)) * 4 // a /30 in 198.18.0.0/15, as startTestHost
	prefix := fmt.Sprintf("198.%d.%d.", 18+base>>16, base>>8&0xff)
	hostAddr := netip.MustParseAddr(fmt.Sprintf("%s%d", prefix, base&0xff+1))
	ph := policyHost{ip: hostAddr.Next()}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	must(netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: peerIf}))
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
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
		t.Fatalf("back to the host netns: %v", err)
	}
	runtime.UnlockOSThread()
	t.Cleanup(func() { ns.Close(); orig.Close() })

	peer, err := netlink.LinkByName(peerIf)
	must(err)
	must(netlink.LinkSetNsFd(peer, int(ns)))
	host, err := netlink.LinkByName(hostIf)
	must(err)
	must(netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: hostAddr.AsSlice(), Mask: net.CIDRMask(30, 32)}}))
	must(netlink.LinkSetUp(host))
	h, err := netlink.NewHandleAt(ns)
	must(err)
	defer h.Close()
	p, err := h.LinkByName(peerIf)
	must(err)
	must(h.AddrAdd(p, &netlink.Addr{IPNet: &net.IPNet{IP: ph.ip.AsSlice(), Mask: net.CIDRMask(30, 32)}}))
	must(h.LinkSetUp(p))
	must(h.RouteAdd(&netlink.Route{LinkIndex: p.Attrs().Index, Gw: hostAddr.AsSlice()}))
	waitFor(t, "the test host's veth to come up", 5*time.Second, func() bool {
		a, err1 := netlink.LinkByName(hostIf)
		b, err2 := h.LinkByName(peerIf)
		return err1 == nil && err2 == nil && a.Attrs().OperState == netlink.OperUp && b.Attrs().OperState == netlink.OperUp
	})

	table := 30000 + int(n%64) + (os.Getpid()%1000)*64
	must(netlink.RouteAdd(&netlink.Route{Table: table, LinkIndex: host.Attrs().Index, Gw: ph.ip.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}))
	rule := netlink.NewRule()
	rule.Family = unix.AF_INET
	rule.Priority = 100
	rule.Table = table
	rule.Src = &net.IPNet{IP: pool.Addr().AsSlice(), Mask: net.CIDRMask(pool.Bits(), 32)}
	must(netlink.RuleAdd(rule))
	t.Cleanup(func() {
		if err := netlink.RuleDel(rule); err != nil {
			t.Errorf("delete rule: %v", err)
		}
	})

	for _, port := range []*int{&ph.portA, &ph.portB} {
		ln := func() net.Listener {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			must(netns.Set(ns))
			ln, lerr := net.Listen("tcp4", ph.ip.String()+":0")
			if err := netns.Set(orig); err != nil {
				fmt.Fprintln(os.Stderr, "cannot return to the host netns:", err)
				os.Exit(1)
			}
			must(lerr)
			return ln
		}()
		*port = ln.Addr().(*net.TCPAddr).Port
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
	}
	return ph
}

func (ph policyHost) addr(port int) string { return fmt.Sprintf("%s:%d", ph.ip, port) }

// runInNet runs script in a sandbox of class c that joins nn's namespace;
// during, if set, runs beside the job.
func (e *env) runInNet(t *testing.T, c Class, nn *netpolicy.Net, src, script string, during func(*Sandbox)) ran {
	t.Helper()
	var out, errb syncBuffer
	sb, err := e.m.Create(context.Background(), Spec{ID: nn.ID(), Class: c, Source: src, Command: []string{"/bin/sh", "-c", script},
		Limits: defaultLimits, NetNS: nn.Path(), Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	done := make(chan struct{})
	if during != nil {
		go func() {
			defer close(done)
			during(sb)
		}()
	} else {
		close(done)
	}
	res, err := sb.Run(context.Background())
	<-done
	r := ran{sb: sb, res: res, err: err, stdout: out.String(), stderr: errb.String()}
	t.Logf("%s in %s: reason=%s exit=%d msg=%q\nstdout: %s\nstderr: %s", c, nn.Path(), res.Reason, res.ExitCode, res.Message, trunc(r.stdout), trunc(r.stderr))
	return r
}

// A job joins the namespace package netpolicy made for it: with an allow
// rule it reaches the allowed port of the test host and nothing else;
// deny-all leaves it loopback only. Both runtimes.
func TestNetworkPolicyNamespace(t *testing.T) {
	e := newEnv(t)
	pool := netip.MustParsePrefix(fmt.Sprintf("10.215.%d.0/24", os.Getpid()%256))
	nm, err := netpolicy.New(netpolicy.Config{
		Dir:    filepath.Join(e.base, "netpolicy"),
		Name:   fmt.Sprintf("sbt%d", os.Getpid()),
		Pool4:  pool,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nm.Close(); err != nil {
			t.Errorf("netpolicy Close: %v", err)
		}
	})
	ph := startPolicyHost(t, pool)
	src := e.source(t, nil)
	// The probe prints ALLOWED (exit 1) when it connects, "denied" (exit
	// 0) when it cannot.
	script := fmt.Sprintf(`./probe dial %s; echo "a=$?"; ./probe dial %s; echo "b=$?"; ./probe loopback; echo "lo=$?"; cat /proc/net/dev`,
		ph.addr(ph.portA), ph.addr(ph.portB))

	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			var opts []netpolicy.CreateOption
			if c == ClassRunsc {
				// gVisor copies the interfaces once, at start.
				opts = append(opts, netpolicy.FixedInterfaces())
			}
			newNet := func(p netpolicy.Policy) *netpolicy.Net {
				nn, err := nm.Create(context.Background(), fmt.Sprintf("job-%d", testSeq.Add(1)), p, opts...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := nn.Close(); err != nil {
						t.Errorf("netpolicy Net.Close: %v", err)
					}
				})
				return nn
			}

			allowA := netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(ph.ip, 32), Ports: []uint16{uint16(ph.portA)}}}}
			r := e.runInNet(t, c, newNet(allowA), src, script, nil)
			wantExit(t, r, 0)
			for _, want := range []string{"ALLOWED: dial " + ph.addr(ph.portA), "a=1", "denied: dial " + ph.addr(ph.portB), "b=0", "loopback ok", "lo=0", "eth0:"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("allow port A: output lacks %q", want)
				}
			}

			r = e.runInNet(t, c, newNet(netpolicy.Policy{}), src, script, nil)
			wantExit(t, r, 0)
			for _, want := range []string{"denied: dial " + ph.addr(ph.portA), "a=0", "b=0", "loopback ok", "lo=0"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("deny-all: output lacks %q", want)
				}
			}
			if strings.Contains(r.stdout, "eth0") {
				t.Errorf("deny-all: the job sees an interface besides lo")
			}

			// A running job's rules change from port A to port B; under
			// runsc too, since only the host's rules change.
			live := newNet(allowA)
			liveScript := fmt.Sprintf(`./probe dial %[1]s; echo "before_a=$?"; touch /out/ready
i=0; while [ ! -f /out/go ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done
./probe dial %[1]s; echo "after_a=$?"; ./probe dial %[2]s; echo "after_b=$?"`, ph.addr(ph.portA), ph.addr(ph.portB))
			var applyErr error
			r = e.runInNet(t, c, live, src, liveScript, func(sb *Sandbox) {
				for i := 0; i < 300; i++ {
					if _, err := os.Stat(filepath.Join(sb.OutDir(), "ready")); err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				allowB := netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(ph.ip, 32), Ports: []uint16{uint16(ph.portB)}}}}
				applyErr = live.Apply(context.Background(), allowB, 2)
				_ = os.WriteFile(filepath.Join(sb.OutDir(), "go"), nil, 0o644)
			})
			if applyErr != nil {
				t.Fatalf("Apply: %v", applyErr)
			}
			wantExit(t, r, 0)
			for _, want := range []string{"before_a=1", "after_a=0", "after_b=1"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("live change A to B: output lacks %q", want)
				}
			}
		})
	}
}
