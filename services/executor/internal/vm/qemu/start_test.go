//go:build linux

package qemu

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/services/executor/internal/vm/kernel"
)

// needQEMU skips (fails under CI=true) without root, QEMU or a cached kernel.
func needQEMU(t *testing.T) kernel.Kernel {
	t.Helper()
	missing := func(format string, a ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format, a...)
		}
		t.Skipf(format, a...)
	}
	if os.Getuid() != 0 {
		missing("needs root")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		missing("qemu-system-x86_64: %v", err)
	}
	k, err := kernel.Find(kernel.Base())
	if err != nil {
		missing("%v (run `airlock-vm kernel fetch`)", err)
	}
	return k
}

// emptyInitrd is a newc archive with only its trailer: the kernel then
// finds no init and panics, which (panic=-1, -no-reboot) ends QEMU.
func emptyInitrd(t *testing.T) string {
	var b bytes.Buffer
	name := "TRAILER!!!\x00"
	fmt.Fprintf(&b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, len(name), 0)
	b.WriteString(name)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	p := filepath.Join(t.TempDir(), "initrd")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func pair(t *testing.T) (*os.File, net.Conn) {
	fds, err := socketPairFDs()
	if err != nil {
		t.Fatal(err)
	}
	mine := os.NewFile(uintptr(fds[1]), "mine")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "theirs"), c
}

// jobNetns makes a namespace as package netpolicy does: eth0 (a veth end)
// with an address, a static neighbour for the gateway and a default route.
func jobNetns(t *testing.T) string {
	name := fmt.Sprintf("vmrt%d", os.Getpid())
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run(); exec.Command("ip", "link", "del", name).Run() })
	run("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)
	run("addr", "add", "10.213.0.1/30", "dev", name)
	run("link", "set", name, "up")
	run("-n", name, "addr", "add", "10.213.0.2/30", "dev", "eth0")
	run("-n", name, "link", "set", "eth0", "up")
	run("-n", name, "route", "add", "default", "via", "10.213.0.1")
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	run("-n", name, "neigh", "replace", "10.213.0.1", "lladdr", l.Attrs().HardwareAddr.String(), "dev", "eth0", "nud", "permanent")
	return "/run/netns/" + name
}

// TestStartInNetns boots a kernel with no init in the job's namespace:
// QEMU starts unprivileged with a tap joined to eth0, and when it ends
// the tap and eth0's redirect are gone.
func TestStartInNetns(t *testing.T) {
	k := needQEMU(t)
	ns := jobNetns(t)
	con, conc := pair(t)
	ag, agc := pair(t)
	defer agc.Close()
	var stderr bytes.Buffer
	start := time.Now()
	m, err := Start(Launch{
		Path: "qemu-system-x86_64",
		Config: Config{Accel: "tcg", CPUs: 1, MemoryBytes: 256 << 20, BIOS: QbootROM, Kernel: k.Vmlinux, Initrd: emptyInitrd(t),
			Append: "console=ttyS0 panic=-1", Shares: []Share{{Tag: "root", Path: "/", ReadOnly: true}}},
		UIDBase: 100000, Netns: ns, Agent: ag, Console: con, Stderr: &stderr,
	})
	con.Close()
	ag.Close()
	if err != nil {
		t.Fatal(err)
	}
	if m.Net.Gateway4 != "10.213.0.1" || len(m.Net.Addresses) != 1 || m.Net.Addresses[0] != "10.213.0.2/30" || m.Net.GatewayMAC == "" {
		t.Errorf("net %+v", m.Net)
	}
	// QEMU runs as the mapped uid.
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.Pid)); err == nil && !strings.Contains(string(st), "Uid:\t100000\t100000") {
		t.Errorf("qemu's ids: %s", st)
	}
	// And it is pid 1 of a PID namespace of its own: it sees, and can
	// signal, no other process of the host.
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.Pid)); err == nil && !strings.Contains(string(st), fmt.Sprintf("NSpid:\t%d\t1\n", m.Pid)) {
		t.Errorf("qemu is not pid 1 of its own PID namespace: %s", st)
	}
	h, err := handleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	tap, err := h.LinkByName(TapName)
	if err != nil {
		t.Fatalf("no tap while qemu runs: %v", err)
	}
	eth, _ := h.LinkByName(JobIf)
	for _, l := range []netlink.Link{eth, tap} {
		fs, err := h.FilterList(l, netlink.MakeHandle(0xffff, 0))
		if err != nil || len(fs) != 1 {
			t.Errorf("filters on %s: %v, %v", l.Attrs().Name, fs, err)
		}
	}
	out, _ := io.ReadAll(conc)
	m.Err()
	t.Logf("%s to the panic", time.Since(start))
	if !bytes.Contains(out, []byte("Kernel panic")) {
		t.Errorf("console: %q", out[max(0, len(out)-500):])
	}
	if _, err := h.LinkByName(TapName); err == nil {
		t.Error("tap left after qemu ended")
	}
	if qs, _ := h.QdiscList(eth); len(qs) > 0 {
		for _, q := range qs {
			if q.Type() == "ingress" {
				t.Errorf("eth0's ingress qdisc left")
			}
		}
	}
}
