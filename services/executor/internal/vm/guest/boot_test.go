//go:build linux

// The boot tests start real QEMU machines under TCG (root, qemu-system-x86_64,
// a kernel: see testKernel) and drive the agent through package vm/client:
//
//	nice go test -run 'TestBoot' ./services/executor/internal/vm/guest/
//
// TestBoot ~35 s (a boot is 4-8 s; the OOM case ~13 s), TestBootHostClose ~11 s,
// TestBootDocker ~50 s (dockerd's start ~10 s, a container ~30 s under TCG).
package guest_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/executor/internal/vm/client"
	"github.com/airlockhq/airlock/services/executor/internal/vm/initramfs"
	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// testKernel finds a kernel directory: AIRLOCK_VM_KERNEL_DIR, else the newest
// in vm/kernel's cache or tools/cgroup2vm's. It returns the vmlinux and the
// lib/modules/<abi> directory. Under CI a missing kernel fails the test.
func testKernel(t *testing.T) (vmlinux, modules string) {
	t.Helper()
	dirs := []string{os.Getenv("AIRLOCK_VM_KERNEL_DIR")}
	if dirs[0] == "" {
		var found []string
		for _, base := range []string{"/var/cache/airlock-vm/kernel", "/var/cache/airlock-cgroup2vm/kernel"} {
			m, _ := filepath.Glob(filepath.Join(base, "*"))
			sort.Sort(sort.Reverse(sort.StringSlice(m)))
			found = append(found, m...)
		}
		dirs = found
	}
	for _, d := range dirs {
		cands, _ := filepath.Glob(filepath.Join(d, "boot", "vmlinux-*"))
		cands = append([]string{filepath.Join(d, "vmlinux")}, cands...)
		mods, _ := filepath.Glob(filepath.Join(d, "lib", "modules", "*"))
		for _, c := range cands {
			if _, err := os.Stat(c); err == nil && len(mods) > 0 {
				return c, mods[0]
			}
		}
	}
	msg := "no kernel: set AIRLOCK_VM_KERNEL_DIR to a directory with vmlinux (or boot/vmlinux-ABI) and lib/modules/ABI"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return "", ""
}

// guestVM is a booted machine with its agent connected.
type guestVM struct {
	c       *client.Client
	qemu    *exec.Cmd
	console string
	exited  chan struct{} // QEMU is gone
}

// boot builds the agent and initramfs, starts QEMU under TCG with the host's
// / shared read-only as the job root, and configures the guest.
func boot(t *testing.T, cfg *proto.Config, extra ...string) *guestVM {
	t.Helper()
	if runtime.GOOS != "linux" || os.Getuid() != 0 {
		t.Skip("needs root on linux")
	}
	vmlinux, modules := testKernel(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	agent := filepath.Join(dir, "airlock-guest")
	build := exec.Command("go", "build", "-o", agent, "github.com/airlockhq/airlock/services/executor/cmd/airlock-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	var img bytes.Buffer
	if err := initramfs.Build(&img, initramfs.Options{Agent: agent, Modules: modules, Gzip: true}); err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd.img")
	if err := os.WriteFile(initrd, img.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	console := filepath.Join(dir, "console.log")
	args := []string{"-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
		"-machine", "pc", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "512",
		"-kernel", vmlinux, "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all",
		"-serial", "file:" + console,
		"-chardev", "socket,id=agent,path=" + sock,
		"-device", "virtio-serial-pci", "-device", "virtserialport,chardev=agent,name=" + "airlock.agent",
		"-virtfs", "local,path=/,mount_tag=root,security_model=passthrough,readonly=on,multidevs=remap"}
	args = append(args, extra...)
	if _, err := os.Stat("/usr/share/qemu/qboot.rom"); err == nil {
		args = append([]string{"-bios", "/usr/share/qemu/qboot.rom"}, args...)
	}
	cmd := exec.Command(qemu, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var qout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &qout, &qout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	qdone := make(chan struct{})
	vm := &guestVM{qemu: cmd, console: console, exited: qdone}
	go func() { cmd.Wait(); close(qdone) }()
	t.Cleanup(func() {
		if vm.c != nil {
			vm.c.Shutdown()
		}
		select {
		case <-qdone:
		case <-time.After(10 * time.Second):
			t.Error("the guest did not power off within 10 s of Shutdown")
			cmd.Process.Kill()
			<-qdone
		}
		if t.Failed() {
			b, _ := os.ReadFile(console)
			t.Logf("qemu: %s\nconsole:\n%s", qout.String(), tail(b, 4000))
		}
	})
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			acc <- c
		}
	}()
	var conn net.Conn
	select {
	case conn = <-acc:
	case <-qdone:
		t.Fatalf("qemu exited before connecting: %s", qout.String())
	case <-time.After(20 * time.Second):
		t.Fatal("qemu did not connect to the agent socket")
	}
	vm.c = client.New(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	h, err := vm.c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hello after %s: %+v", time.Since(start).Round(time.Millisecond), h)
	if cfg == nil {
		return vm
	}
	if err := vm.c.Configure(ctx, *cfg); err != nil {
		t.Fatal(err)
	}
	t.Logf("configured after %s", time.Since(start).Round(time.Millisecond))
	return vm
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// run starts spec and returns its output and exit.
func (vm *guestVM) run(t *testing.T, spec proto.Process) (stdout, stderr string, exit proto.Exit, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	p, err := vm.c.Start(ctx, spec, &out, &errb)
	if err != nil {
		return "", "", proto.Exit{}, err
	}
	exit, err = p.Wait(ctx)
	return out.String(), errb.String(), exit, err
}

var testEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

func TestBoot(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			b := make([]byte, 64)
			n, _ := c.Read(b)
			got <- string(b[:n])
			c.Close()
		}
	}()
	share := t.TempDir()
	os.Chmod(share, 0o777)
	// QEMU's user network: 10.0.2.2 (MAC 52:55:0a:00:02:02) is the host's loopback.
	vm := boot(t, &proto.Config{
		Hostname: "airlock-vm-test",
		Shares: []proto.Share{{Tag: proto.RootTag, Path: "/", RO: true},
			{Tag: "work", Path: "/airlock-test/work", NoSuid: true, NoDev: true}},
		Files:     []proto.File{{Path: "/etc/airlock-vm-test", Mode: 0o644, Content: []byte("from the host\n")}},
		Tmpfs:     []proto.Tmpfs{{Path: "/tmp"}},
		PidsLimit: 64,
		Network: &proto.Network{MAC: "02:00:00:00:00:01", MTU: 1400, Addresses: []string{"10.0.2.15/24", "fec0::15/64"},
			Gateway4: "10.0.2.2", Gateway6: "fec0::2", GatewayMAC: "52:55:0a:00:02:02"},
	}, "-virtfs", "local,path="+share+",mount_tag=work,security_model=passthrough,multidevs=remap",
		"-netdev", "user,id=n0,restrict=off", "-device", "virtio-net-pci,netdev=n0,mac=02:00:00:00:00:01")
	sh := func(script string, uid uint32) proto.Process {
		return proto.Process{Args: []string{"/bin/sh", "-c", script}, Env: testEnv, Cwd: "/", UID: uid, GID: uid}
	}
	t.Run("exit code and output", func(t *testing.T) {
		out, _, exit, err := vm.run(t, sh("echo hi; exit 3", 1000))
		if err != nil || out != "hi\n" || exit.Code != 3 {
			t.Fatalf("got %q %+v %v", out, exit, err)
		}
	})
	t.Run("guest kernel", func(t *testing.T) {
		host, _ := os.ReadFile("/proc/version")
		out, _, exit, err := vm.run(t, proto.Process{Args: []string{"cat", "/proc/version"}, Env: testEnv})
		if err != nil || exit.Code != 0 || out == "" || out == string(host) {
			t.Fatalf("guest /proc/version %q (host %q) %+v %v", out, host, exit, err)
		}
	})
	t.Run("signal", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// Read while the client's reader writes to it.
		var out lockedBuffer
		p, err := vm.c.Start(ctx, sh("echo up; exec sleep 1000", 1000), &out, nil)
		if err != nil {
			t.Fatal(err)
		}
		for !strings.Contains(out.String(), "up") && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		if err := vm.c.Signal(ctx, -p.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		exit, err := p.Wait(ctx)
		if err != nil || exit.Code != 128+9 || exit.Signal != 9 {
			t.Fatalf("got %+v %v", exit, err)
		}
		// The agent and "every process" are not the host's to signal.
		for _, pid := range []int{1, -1, 0} {
			var ge *client.GuestError
			if err := vm.c.Signal(ctx, pid, syscall.SIGKILL); !errors.As(err, &ge) {
				t.Errorf("signal to %d: got %v, want a guest error", pid, err)
			}
		}
	})
	t.Run("exec failures", func(t *testing.T) {
		for _, tc := range []struct {
			arg0, want string
			code       int
		}{
			{"no-such-command", `exec: "no-such-command": executable file not found in $PATH`, 127},
			{"/no/such/file", `exec: "/no/such/file": no such file or directory`, 127},
			{"/etc/airlock-vm-test", `exec: "/etc/airlock-vm-test": permission denied`, 126},
		} {

			_, _, _, err := vm.run(t, proto.Process{Args: []string{tc.arg0}, Env: testEnv, UID: 1000, GID: 1000})
			var ee *client.ExecError
			if !errors.As(err, &ee) || ee.Message != tc.want || ee.Code != tc.code {
				t.Errorf("%s: got %v, want %q (%d)", tc.arg0, err, tc.want, tc.code)
			}
		}
		// A setup failure is the guest's error, not the command's.
		_, _, _, err := vm.run(t, proto.Process{Args: []string{"true"}, Env: testEnv, Cwd: "/no/such/dir"})
		var ge *client.GuestError
		if !errors.As(err, &ge) || !strings.Contains(ge.Message, "chdir") {
			t.Errorf("missing cwd: got %v, want a guest error about chdir", err)
		}
	})
	t.Run("confinement", func(t *testing.T) {
		script := `cat /etc/airlock-vm-test; hostname; id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status;
			touch /etc/x 2>&1 | grep -o 'Read-only file system'; echo ok >/tmp/y && cat /tmp/y; cat /proc/self/cgroup; ps -o pid= -o sid= -p $$ >/dev/null 2>&1; echo sid=$(cut -d' ' -f6 /proc/self/stat) pid=$$`
		spec := sh(script+"; echo nofile=$(ulimit -Sn)/$(ulimit -Hn)", 0)
		spec.Rlimits = []proto.Rlimit{{Type: "RLIMIT_NOFILE", Soft: 1000, Hard: 2000}}
		out, stderr, exit, err := vm.run(t, spec)
		if err != nil || exit.Code != 0 {
			t.Fatalf("got %q %q %+v %v", out, stderr, exit, err)
		}
		for _, want := range []string{"from the host\n", "airlock-vm-test\n", "0\n", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000",
			"NoNewPrivs:\t1", "Read-only file system", "ok\n", "0::/airlock/job\n", "nofile=1000/2000\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		var sid, pid string
		for _, f := range strings.Fields(out) {
			if v, ok := strings.CutPrefix(f, "sid="); ok {
				sid = v
			}
			if v, ok := strings.CutPrefix(f, "pid="); ok {
				pid = v
			}
		}
		if sid == "" || sid != pid {
			t.Errorf("the process is not its session's leader: sid %q pid %q", sid, pid)
		}
	})
	t.Run("network", func(t *testing.T) {
		port := ln.Addr().(*net.TCPAddr).Port
		script := fmt.Sprintf(`cat /sys/class/net/eth0/address /sys/class/net/eth0/mtu /proc/net/if_inet6 /proc/net/route /proc/net/arp /sys/fs/cgroup/airlock/pids.max
			echo hello-host >/dev/tcp/10.0.2.2/%d`, port)
		out, stderr, exit, err := vm.run(t, proto.Process{Args: []string{"bash", "-c", script}, Env: testEnv, UID: 1000, GID: 1000})
		if err != nil || exit.Code != 0 {
			t.Fatalf("got %q %q %+v %v", out, stderr, exit, err)
		}
		for _, want := range []string{"02:00:00:00:00:01\n1400\n", "fec00000000000000000000000000015", "eth0\t00000000\t0202000A",
			"10.0.2.2         0x1         0x6         52:55:0a:00:02:02", "\n64\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "fe80") {
			t.Errorf("a link-local address:\n%s", out)
		}
		select {
		case s := <-got:
			if s != "hello-host\n" {
				t.Errorf("the host got %q", s)
			}
		case <-time.After(10 * time.Second):
			t.Error("no connection from the guest")
		}
	})
	t.Run("share", func(t *testing.T) {
		out, stderr, exit, err := vm.run(t, sh("echo written >/airlock-test/work/f && grep -c nosuid /proc/self/mountinfo >/dev/null && grep ' /airlock-test/work ' /proc/self/mountinfo", 1000))
		if err != nil || exit.Code != 0 || !strings.Contains(out, "nosuid,nodev") {
			t.Fatalf("got %q %q %+v %v", out, stderr, exit, err)
		}
		var st syscall.Stat_t
		b, err := os.ReadFile(filepath.Join(share, "f"))
		if err != nil || string(b) != "written\n" || syscall.Stat(filepath.Join(share, "f"), &st) != nil || st.Uid != 1000 {
			t.Fatalf("on the host: %q %v, owner %d", b, err, st.Uid)
		}
	})
	t.Run("orphans reaped", func(t *testing.T) {
		vm.run(t, sh("sleep 0.2 & sleep 0.2 & exit 0", 1000))
		time.Sleep(time.Second)
		out, _, _, err := vm.run(t, sh("cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"'", 1000))
		if err != nil || out != "" {
			t.Fatalf("zombies: %q %v", out, err)
		}
	})
	t.Run("oom kill counted", func(t *testing.T) {
		// Three 250 MiB buffers filled at once: past the guest's 512 MiB.
		dd := "dd if=/dev/zero of=/dev/null bs=250M count=1 2>/dev/null"
		_, _, exit, err := vm.run(t, sh(dd+" & "+dd+" & "+dd+" & wait", 1000))
		if err != nil || exit.OOMKills < 1 {
			t.Fatalf("got %+v %v", exit, err)
		}
		out, _, exit, err := vm.run(t, sh("echo alive", 1000))
		if err != nil || out != "alive\n" || exit.OOMKills != 0 {
			t.Fatalf("after the oom: %q %+v %v", out, exit, err)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var out bytes.Buffer
		spec := proto.Process{Args: []string{"sh", "-c", "wc -c"}, Env: testEnv, Stdin: true, UID: 1000, GID: 1000}
		p, err := vm.c.Start(ctx, spec, &out, nil)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte("x"), 3<<20) // past the stdin window: flow control must work
		if _, err := p.Stdin.Write(data); err != nil {
			t.Fatal(err)
		}
		p.Stdin.Close()
		exit, err := p.Wait(ctx)
		if err != nil || exit.Code != 0 || strings.TrimSpace(out.String()) != "3145728" {
			t.Fatalf("got %q %+v %v", out.String(), exit, err)
		}
		// Stdin to a process that does not read it and exits: the writer
		// ends, and the connection survives the acknowledgements in flight.
		spec.Args = []string{"sh", "-c", "sleep 0.3"}
		p, err = vm.c.Start(ctx, spec, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				if _, err := p.Stdin.Write(make([]byte, 256<<10)); err != nil {
					return
				}
			}
		}()
		if exit, err = p.Wait(ctx); err != nil || exit.Code != 0 {
			t.Fatalf("got %+v %v", exit, err)
		}
		if out, _, _, err := vm.run(t, sh("echo still", 1000)); err != nil || out != "still\n" {
			t.Fatalf("after: %q %v (connection: %v)", out, err, vm.c.Err())
		}
	})
}

// The host closing the connection powers the guest off.
func TestBootHostClose(t *testing.T) {
	vm := boot(t, &proto.Config{Shares: []proto.Share{{Tag: proto.RootTag, Path: "/", RO: true}}})
	c := vm.c
	vm.c = nil
	c.Close()
	select {
	case <-vm.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the guest still runs 10 s after the host closed the connection")
	}
}

// A Config the guest cannot carry out is an error naming why, then power-off.
func TestBootConfigError(t *testing.T) {
	vm := boot(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := vm.c.Configure(ctx, proto.Config{Shares: []proto.Share{{Tag: proto.RootTag, Path: "/", RO: true},
		{Tag: "nosuchtag", Path: "/x"}}})
	var ge *client.GuestError
	if !errors.As(err, &ge) || !strings.Contains(ge.Message, `mount 9p share "nosuchtag" at`) {
		t.Fatalf("got %v", err)
	}
	select {
	case <-vm.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the guest still runs 10 s after its config failed")
	}
}

// TestInitramfsGzip builds from a real kernel's modules: compressed, in dependency order.
func TestInitramfsGzip(t *testing.T) {
	_, modules := testKernel(t)
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("x"), 0o755)
	var b bytes.Buffer
	if err := initramfs.Build(&b, initramfs.Options{Agent: agent, Modules: modules, Gzip: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := gzip.NewReader(&b); err != nil {
		t.Fatal(err)
	}
	mods, err := initramfs.Resolve(modules, initramfs.DefaultModules)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Name)
	}
	// Dependencies come before what needs them.
	for _, pair := range [][2]string{{"virtio_ring", "virtio_pci"}, {"9pnet", "9pnet_virtio"}, {"netfs", "9p"}, {"jbd2", "ext4"}} {
		i, j := slices.Index(names, pair[0]), slices.Index(names, pair[1])
		if i < 0 || j < 0 || i > j {
			t.Errorf("load order %q: %s should precede %s", names, pair[0], pair[1])
		}
	}
}

// lockedBuffer is a bytes.Buffer a test may read while the client writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
