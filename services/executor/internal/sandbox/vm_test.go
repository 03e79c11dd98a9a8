package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
)

// The VM class's tests boot real QEMU machines: under TCG emulation here
// (no usable /dev/kvm), a boot takes seconds of both cores, so each test
// boots as few machines as it can and the suite stays at a handful. They
// need bin/airlock-vm and bin/airlock-guest (make build; AIRLOCK_VM names
// another airlock-vm) and a cached guest kernel (make build runs
// `airlock-vm kernel fetch`). A missing prerequisite fails the test under
// CI=true; elsewhere the test says why it cannot run.

// vmEnv is an env whose manager runs the VM class, under emulation where
// KVM is not usable.
func vmEnv(t testing.TB) *env {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := envOr("AIRLOCK_VM", filepath.Join(root, "bin", "airlock-vm"))
	if _, err := os.Stat(path); err != nil {
		vmMissing(t, fmt.Sprintf("the VM runtime %s: %v: run `make build` (or set AIRLOCK_VM)", path, err))
	}
	e := newEnv(t, func(c *Config) {
		c.VM = VMConfig{Path: path, Emulation: true, Kernel: os.Getenv("AIRLOCK_VM_KERNEL")}
	})
	if st, ok := e.m.Available(ClassVM); !ok {
		vmMissing(t, "the vm class is unavailable: "+st.Reason)
	}
	return e
}

func vmMissing(t testing.TB, why string) {
	t.Helper()
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("%s (CI=true: the VM class must be tested)", why)
	}
	t.Skipf("cannot test the VM class here: %s", why)
}

// vmLimits are roomy for a guest kernel and its agent under emulation.
var vmLimits = Limits{CPUMillis: 2000, MemoryBytes: 512 << 20, Pids: 256, DiskBytes: 256 << 20, Deadline: 3 * time.Minute}

func (e *env) runVM(t *testing.T, j job) ran {
	t.Helper()
	j.class = ClassVM
	if j.limits == nil {
		l := vmLimits
		j.limits = &l
	}
	return e.run(t, context.Background(), j)
}

// One machine: the exit status comes back, the kernel is the guest's, the
// result names the emulation, and from inside no host secret is readable,
// the root is read-only and the job has no capabilities.
func TestVMJobAndBoundary(t *testing.T) {
	e := vmEnv(t)
	const marker = "AIRLOCK-DUMMY-SECRET"
	secrets := []string{
		filepath.Join(e.base, "secret.txt"),
		filepath.Join(e.cfg.StateDir, "secret.txt"),
		fmt.Sprintf("/root/airlock-vm-test-secret-%d", os.Getpid()),
	}
	for i, p := range secrets {
		if err := os.WriteFile(p, []byte(fmt.Sprintf("%s-%d\n", marker, i)), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	var script strings.Builder
	script.WriteString("exec 2>&1\necho kernel: $(cat /proc/version)\n")
	for _, p := range secrets {
		for _, via := range []string{"", "/proc/1/root", "/work/../.."} {
			fmt.Fprintf(&script, "echo try %s%s; cat %s%s\n", via, p, via, p)
		}
		// A symlink in /work is resolved by the guest's kernel, in the
		// guest: it names the guest's file, never the host's.
		fmt.Fprintf(&script, "ln -sf %s /work/link; echo try link; cat /work/link\n", p)
	}
	script.WriteString(`echo try grep; grep -rs AIRLOCK-DUMMY / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr --exclude-dir=dev
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status
echo id: $(id -u)
touch /usr/bin/evil; echo "usr=$?"
touch /etc/evil; echo "etc=$?"
mount -t tmpfs none /mnt; echo "mount=$?"
echo hostname=$(hostname)
echo work: $(cat /work/hello.txt)
echo made > /work/new.txt
echo out > /out/result.txt
exit 7
`)
	src := e.source(t, map[string]string{"hello.txt": "hello from the host"})
	r := e.runVM(t, job{src: src, cmd: []string{"sh", "-c", script.String()}, user: runspec.Agent})
	if r.err != nil {
		t.Fatal(r.err)
	}
	wantExit(t, r, 7)
	if strings.Contains(r.stdout, marker) {
		t.Fatalf("a secret leaked into the VM:\n%s", r.stdout)
	}
	hostVersion, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	kernel := lineAfter(r.stdout, "kernel: ")
	if kernel == "" || kernel == strings.TrimSpace(string(hostVersion)) {
		t.Errorf("/proc/version inside is %q; want the guest's kernel, not the host's %q", kernel, strings.TrimSpace(string(hostVersion)))
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "id: 1000", "hostname=airlock", "work: hello from the host"} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, bad := range []string{"usr=0", "etc=0", "mount=0"} {
		if strings.Contains(r.stdout, bad+"\n") {
			t.Errorf("got %q: the VM allowed it", bad)
		}
	}
	if n := strings.Count(r.stdout, "try "); n < 4*len(secrets) {
		t.Errorf("only %d attempts ran", n)
	}
	if !strings.Contains(r.res.RuntimeVersion, "emulated") {
		t.Errorf("RuntimeVersion %q does not say the VM was emulated", r.res.RuntimeVersion)
	}
	// What the job wrote reaches the host as the other classes' writes
	// do: /work's upper layer and /out, owned by the job's user.
	if got := readFile(t, filepath.Join(r.sb.UpperDir(), "new.txt")); got != "made\n" {
		t.Errorf("/work/new.txt on the host: %q", got)
	}
	if got := readFile(t, filepath.Join(r.sb.OutDir(), "result.txt")); got != "out\n" {
		t.Errorf("/out/result.txt on the host: %q", got)
	}
	uid, _ := r.sb.HostIDs()
	if fi, err := os.Stat(filepath.Join(r.sb.UpperDir(), "new.txt")); err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != uid {
		t.Errorf("/work/new.txt on the host is not owned by the job's user (host uid %d): %v", uid, err)
	}
	if t.Failed() {
		t.Logf("output:\n%s", r.stdout)
	}
}

func lineAfter(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Real work in the guest: make drives a C compiler, and the program runs
// threads.
func TestVMRealWork(t *testing.T) {
	e := vmEnv(t)
	src := e.source(t, map[string]string{
		"Makefile": "all: threads\n\t./threads\nthreads: threads.c\n\tcc -O1 -pthread -o $@ $<\n",
		"threads.c": `#include <pthread.h>
#include <stdio.h>
static long sum[4];
static void *work(void *p) { long i = (long)p; for (long n = 0; n < 1000000; n++) sum[i] += n % 7; return 0; }
int main(void) {
	pthread_t t[4];
	for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, work, (void *)i);
	long total = 0;
	for (int i = 0; i < 4; i++) { pthread_join(t[i], 0); total += sum[i]; }
	printf("threads done %ld\n", total);
	return 0;
}
`,
	})
	r := e.runVM(t, job{src: src, cmd: []string{"make", "-C", "/work"}, user: runspec.Agent})
	wantExit(t, r, 0)
	if !strings.Contains(r.stdout, "threads done 11999988\n") {
		t.Errorf("the threaded program's output is wrong:\n%s", r.stdout)
	}
}

// The guest's own OOM killer ends a job that outgrows its RAM: oom.
func TestVMOOM(t *testing.T) {
	e := vmEnv(t)
	l := vmLimits
	l.MemoryBytes = 256 << 20
	r := e.runVM(t, job{src: e.source(t, nil), cmd: []string{"/work/probe", "balloon", "1024"}, limits: &l})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Reason != ReasonOOM {
		t.Fatalf("reason %s (exit %d), want oom: %s", r.res.Reason, r.res.ExitCode, r.res.Message)
	}
}

// The deadline ends the machine, and nothing of it is left on the host:
// no QEMU, no tap, no mount, no loop device (newEnv's cleanup checks the
// uid range, mounts and loops; this test the processes by name and the
// job's network namespace).
func TestVMDeadline(t *testing.T) {
	e := vmEnv(t)
	nm := testNetpolicy(t, e)
	ph := startPolicyHost(t, nm.Pools()[0])
	allow := netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(ph.ip, 32), Ports: []uint16{uint16(ph.portA)}}}}
	nn, err := nm.Create(context.Background(), fmt.Sprintf("job-%d", testSeq.Add(1)), allow, netpolicy.FixedInterfaces())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nn.Close() })
	l := vmLimits
	l.Deadline = 25 * time.Second
	var out syncBuffer
	sb, err := e.m.Create(context.Background(), Spec{ID: nn.ID(), Class: ClassVM, Source: e.source(t, nil), Command: []string{"sh", "-c", "echo up; sleep 600"},
		Limits: l, NetNS: nn.Path(), Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := sb.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != ReasonTimeout {
		t.Fatalf("reason %s, want timeout: %s\n%s", res.Reason, res.Message, out.String())
	}
	if el := time.Since(start); el > l.Deadline+20*time.Second {
		t.Errorf("the deadline of %s ended the job after %s", l.Deadline, el)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if procs := qemuProcsNaming(e.cfg.StateDir); len(procs) > 0 {
		t.Errorf("QEMU processes left: %v", procs)
	}
	links, err := exec.Command("ip", "-n", filepath.Base(nn.Path()), "-o", "link").CombinedOutput()
	if err == nil && strings.Contains(string(links), "tap") {
		t.Errorf("a tap device is left in the job's namespace:\n%s", links)
	}
	if err != nil {
		// Not an `ip netns` name: enter by path.
		links, _ = exec.Command("nsenter", "--net="+nn.Path(), "ip", "-o", "link").CombinedOutput()
		if strings.Contains(string(links), "tap") {
			t.Errorf("a tap device is left in the job's namespace:\n%s", links)
		}
	}
}

// qemuProcsNaming lists live QEMU processes whose command line names s.
func qemuProcsNaming(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "qemu") && strings.Contains(string(b), s) {
			out = append(out, e.Name())
		}
	}
	return out
}

// testNetpolicy is a netpolicy manager of the test's own, on a pool of its
// own.
func testNetpolicy(t *testing.T, e *env) *netpolicy.Manager {
	t.Helper()
	pool := netip.MustParsePrefix(fmt.Sprintf("10.216.%d.0/24", os.Getpid()%256))
	nm, err := netpolicy.New(netpolicy.Config{
		Dir:    filepath.Join(e.base, "netpolicy"),
		Name:   fmt.Sprintf("vmt%d", os.Getpid()%100000),
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
	return nm
}

// The guest's only NIC is a tap redirected to the job's veth: an allowed
// address and port are reachable and nothing else; deny-all leaves the
// guest loopback only, with no resolver.
func TestVMNetworkPolicy(t *testing.T) {
	e := vmEnv(t)
	nm := testNetpolicy(t, e)
	ph := startPolicyHost(t, nm.Pools()[0])
	src := e.source(t, nil)
	script := fmt.Sprintf(`./probe dial %s; echo "a=$?"; ./probe dial %s; echo "b=$?"; ./probe loopback; echo "lo=$?"; cat /proc/net/dev; echo resolv: $(cat /etc/resolv.conf 2>/dev/null | grep -c nameserver)`,
		ph.addr(ph.portA), ph.addr(ph.portB))
	newNet := func(p netpolicy.Policy) *netpolicy.Net {
		nn, err := nm.Create(context.Background(), fmt.Sprintf("job-%d", testSeq.Add(1)), p, netpolicy.FixedInterfaces())
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
	allowed := newNet(allowA)
	r := e.runInNet(t, ClassVM, allowed, src, script, nil)
	wantExit(t, r, 0)
	for _, want := range []string{"ALLOWED: dial " + ph.addr(ph.portA), "a=1", "denied: dial " + ph.addr(ph.portB), "b=0", "loopback ok", "lo=0", "eth0:"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("allow port A: output lacks %q", want)
		}
	}
	// The guest's NIC is a tap joined to the veth's job end: what it
	// exchanged (the dials, at least a handshake each way) crossed the
	// veth, and the host end counted it (the job's network bytes).
	if sent, received := allowed.Bytes(); sent < 100 || received < 100 {
		t.Errorf("the guest's traffic is not on the veth's counters: %d sent, %d received", sent, received)
	} else {
		t.Logf("the guest's veth: %d sent, %d received", sent, received)
	}
	r = e.runInNet(t, ClassVM, newNet(netpolicy.Policy{}), src, script, nil)
	wantExit(t, r, 0)
	for _, want := range []string{"denied: dial " + ph.addr(ph.portA), "a=0", "b=0", "loopback ok", "lo=0", "resolv: 0"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("deny-all: output lacks %q", want)
		}
	}
	if strings.Contains(r.stdout, "eth0") {
		t.Errorf("deny-all: the guest sees an interface besides lo")
	}
}

// A session in the VM class: two execs share the machine's state, a file
// the host writes is seen inside, an exec's timeout kills only its group;
// suspended (the machine stopped, the scratch kept) and resumed (a fresh
// boot on it), /work keeps what the job changed.
func TestVMSession(t *testing.T) {
	e := vmEnv(t)
	src := e.source(t, map[string]string{"a.txt": "A"})
	id := fmt.Sprintf("job-%d", testSeq.Add(1))
	spec := Spec{ID: id, Class: ClassVM, Source: src, Command: IdleCommand, Limits: vmLimits, User: runspec.Agent}
	sb, err := e.m.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan Result, 1)
	go func() {
		res, _ := sb.Run(context.Background())
		runDone <- res
	}()
	execSh := func(sb *Sandbox, script string, timeout time.Duration) (ExecResult, string) {
		t.Helper()
		var out syncBuffer
		res, err := sb.Exec(context.Background(), ExecSpec{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out, Timeout: timeout, Stdin: strings.NewReader("from stdin\n")})
		if err != nil {
			t.Fatalf("Exec %q: %v", script, err)
		}
		return res, out.String()
	}
	res, out := execSh(sb, "echo state > /tmp/state; echo x > /work/b.txt; head -1; exit 3", 0)
	if res.Reason != ReasonExited || res.ExitCode != 3 || out != "from stdin\n" {
		t.Fatalf("first exec: %+v %q", res, out)
	}
	if _, err := sb.WriteFile("/work/up.txt", strings.NewReader("uploaded"), 0o644, 1<<20); err != nil {
		t.Fatal(err)
	}
	res, out = execSh(sb, "cat /tmp/state /work/up.txt; echo; id -u", 0)
	if res.ExitCode != 0 || out != "state\nuploaded\n1000\n" {
		t.Fatalf("second exec: %+v %q", res, out)
	}
	res, _ = execSh(sb, "sleep 300", 5*time.Second)
	if res.Reason != ReasonTimeout {
		t.Fatalf("an exec past its timeout: %+v", res)
	}
	res, out = execSh(sb, "echo still up", 0)
	if res.ExitCode != 0 || out != "still up\n" {
		t.Fatalf("after a timed-out exec the machine is gone: %+v %q", res, out)
	}
	// Suspend: stop the machine, keep the scratch.
	if err := sb.DestroyKeeping(); err != nil {
		t.Fatal(err)
	}
	<-runDone
	if procs := qemuProcsNaming(e.cfg.StateDir); len(procs) > 0 {
		t.Fatalf("QEMU still runs after the suspend: %v", procs)
	}
	// Resume: a fresh boot on the kept scratch.
	spec.Kept, spec.Started = true, time.Now()
	sb2, err := e.m.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb2.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	go func() { _, _ = sb2.Run(context.Background()) }()
	res, out = execSh(sb2, "cat /work/b.txt /work/up.txt; echo; ls /tmp", 0)
	if res.ExitCode != 0 || out != "x\nuploaded\n" {
		t.Fatalf("after the resume: %+v %q (want /work kept and /tmp empty)", res, out)
	}
}

// Docker inside the VM: dockerd on the guest's kernel loads an image from
// a tarball in /work and runs it. The slowest test of the class: one boot.
func TestVMDocker(t *testing.T) {
	if _, err := os.Stat("/usr/sbin/dockerd"); err != nil {
		vmMissing(t, "the template has no dockerd (apt-get install docker.io): "+err.Error())
	}
	e := vmEnv(t)
	probe, err := os.ReadFile(probeBin)
	if err != nil {
		t.Fatal(err)
	}
	img := dockerSaveTar(t, "airlock-test/hello:1", map[string][]byte{
		"probe":   probe,
		"msg.txt": []byte("hello from a container in an airlock vm"),
	}, []string{"/probe", "cat", "/msg.txt"})
	src := e.source(t, map[string]string{"hello.tar": string(img)})
	l := vmLimits
	l.MemoryBytes, l.DiskBytes, l.Deadline = 1<<30, 2<<30, 8*time.Minute
	var out, errb syncBuffer
	sb, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("job-%d", testSeq.Add(1)), Class: ClassVM, Source: src, Docker: true, User: runspec.Agent,
		Command: []string{"sh", "-c", "docker load -i /work/hello.tar && docker run --rm airlock-test/hello:1"}, Limits: l, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	res, err := sb.Run(context.Background())
	t.Logf("docker: %+v\nstdout: %s\nstderr: %s", res, out.String(), errb.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != ReasonExited || res.ExitCode != 0 {
		rtlog, _ := os.ReadFile(sb.logPath)
		t.Fatalf("docker run ended %s %d: %s\nruntime log:\n%s", res.Reason, res.ExitCode, res.Message, rtlog)
	}
	if !strings.Contains(out.String(), "/msg.txt: hello from a container in an airlock vm\n") {
		t.Errorf("the container's line is missing")
	}
	// Docker needs the class: elsewhere the spec is refused.
	_, err = e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("job-%d", testSeq.Add(1)), Class: ClassRunc, Source: src, Docker: true, Command: []string{"true"}, Limits: defaultLimits})
	if err == nil || !strings.Contains(err.Error(), "spec.docker") {
		t.Errorf("docker under runc: %v, want refused naming spec.docker", err)
	}
}

// dockerSaveTar builds an image archive in `docker save`'s format, with
// one layer holding files (mode 0755) and the entrypoint given.
func dockerSaveTar(t *testing.T, tag string, files map[string][]byte, entrypoint []string) []byte {
	t.Helper()
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	for name, data := range files {
		if err := lw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := lw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := lw.Close(); err != nil {
		t.Fatal(err)
	}
	layerSum := sha256.Sum256(layer.Bytes())
	cfg, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": entrypoint},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(layerSum[:])}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgSum := sha256.Sum256(cfg)
	cfgName := hex.EncodeToString(cfgSum[:]) + ".json"
	layerName := hex.EncodeToString(layerSum[:]) + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{tag}, "Layers": []string{layerName}}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	w := tar.NewWriter(&out)
	for _, f := range []struct {
		name string
		data []byte
	}{{cfgName, cfg}, {layerName, layer.Bytes()}, {"manifest.json", manifest}} {
		if err := w.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// Without KVM and without emulation the class is unavailable, saying why;
// a spec of another class asking for docker is refused before anything
// is made.
func TestVMUnavailableWithoutEmulation(t *testing.T) {
	if kvmUsable() == nil {
		t.Skip("KVM is usable here: the class is available without emulation")
	}
	e := newEnv(t, func(c *Config) { c.VM = VMConfig{Path: "/bin/true"} })
	st, ok := e.m.Available(ClassVM)
	if ok || !strings.Contains(st.Reason, "sandbox.vm.emulation") {
		t.Fatalf("vm class without KVM or emulation: %+v", st)
	}
	_, err := e.m.Create(context.Background(), Spec{ID: "job-x", Class: ClassVM, Source: e.source(t, nil), Command: []string{"true"}, Limits: vmLimits})
	if err == nil || !strings.Contains(err.Error(), "not available") {
		t.Fatalf("Create on an unavailable vm class: %v", err)
	}
}

// The host cgroup of a VM job holds QEMU, not the job: its memory is the
// guest's RAM and QEMU's overhead, its pids QEMU's threads; memory and
// pids cannot change while the guest runs.
func TestVMLimits(t *testing.T) {
	l := Limits{CPUMillis: 1500, MemoryBytes: 512 << 20, Pids: 64, DiskBytes: 1 << 30, Deadline: time.Minute}
	got := cgroupLimitsOf(ClassVM, l)
	if got.MemoryBytes != l.MemoryBytes+vmMemoryOverhead || got.Pids != vmHostPids || got.CPUMillis != l.CPUMillis {
		t.Errorf("cgroupLimitsOf(vm) = %+v", got)
	}
	if n := vmCPUs(1500); n != min(2, int64(max(1, runtime.NumCPU()))) {
		t.Errorf("vmCPUs(1500) = %d", n)
	}
	if vmCPUs(10) != 1 {
		t.Errorf("vmCPUs(10) = %d, want 1", vmCPUs(10))
	}
	up := l
	up.CPUMillis, up.Deadline = 500, 2*time.Minute
	if why := vmRefuseLive(l, up); why != "" {
		t.Errorf("CPU and deadline changes refused: %s", why)
	}
	up.MemoryBytes *= 2
	if why := vmRefuseLive(l, up); !strings.Contains(why, "limits.memory_bytes") {
		t.Errorf("a memory change: %q", why)
	}
	up = l
	up.Pids++
	if why := vmRefuseLive(l, up); !strings.Contains(why, "limits.pids") {
		t.Errorf("a pids change: %q", why)
	}
}
