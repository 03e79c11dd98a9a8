//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/pkg/nettest"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// The vm runtime class through the whole stack: each test boots at most
// one machine (under QEMU's emulation on a host without KVM, seconds of
// both cores each). They need bin/airlock-vm and bin/airlock-guest (make
// build) and a cached guest kernel (make build runs `airlock-vm kernel
// fetch`): a missing one fails the test under CI=true, as in the sandbox
// package's VM tests; elsewhere the test says why it cannot run.

// vmStack starts a stack whose executor runs the vm class: dev up
// configures it (emulation on) when airlock-vm is in its bin dir, here
// the module's bin/airlock-vm (make build) with the guest agent it boots
// beside it, unless AIRLOCK_E2E_BIN_DIR has them. It also checks that
// `airlock status` reports the class serving and emulated.

// vmCommandTimeout bounds a command that waits on a vm job: a machine
// booting under emulation on a loaded CI host takes many times what it
// takes here alone.
const vmCommandTimeout = 5 * time.Minute

func vmStack(t *testing.T, args ...string) *stack {
	t.Helper()
	gomod, err := goOutput("", "env", "GOMOD")
	if err != nil {
		t.Fatal(err)
	}
	extra := map[string]string{}
	for _, name := range []string{"airlock-vm", "airlock-guest"} {
		if _, err := os.Stat(bin(name)); err == nil {
			continue // AIRLOCK_E2E_BIN_DIR has it
		}
		extra[name] = filepath.Join(filepath.Dir(gomod), "bin", name)
		if _, err := os.Stat(extra[name]); err != nil {
			vmMissing(t, fmt.Sprintf("%v: run `make build`", err))
		}
	}
	dir := binDirWith(t, extra)
	// The last --bin-dir is the one dev up takes.
	s := startStack(t, append([]string{"--bin-dir", dir}, args...)...)

	res := s.airlock(t, "status", "-o", "json")
	type health struct {
		Service      string            `json:"service"`
		Runtimes     map[string]string `json:"runtimes"`
		RuntimeNotes map[string]string `json:"runtime_notes"`
	}
	var st struct {
		Services []health `json:"services"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &st); res.code != 0 || err != nil {
		t.Fatalf("airlock status -o json: exit %d, %v\n%s%s", res.code, err, res.stdout, res.stderr)
	}
	var exec *health
	for i := range st.Services {
		if st.Services[i].Service == "executor" {
			exec = &st.Services[i]
		}
	}
	switch {
	case exec == nil:
		t.Fatalf("airlock status lists no executor:\n%s", res.stdout)
	case exec.Runtimes["vm"] != "SERVING":
		vmMissing(t, fmt.Sprintf("the executor's vm class is %q (its log: %s)", exec.Runtimes["vm"], s.services["executor"].Log))
	case !strings.Contains(exec.RuntimeNotes["vm"], "emulated"):
		t.Fatalf("airlock status: the vm class's notes are %q, want emulated (no KVM here)", exec.RuntimeNotes["vm"])
	}
	if text := s.airlock(t, "status"); !strings.Contains(text.stdout, "executor runtime vm") || !strings.Contains(text.stdout, "emulated") {
		t.Fatalf("airlock status does not show the vm class as emulated:\n%s", text.stdout)
	}
	return s
}

// vmMissing fails the test under CI=true, where the VM class must be
// tested, and skips it elsewhere.
func vmMissing(t *testing.T, why string) {
	t.Helper()
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("%s (CI=true: the VM class must be tested)", why)
	}
	t.Skipf("cannot test the VM class here: %s", why)
}

// probeRounds makes the probe loops of probeScript and domainProbe run n
// rounds each: a shell function named true shadows the builtin in their
// `while true`, holding for n calls and failing the next, then again.
func probeRounds(n int, scripts ...string) string {
	return fmt.Sprintf("true() { [ $((probe_calls++ %% %d)) != %d ]; }\n", n+1, n) + strings.Join(scripts, "")
}

// probed reads probe output (rounds) as target -> open in any round: a
// target that must stay closed must be closed in every one.
func probed(t *testing.T, out string) map[string]bool {
	t.Helper()
	rs := rounds(out)
	if len(rs) == 0 {
		t.Fatalf("no probe round in the output:\n%s", out)
	}
	got := map[string]bool{}
	for _, r := range rs {
		for _, line := range r {
			if name, state, ok := strings.Cut(line, " "); ok && (state == "open" || state == "closed") {
				got[name] = got[name] || state == "open"
			}
		}
	}
	return got
}

// TestVMJobEndToEnd runs one job in a virtual machine through the whole
// stack with a domains policy: it reaches its name through the egress
// proxy (and transparently), not another name nor an address the policy
// does not list, and cannot look an unlisted name up; it runs on a kernel
// of its own; the file it writes in /work is its patch; and the result
// says the class and that it was emulated.
func TestVMJobEndToEnd(t *testing.T) {
	repo, _ := sampleRepo(t)
	n := int(time.Now().UnixNano() & 0xff)
	web := nettest.StartWeb(t, nettest.Config{
		Name:    fmt.Sprintf("vw%04x%02x", os.Getpid()&0xffff, n),
		Prefix:  nettest.Subnet(netip.MustParsePrefix("203.0.113.128/25"), 30, (os.Getpid()+n+3)%32),
		Prefix6: nettest.Subnet(netip.MustParsePrefix("2001:db8:7d00::/40"), 64, (os.Getpid()&0xffff)<<8|n),
	})
	// A greeter on the web host: reachable by address it would be open, so
	// "closed" is the policy's doing.
	unlisted := net.JoinHostPort(web.IP.String(), "8080")
	nettest.Greet(t, web.Listen(t, "tcp", unlisted))
	public := []netip.Addr{web.IP, web.IP6}
	dns := nettest.StartDNS(t, map[string][]netip.Addr{"allowed.test": public, "notlisted.test": public})
	s := vmStack(t, "--repo", "sample="+repo, "--resolver", dns.Addr.String(), "--egress-domain", "allowed.test")

	script := probeRounds(1, domainProbe("allowed.test", "notlisted.test"), probeScript(map[string]string{"unlisted": unlisted})) +
		"cat /proc/version\necho 'written in the vm' > /work/vm-wrote.txt\n"
	start := time.Now()
	res := runCommandWithin(t, vmCommandTimeout, s.env(), bin("airlock"), "job", "submit", "--repo", "sample", "--rev", "main", "--runtime", "vm", "--memory", "512MiB", "--cpu", "2",
		"--allow-domain", "allowed.test", "--wait", "-o", "json", "--", "bash", "-c", script)
	t.Logf("the vm job took %v", time.Since(start).Round(time.Millisecond))
	if res.code != 0 {
		t.Fatalf("vm job: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	// With -o json the job's output is on stderr.
	want := map[string]bool{"allowed.test": true, "direct": true, "notlisted.test": false, "leak": false, "unlisted": false}
	got := probed(t, res.stderr)
	for name, open := range want {
		if o, ok := got[name]; !ok || o != open {
			t.Errorf("%s: open %v (probed %v), want %v\n%s", name, o, ok, open, res.stderr)
		}
	}
	for _, name := range dns.Asked() {
		if name != "allowed.test" {
			t.Errorf("the upstream resolver was asked for %q, which the policy never allowed", name)
		}
	}
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(res.stderr, "Linux version ")
	if i < 0 {
		t.Fatalf("the job printed no /proc/version:\n%s", res.stderr)
	}
	guest, _, _ := strings.Cut(res.stderr[i:], "\n")
	if guest == strings.TrimSpace(string(host)) {
		t.Errorf("the vm job ran on the host's kernel: %s", guest)
	}

	job := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
		t.Fatalf("job submit --wait -o json: %v\n%s", err, res.stdout)
	}
	// job get as well as the submit's final record.
	got2 := s.job(t, job.GetJobId())
	r := got2.GetResult()
	if got2.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || r.GetReason() != typesv1.TerminationReason_TERMINATION_REASON_EXITED || r.GetExitCode() != 0 {
		t.Fatalf("job get: %v %v exit %d", got2.GetState(), r.GetReason(), r.GetExitCode())
	}
	if r.GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_VM || got2.GetSpec().GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_VM {
		t.Errorf("job get: runtime class %v (spec %v), want vm", r.GetRuntimeClass(), got2.GetSpec().GetRuntimeClass())
	}
	if v := r.GetRuntimeVersion(); !strings.Contains(v, "emulated") || !strings.Contains(v, "airlock-vm") {
		t.Errorf("job get: runtime version %q, want airlock-vm's, saying emulated", v)
	}
	if ds := r.GetDiffStat(); ds.GetFilesChanged() != 1 || ds.GetInsertions() != 1 {
		t.Errorf("diff stat %+v, want the one written file", ds)
	}
	bundle, _ := fetchArtifact(t, s, job.GetJobId(), r.GetBundleDigest())
	if patch := string(tarEntry(t, bundle, "patch.diff")); !strings.Contains(patch, "vm-wrote.txt") || !strings.Contains(patch, "+written in the vm") {
		t.Errorf("the bundle's patch lacks the file the job wrote:\n%s", patch)
	}
	if text := s.airlock(t, "job", "get", job.GetJobId()); !strings.Contains(text.stdout, "emulated") {
		t.Errorf("job get does not say the run was emulated:\n%s", text.stdout)
	}
	if left := hostProcsWith(job.GetJobId()); len(left) > 0 {
		t.Errorf("processes naming the job outlive it: %v", left)
	}
}

// TestVMSessionEndToEnd drives a session in one virtual machine: execs
// share the machine's state, a retried exec id returns the first run's
// result without running again, the session's CIDR allow rule holds, and
// finishing builds the bundle with the session's patch.
func TestVMSessionEndToEnd(t *testing.T) {
	repo, _ := sampleRepo(t)
	th := startTestHost(t, 8080, 8081)
	s := vmStack(t, "--repo", "sample="+repo)

	start := time.Now()
	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--runtime", "vm", "--memory", "512MiB", "--cpu", "2",
		"--allow", th.Prefix.String()+":8080", "--idle-timeout", "5m", "-o", "json")
	t.Logf("session create took %v", time.Since(start).Round(time.Millisecond))
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); res.code != 0 || err != nil {
		t.Fatalf("session create: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	id := sess.GetJobId()
	defer s.airlock(t, "session", "cancel", id)
	if sess.GetState() != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("session create returned %s, want RUNNING", sess.GetState())
	}
	exec := func(execID string, argv ...string) result {
		t.Helper()
		return runCommandWithin(t, vmCommandTimeout, s.env(), bin("airlock"), append([]string{"session", "exec", id, "--exec-id", execID, "--"}, argv...)...)
	}

	write := []string{"sh", "-c", "echo shared > /tmp/state; echo run >> /tmp/runs; echo 'from the vm session' > /work/vm-session.txt; echo wrote"}
	for i := range 2 {
		start := time.Now()
		r := exec("write", write...)
		t.Logf("exec write, attempt %d, took %v", i, time.Since(start).Round(time.Millisecond))
		if r.code != 0 || r.stdout != "wrote\n" || (i == 1 && !strings.Contains(r.stderr, "started before")) {
			t.Fatalf("write attempt %d: exit %d %q\n%s", i, r.code, r.stdout, r.stderr)
		}
	}
	if r := exec("write", "sh", "-c", "echo run >> /tmp/runs"); r.code == 0 || !strings.Contains(r.stderr, "spec.argv") {
		t.Fatalf("a different command under a used id: exit %d\n%s", r.code, r.stderr)
	}
	// airlock-vm holds the machine (QEMU dies with it) while the session
	// runs, so the check after the finish below can see one left behind.
	running := hostProcsWith(id)
	if !slices.ContainsFunc(running, func(pid string) bool {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		return bytes.Contains(cmdline, []byte("airlock-vm"))
	}) {
		t.Errorf("no airlock-vm process names the running session: %v", running)
	}
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	if r := exec("read", "sh", "-c", "cat /tmp/state; wc -l < /tmp/runs; uname -r"); r.code != 0 || !strings.HasPrefix(r.stdout, "shared\n1\n") ||
		strings.HasSuffix(r.stdout, "\n"+string(host)) {
		t.Fatalf("read: exit %d %q, want the write's state, run once, on a kernel other than the host's %s\n%s", r.code, r.stdout, host, r.stderr)
	}
	targets := map[string]string{"allowed": net.JoinHostPort(th.IP.String(), "8080"), "other-port": net.JoinHostPort(th.IP.String(), "8081")}
	// probeScript's `timeout 1` includes starting bash, which takes most
	// of a second in an emulated guest: three rounds, and open in any.
	r := exec("probe", "bash", "-c", probeRounds(3, probeScript(targets)))
	if got := probed(t, r.stdout); r.code != 0 || !got["allowed"] || got["other-port"] {
		t.Fatalf("probe: exit %d, reached %v; want the allowed port only\n%s%s", r.code, got, r.stdout, r.stderr)
	}

	res = s.airlock(t, "session", "finish", id, "-o", "json")
	final := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), final); res.code != 0 || err != nil {
		t.Fatalf("session finish: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	fr := final.GetResult()
	if final.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || fr.GetReason() != typesv1.TerminationReason_TERMINATION_REASON_FINISHED {
		t.Fatalf("finished session: %s %s", final.GetState(), fr.GetReason())
	}
	if fr.GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_VM {
		t.Errorf("the session's result: runtime class %v, want vm", fr.GetRuntimeClass())
	}
	bundle, _ := fetchArtifact(t, s, id, fr.GetBundleDigest())
	if patch := string(tarEntry(t, bundle, "patch.diff")); !strings.Contains(patch, "+from the vm session") {
		t.Errorf("the bundle's patch lacks the session's file:\n%s", patch)
	}
	if r := exec("after-finish", "true"); r.code == 0 {
		t.Fatal("an exec in a finished session ran")
	}
	if left := hostProcsWith(id); len(left) > 0 {
		t.Errorf("processes naming the session outlive it: %v", left)
	}
}

// TestVMRefusals: what cannot run is refused at submit, naming the field,
// before any machine boots: docker outside the vm class, and docker in a
// vm with less memory than dockerd needs beside the job.
func TestVMRefusals(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := vmStack(t, "--repo", "sample="+repo)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--runtime", "runc", "--with", "docker"}, "spec.with"},
		{[]string{"--runtime", "vm", "--with", "docker", "--memory", "512MiB"}, "spec.resources.memory_bytes"},
	} {
		args := append(append([]string{"job", "submit", "--repo", "sample", "--rev", "main"}, c.args...), "--", "true")
		if r := s.airlock(t, args...); r.code != 1 || !strings.Contains(r.stderr, "invalid argument: "+c.want+":") {
			t.Errorf("job submit %s: exit %d, want a refusal naming %s\n%s%s", strings.Join(c.args, " "), r.code, c.want, r.stdout, r.stderr)
		}
	}
	res := s.airlock(t, "job", "list", "-o", "json")
	list := &authorityv1.ListJobsResponse{}
	if err := protojson.Unmarshal([]byte(res.stdout), list); res.code != 0 || err != nil || len(list.GetJobs()) != 0 {
		t.Errorf("job list after the refusals: exit %d, %v, want no job\n%s%s", res.code, err, res.stdout, res.stderr)
	}
}
