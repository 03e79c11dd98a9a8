//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/services/executor/internal/vm/kernel"
	"github.com/airlockhq/airlock/services/executor/internal/vm/qemu"
)

// vmHost is what the integration tests need: built binaries, a kernel,
// QEMU and an accelerator. Without them the tests skip, or fail under
// CI=true.
type vmHost struct {
	cli, agent string
	kernel     kernel.Kernel
	accel      string
	root, log  string
}

func needVM(t *testing.T) vmHost {
	t.Helper()
	missing := func(format string, a ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format, a...)
		}
		t.Skipf(format, a...)
	}
	if os.Getuid() != 0 {
		missing("the VM runtime needs root (user namespaces with a mapped range, the job's cgroup and netns)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		missing("qemu-system-x86_64: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := kernel.Fetch(ctx, kernel.Base())
	if err != nil {
		missing("kernel: %v", err)
	}
	buildOnce.Do(func() { buildErr = buildBinaries() })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	dir := t.TempDir()
	h := vmHost{
		cli: filepath.Join(binDir, "airlock-vm"), agent: filepath.Join(binDir, "airlock-guest"),
		kernel: k, accel: "tcg", root: filepath.Join(dir, "state"), log: filepath.Join(dir, "log.json"),
	}
	if _, err := os.Stat("/dev/kvm"); err == nil {
		h.accel = "kvm"
	}
	return h
}

// The binaries are built once per test binary, into binDir.
var (
	buildOnce sync.Once
	buildErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func buildBinaries() error {
	var err error
	if binDir, err = os.MkdirTemp("", "airlock-vm-test-"); err != nil {
		return err
	}
	for _, b := range []struct{ out, pkg string }{{"airlock-vm", "."}, {"airlock-guest", "../airlock-guest"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

// cmd is an airlock-vm command with the global flags.
func (h vmHost) cmd(args ...string) *exec.Cmd {
	g := []string{"--root", h.root, "--log", h.log, "--log-format", "json", "--kernel", h.kernel.Dir, "--accel", h.accel, "--agent", h.agent}
	return exec.Command(h.cli, append(g, args...)...)
}

// testUIDBase is the bundles' uid-base: no host user has ids there.
const testUIDBase = 100000

// bundle writes a bundle whose root is the host's / (read-only) running args.
func bundle(t *testing.T, args ...string) string {
	t.Helper()
	b := t.TempDir()
	work := filepath.Join(b, "work")
	// Owned by the job's root, as the sandbox makes it: QEMU's 9p server
	// writes as uid-base+uid.
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(work, testUIDBase, testUIDBase); err != nil {
		t.Fatal(err)
	}
	spec := specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: "/", Readonly: true},
		Hostname: "vmjob",
		Process:  &specs.Process{Args: args, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, Cwd: "/work"},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/work", Type: "bind", Source: work, Options: []string{"bind", "rw", "nosuid", "nodev"}},
		},
		Annotations: map[string]string{annUIDBase: strconv.Itoa(testUIDBase), annMemory: strconv.Itoa(384 << 20), annCPUs: "1"},
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(b, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func exitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// gone checks that nothing of id is left: state, QEMU.
func (h vmHost) gone(t *testing.T, id string, qemuPid int) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(h.root, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state of %s left: %v", id, err)
	}
	if qemuPid > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", qemuPid)); err == nil && strings.Contains(string(b), "qemu") {
			t.Errorf("qemu %d still runs", qemuPid)
		}
	}
}

func TestRunJob(t *testing.T) {
	h := needVM(t)
	hostVersion, _ := os.ReadFile("/proc/version")
	b := bundle(t, "/bin/sh", "-c", "cat /proc/version; hostname; echo to-stderr >&2; echo made >/work/f; exit 3")
	pidFile := filepath.Join(b, "pid")
	var out, errb bytes.Buffer
	cmd := h.cmd("run", "--bundle", b, "--pid-file", pidFile, "job1")
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	t.Logf("run: %s", time.Since(start))
	logData, _ := os.ReadFile(h.log)
	if exitStatus(err) != 3 {
		t.Fatalf("run: %v, want exit 3\nstdout %s\nstderr %s\nlog %s", err, out.String(), errb.String(), logData)
	}
	if !strings.Contains(out.String(), "Linux version "+h.kernel.ABI) || strings.Contains(out.String(), string(hostVersion)) {
		t.Errorf("stdout %q: want the guest's /proc/version (%s), not the host's", out.String(), h.kernel.ABI)
	}
	if !strings.Contains(out.String(), "vmjob") || !strings.Contains(errb.String(), "to-stderr") {
		t.Errorf("stdout %q stderr %q", out.String(), errb.String())
	}
	if data, err := os.ReadFile(filepath.Join(b, "work", "f")); err != nil || string(data) != "made\n" {
		t.Errorf("the job's file: %q, %v (stderr %q)", data, err, errb.String())
	}
	// The guest's root (uid 0) writes as uid-base on the host.
	if st, err := os.Stat(filepath.Join(b, "work", "f")); err == nil {
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid != testUIDBase {
			t.Errorf("the job's file is owned by host uid %d, want %d", uid, testUIDBase)
		}
	}
	var res result
	if data, err := os.ReadFile(filepath.Join(b, "vm-result.json")); err != nil || json.Unmarshal(data, &res) != nil || res.ExitCode != 3 || !strings.Contains(res.GuestKernel, h.kernel.ABI) {
		t.Errorf("vm-result.json: %+v, %v", res, err)
	}
	pid, _ := os.ReadFile(pidFile)
	qpid, _ := strconv.Atoi(string(pid))
	if qpid <= 0 {
		t.Errorf("pid file %q", pid)
	}
	if err := h.cmd("delete", "--force", "job1").Run(); err != nil {
		t.Errorf("delete: %v", err)
	}
	h.gone(t, "job1", qpid)
}

func TestRunExecFailure(t *testing.T) {
	h := needVM(t)
	b := bundle(t, "no-such-command")
	pidFile := filepath.Join(b, "pid")
	err := h.cmd("run", "--bundle", b, "--pid-file", pidFile, "job2").Run()
	logData, _ := os.ReadFile(h.log)
	if exitStatus(err) != 127 || !strings.Contains(string(logData), `exec: \"no-such-command\": executable file not found in $PATH`) {
		t.Errorf("run: %v, want 127 and the exec error in the log:\n%s", err, logData)
	}
	if _, err := os.Stat(pidFile); err == nil {
		t.Error("pid file written for a job that never ran")
	}
	h.gone(t, "job2", 0)
}

// startLong starts a run of `sleep 600` and waits until its job runs.
func (h vmHost) startLong(t *testing.T, id string) (b string, qpid int, runDone chan error) {
	t.Helper()
	b = bundle(t, "sleep", "600")
	pidFile := filepath.Join(b, "pid")
	run := h.cmd("run", "--bundle", b, "--pid-file", pidFile, id)
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	runDone = make(chan error, 1)
	go func() { runDone <- run.Wait() }()
	t.Cleanup(func() { run.Process.Kill() })
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if pid, err := os.ReadFile(pidFile); err == nil {
			qpid, _ = strconv.Atoi(string(pid))
			return b, qpid, runDone
		}
		select {
		case err := <-runDone:
			logData, _ := os.ReadFile(h.log)
			t.Fatalf("run ended: %v\n%s", err, logData)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no pid file")
		}
	}
}

func TestExecKillDelete(t *testing.T) {
	h := needVM(t)
	b, qpid, runDone := h.startLong(t, "job3")

	proc := filepath.Join(b, "process.json")
	data, _ := json.Marshal(specs.Process{Args: []string{"/bin/sh", "-c", "read x; echo got $x; exit 5"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}})
	os.WriteFile(proc, data, 0o644)
	ipid := filepath.Join(b, "ipid")
	var out bytes.Buffer
	x := h.cmd("exec", "--process", proc, "--pid-file", filepath.Join(b, "xpid"), "--internal-pid-file", ipid, "job3")
	x.Stdin, x.Stdout = strings.NewReader("hello\n"), &out
	start := time.Now()
	if err := x.Run(); exitStatus(err) != 5 || out.String() != "got hello\n" {
		logData, _ := os.ReadFile(h.log)
		t.Errorf("exec: %v, stdout %q, want 5 and %q\n%s", err, out.String(), "got hello\n", logData)
	}
	t.Logf("exec: %s", time.Since(start))
	if g, _ := os.ReadFile(ipid); len(g) == 0 {
		t.Error("no internal pid file")
	}

	// A command that ignores its stdin ends while the writer still holds
	// the pipe open: the exec ends with it.
	pr, pw, _ := os.Pipe()
	defer pw.Close()
	data, _ = json.Marshal(specs.Process{Args: []string{"true"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}})
	os.WriteFile(proc, data, 0o644)
	x = h.cmd("exec", "--process", proc, "job3")
	x.Stdin = pr
	xdone := make(chan error, 1)
	go func() { xdone <- x.Run() }()
	select {
	case err := <-xdone:
		if err != nil {
			t.Errorf("exec true: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("exec of a command ignoring an open stdin did not end")
	}
	pr.Close()

	// A missing command: 127 and runc's message, no pid files.
	data, _ = json.Marshal(specs.Process{Args: []string{"no-such-command"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}})
	os.WriteFile(proc, data, 0o644)
	os.Remove(ipid)
	if err := h.cmd("exec", "--process", proc, "--internal-pid-file", ipid, "job3").Run(); exitStatus(err) != 127 {
		t.Errorf("exec of a missing command: %v, want 127", err)
	}
	if _, err := os.Stat(ipid); err == nil {
		t.Error("internal pid file written for a command that never ran")
	}

	// Signals to the exec CLI reach its command; the CLI killed kills it.
	data, _ = json.Marshal(specs.Process{Args: []string{"sleep", "600"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}})
	os.WriteFile(proc, data, 0o644)
	// 0: `airlock-vm kill --pgid` from another process.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, 0} {
		os.Remove(ipid)
		x = h.cmd("exec", "--process", proc, "--internal-pid-file", ipid, "job3")
		if err := x.Start(); err != nil {
			t.Fatal(err)
		}
		var gpid []byte
		for i := 0; i < 600 && len(gpid) == 0; i++ {
			time.Sleep(50 * time.Millisecond)
			gpid, _ = os.ReadFile(ipid)
		}
		if sig != 0 {
			x.Process.Signal(sig)
		} else if err := h.cmd("kill", "--pgid", string(gpid), "job3", "KILL").Run(); err != nil {
			t.Errorf("kill --pgid %s: %v", gpid, err)
		}
		err := x.Wait()
		if want := map[syscall.Signal]int{syscall.SIGTERM: 128 + 15, 0: 128 + 9}[sig]; want != 0 && exitStatus(err) != want {
			t.Errorf("exec after signal %d: %v, want %d", sig, err, want)
		}
		data, _ = json.Marshal(specs.Process{Args: []string{"sh", "-c", "sleep 0.5; kill -0 " + string(gpid)}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}})
		os.WriteFile(proc+".check", data, 0o644)
		if err := h.cmd("exec", "--process", proc+".check", "job3").Run(); len(gpid) == 0 || exitStatus(err) != 1 {
			t.Errorf("after %v to the exec CLI, its command %q: kill -0 says %v, want it gone", sig, gpid, err)
		}
	}

	if err := h.cmd("kill", "job3", "TERM").Run(); err != nil {
		t.Errorf("kill: %v", err)
	}
	select {
	case err := <-runDone:
		if exitStatus(err) != 128+15 {
			t.Errorf("run after kill TERM: %v, want %d", err, 128+15)
		}
	case <-time.After(30 * time.Second):
		t.Error("run did not end after kill TERM")
	}
	if err := h.cmd("delete", "--force", "job3").Run(); err != nil {
		t.Errorf("delete: %v", err)
	}
	h.gone(t, "job3", qpid)
}

func TestDeleteRunning(t *testing.T) {
	h := needVM(t)
	_, qpid, runDone := h.startLong(t, "job4")
	if err := h.cmd("delete", "--force", "job4").Run(); err != nil {
		logData, _ := os.ReadFile(h.log)
		t.Errorf("delete: %v\n%s", err, logData)
	}
	select {
	case <-runDone:
	case <-time.After(10 * time.Second):
		t.Error("run still there after delete --force")
	}
	h.gone(t, "job4", qpid)
}

// jobNetns makes a namespace as package netpolicy does: eth0 (a veth end)
// with an address, a static neighbour for the gateway (the host end) and
// a default route through it. It returns the namespace's path and the
// host end's address.
func jobNetns(t *testing.T) (string, string) {
	name := fmt.Sprintf("avm%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run(); exec.Command("ip", "link", "del", name).Run() })
	run("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)
	run("addr", "add", "10.214.0.1/30", "dev", name)
	run("link", "set", name, "up")
	run("-n", name, "addr", "add", "10.214.0.2/30", "dev", "eth0")
	run("-n", name, "link", "set", "eth0", "up")
	run("-n", name, "route", "add", "default", "via", "10.214.0.1")
	mac, err := os.ReadFile("/sys/class/net/" + name + "/address")
	if err != nil {
		t.Fatal(err)
	}
	run("-n", name, "neigh", "replace", "10.214.0.1", "lladdr", strings.TrimSpace(string(mac)), "dev", "eth0", "nud", "permanent")
	return "/run/netns/" + name, "10.214.0.1"
}

// TestRunNetCgroupDisk runs a job with everything a real bundle has: its
// netns (the guest reaches a listener on the host end of the veth), its
// cgroup (QEMU is in it) and a disk image (made, owned by uid-base).
func TestRunNetCgroupDisk(t *testing.T) {
	h := needVM(t)
	ns, gw := jobNetns(t)
	ln, err := net.Listen("tcp", gw+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	b := bundle(t, "bash", "-c", fmt.Sprintf("echo from-guest >/dev/tcp/%s/%d && sleep 1", gw, port))
	cgPath := fmt.Sprintf("/airlock-vm-test-%d/ctr", os.Getpid())
	disk := filepath.Join(b, "disk.img")
	var spec specs.Spec
	data, _ := os.ReadFile(filepath.Join(b, "config.json"))
	json.Unmarshal(data, &spec)
	spec.Linux = &specs.Linux{CgroupsPath: cgPath, Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: ns}}}
	spec.Annotations[annDisk] = disk
	spec.Annotations[annDiskBytes] = strconv.Itoa(256 << 20)
	data, _ = json.Marshal(spec)
	os.WriteFile(filepath.Join(b, "config.json"), data, 0o644)

	var out, errb bytes.Buffer
	run := h.cmd("run", "--bundle", b, "--pid-file", filepath.Join(b, "pid"), "job5")
	run.Stdout, run.Stderr = &out, &errb
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	dirs, derr := qemu.CgroupDirs(cgPath)
	t.Cleanup(func() {
		for _, d := range dirs {
			os.Remove(d)
			os.Remove(filepath.Dir(d))
		}
	})
	var qemuCg string
	for deadline := time.Now().Add(2 * time.Minute); qemuCg == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if pid, err := os.ReadFile(filepath.Join(b, "pid")); err == nil {
			cg, _ := os.ReadFile("/proc/" + string(pid) + "/cgroup")
			qemuCg = string(cg)
			break
		}
	}
	err = run.Wait()
	logData, _ := os.ReadFile(h.log)
	if err != nil {
		t.Fatalf("run: %v\nstdout %s\nstderr %s\nlog %s", err, out.String(), errb.String(), logData)
	}
	select {
	case s := <-got:
		if s != "from-guest\n" {
			t.Errorf("the host end got %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Error("nothing reached the host end of the veth")
	}
	if derr != nil {
		t.Fatal(derr)
	}
	if !strings.Contains(qemuCg, cgPath) {
		t.Errorf("qemu's cgroups %q: want %s", qemuCg, cgPath)
	}
	st, err := os.Stat(disk)
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != testUIDBase {
		t.Errorf("disk image: %v, %+v", err, st)
	}
	if err := h.cmd("delete", "--force", "job5").Run(); err != nil {
		t.Errorf("delete: %v", err)
	}
	h.gone(t, "job5", 0)
	nsName := filepath.Base(ns)
	if out, err := exec.Command("ip", "-n", nsName, "link", "show", qemu.TapName).CombinedOutput(); err == nil {
		t.Errorf("tap left in the job's namespace: %s", out)
	}
	if out, _ := exec.Command("tc", "-n", nsName, "qdisc", "show", "dev", "eth0", "ingress").CombinedOutput(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("eth0's ingress redirect left: %s", out)
	}
}
