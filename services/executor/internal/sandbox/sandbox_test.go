package sandbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// testClasses are the runtime classes a test runs under: runc always, and
// runsc. In CI (CI=true) a runsc this host cannot run fails the test: a
// class that silently drops out would hide every failure under it.
// Elsewhere the test says why it leaves runsc out.
func testClasses(t *testing.T, e *env) []Class {
	t.Helper()
	out := []Class{ClassRunc}
	if st, ok := e.m.Available(ClassRunsc); ok {
		out = append(out, ClassRunsc)
	} else if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("runsc is unavailable here (CI=true, so this fails rather than test runc alone): %s", st.Reason)
	} else {
		t.Logf("runsc is unavailable here, so only runc runs this test: %s", st.Reason)
	}
	return out
}

// variant is a way to run a test's job: in class, in a sandbox made for it
// or (claimed) in a pooled one it claims.
type variant struct {
	name    string
	class   Class
	claimed bool
}

// testVariants are testClasses, and runc again with the job claiming a
// pooled sandbox (warm.go): a boundary must hold for a claimed sandbox as
// for a fresh one. A kernel without the exec helper (before Linux 6.15)
// pools nothing, which is checked instead: Warm refuses, saying why.
func testVariants(t *testing.T, e *env) []variant {
	t.Helper()
	var out []variant
	for _, c := range testClasses(t, e) {
		out = append(out, variant{name: string(c), class: c})
	}
	if !pooling(t, e) {
		return out
	}
	return append(out, variant{name: "runc-claimed", class: ClassRunc, claimed: true})
}

// pooling reports whether this kernel pools sandboxes (it needs the exec
// helper, Linux 6.15 or newer). Where it does not, that is what is
// checked: Warm refuses, naming the exec helper.
func pooling(t *testing.T, e *env) bool {
	t.Helper()
	if wantExecHelper(t, e) {
		return true
	}
	sb, err := e.m.Warm(context.Background(), WarmSpec{Name: PoolPrefix + "old-kernel", Class: ClassRunc, Limits: defaultLimits})
	if err == nil {
		sb.Destroy()
		t.Fatal("a sandbox was pooled on a kernel without the exec helper")
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "exec helper") {
		t.Fatalf("Warm on a kernel without the exec helper: %v, want a refusal naming it", err)
	}
	t.Logf("this kernel pools nothing, as it must: %v", err)
	return false
}

// treeDigest hashes every path, mode, size, mtime, owner and content under
// dir, to prove a source tree was not touched.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %o %d %d %d:%d\n", strings.TrimPrefix(p, dir), st.Mode, st.Size, st.Mtim.Nano(), st.Uid, st.Gid)
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantExit(t *testing.T, r ran, code int) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("Run: %v", r.err)
	}
	if r.res.Reason != ReasonExited || r.res.ExitCode != code {
		t.Fatalf("got reason %s exit %d (%s), want exited %d", r.res.Reason, r.res.ExitCode, r.res.Message, code)
	}
}

func TestProbe(t *testing.T) {
	// Its own self-check: the probe of a fresh start runs it.
	e := newEnv(t, ownSelfCheck)
	st := e.m.Probe(context.Background())
	if len(st) != 3 || st[0].Class != ClassRunc || st[1].Class != ClassRunsc || st[2].Class != ClassVM {
		t.Fatalf("Probe = %+v, want runc, runsc, vm", st)
	}
	if vm := st[2]; vm.Available || vm.Reason != "no vm binary is configured" {
		t.Errorf("vm without sandbox.vm.runtime: %+v, want unavailable saying so", vm)
	}
	runc := st[0]
	if !runc.Available || !strings.Contains(runc.Version, "runc version 1.5.") || !strings.Contains(runc.Version, "sha256:") {
		t.Fatalf("runc: %+v, want available at 1.5.x with the binary's digest", runc)
	}
	runsc := st[1]
	if runsc.Available {
		if !strings.Contains(runsc.Version, "runsc version") || !strings.HasSuffix(runsc.Version, "; platform="+DefaultRunscPlatform) {
			t.Errorf("runsc version %q, want runsc's own and the platform", runsc.Version)
		}
		if runsc.Platform != DefaultRunscPlatform || runsc.SelfCheck != SelfCheckPassed {
			t.Errorf("runsc platform %q, self-check %q; want %s, passed", runsc.Platform, runsc.SelfCheck, DefaultRunscPlatform)
		}
	} else if runsc.Reason == "" {
		t.Errorf("runsc unavailable without a reason: %+v", runsc)
	}
	t.Logf("runc: %+v", runc)
	t.Logf("runsc: %+v", runsc)
	if again := e.m.Probe(context.Background()); !slices.Equal(again, st) {
		t.Errorf("second Probe = %+v, want the cached %+v", again, st)
	}
	if got, ok := e.m.Available(ClassRunc); !ok || got != runc {
		t.Errorf("Available(runc) = %+v %v", got, ok)
	}
}

// A probe against a broken runtime binary says what is wrong, and Create
// refuses the class afterwards.
func TestProbeReportsBrokenRuntime(t *testing.T) {
	e := newEnv(t)
	fake := filepath.Join(e.base, "fake-runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'runsc version fake+airlock.errnoret'; exit 0; fi\necho 'fake runsc: broken' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := e.cfg
	cfg.StateDir = filepath.Join(e.base, "state2")
	cfg.RunscPath = fake
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := m.Available(ClassRunsc)
	if ok || !strings.Contains(st.Reason, "test job") {
		t.Fatalf("Available(runsc) = %+v, %v; want unavailable with the test job's failure", st, ok)
	}
	t.Logf("reason: %s", st.Reason)
	_, err = m.Create(context.Background(), Spec{ID: "x", Class: ClassRunsc, Source: e.source(t, nil), Command: []string{"true"}, Limits: defaultLimits})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Create on an unavailable class: %v, want failed precondition", err)
	}
	// A runsc without our errno change (as upstream builds it) is refused
	// before any job runs under it.
	upstream := filepath.Join(e.base, "upstream-runsc")
	if err := os.WriteFile(upstream, []byte("#!/bin/sh\necho 'runsc version release-20260901.0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.RunscPath = upstream
	cfg.StateDir = filepath.Join(e.base, "state4")
	if m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if st, ok := m.Available(ClassRunsc); ok || !strings.Contains(st.Reason, "EPERM") || !strings.Contains(st.Reason, "tools/sandbox/build.sh") {
		t.Fatalf("Available(upstream runsc) = %+v, %v; want refused for its errno handling", st, ok)
	}
	// A runsc that runs the echo probe but whose self-check job fails (as
	// a Go program crashing on a corrupted stack fails) is refused, naming
	// the self-check, the platform and what the job printed.
	crashing := filepath.Join(e.base, "crashing-runsc")
	script := fmt.Sprintf("#!/bin/sh\ncase \"$*\" in *probe.runsc-selfcheck*) echo 'runtime: unexpected return pc for main.f called from 0x87d8bacbfe281392' >&2; exit 2;; esac\nexec %s \"$@\"\n", runscPath)
	if err := os.WriteFile(crashing, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.RunscPath = crashing
	cfg.StateDir = filepath.Join(e.base, "state5")
	if m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if st, ok := m.Available(ClassRunsc); ok || !strings.Contains(st.Reason, "self-check") || !strings.Contains(st.Reason, "platform "+DefaultRunscPlatform) || !strings.Contains(st.Reason, "unexpected return pc") || st.SelfCheck != SelfCheckFailed {
		t.Fatalf("Available(runsc failing its self-check) = %+v, %v; want refused, naming the self-check, the platform and the crash", st, ok)
	}
	cfg.RunscPath = ""
	cfg.StateDir = filepath.Join(e.base, "state3")
	m, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := m.Available(ClassRunsc); ok || !strings.Contains(st.Reason, "no runsc binary") {
		t.Fatalf("Available(runsc) without a binary = %+v", st)
	}
}

// A job does useful work: edits files in /work, writes /out, prints, exits
// with its own status; the change shows in WorkDir and OutDir; the source
// tree is untouched.
func TestUsefulWork(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			src := e.source(t, map[string]string{"hello.txt": "hello\n", "sub/data.txt": "1\n2\n3\n"})
			before := treeDigest(t, src)
			script := `set -e
echo world >> hello.txt
sort -r sub/data.txt > sub/sorted.txt
rm sub/data.txt
echo built > /out/artifact.txt
echo scratch > /tmp/t && cat /tmp/t >/dev/null
echo cache > "$HOME/.cache-file"
cat hello.txt
awk 'END { print NR }' sub/sorted.txt
echo "$GREETING from $(hostname) in $(pwd)"
echo oops >&2
exit 7`
			r := e.run(t, context.Background(), job{class: c, src: src, cmd: []string{"sh", "-c", script}, env: map[string]string{"GREETING": "hi"}})
			wantExit(t, r, 7)
			if want := "hello\nworld\n3\nhi from airlock in /work\n"; r.stdout != want {
				t.Errorf("stdout %q, want %q", r.stdout, want)
			}
			if r.stderr != "oops\n" {
				t.Errorf("stderr %q, want %q", r.stderr, "oops\n")
			}
			w := r.sb.WorkDir()
			if got := readFile(t, filepath.Join(w, "hello.txt")); got != "hello\nworld\n" {
				t.Errorf("WorkDir hello.txt = %q", got)
			}
			if got := readFile(t, filepath.Join(w, "sub/sorted.txt")); got != "3\n2\n1\n" {
				t.Errorf("WorkDir sub/sorted.txt = %q", got)
			}
			if _, err := os.Stat(filepath.Join(w, "sub/data.txt")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("deleted file still in WorkDir: %v", err)
			}
			if got := readFile(t, filepath.Join(r.sb.OutDir(), "artifact.txt")); got != "built\n" {
				t.Errorf("OutDir artifact.txt = %q", got)
			}
			if after := treeDigest(t, src); after != before {
				t.Errorf("the source tree changed")
			}
			if readFile(t, filepath.Join(src, "hello.txt")) != "hello\n" {
				t.Errorf("source hello.txt changed")
			}
			u := r.res.Usage
			if u.WallTime <= 0 || u.CPUTime <= 0 || u.PeakMemoryBytes <= 0 || u.DiskBytes <= 0 || u.PeakPids < 1 {
				t.Errorf("usage %+v: want every field positive", u)
			}
			if r.res.Class != c || r.res.RuntimeVersion == "" || r.res.TemplateVersion != e.m.TemplateVersion() || !strings.HasPrefix(r.res.TemplateVersion, "sha256:") {
				t.Errorf("result identity %+v", r.res)
			}
		})
	}
}

func TestCommandNotFound(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"no-such-command"}})
			wantExit(t, r, 127)
		})
	}
}

// Dummy secrets outside the workspace — beside the state dir, inside it,
// in /root, and in the executor's environment — are out of the job's reach
// by path, through /proc, and by search.
func TestSecretsStayOutside(t *testing.T) {
	e := newEnv(t)
	const marker = "AIRLOCK-DUMMY-SECRET"
	secrets := []string{
		filepath.Join(e.base, "secret.txt"),
		filepath.Join(e.cfg.StateDir, "secret.txt"),
		fmt.Sprintf("/root/airlock-sandbox-test-secret-%d", os.Getpid()),
	}
	for i, p := range secrets {
		if err := os.WriteFile(p, []byte(fmt.Sprintf("%s-%d\n", marker, i)), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	t.Setenv("AIRLOCK_TEST_SECRET", marker+"-ENV")
	var script strings.Builder
	script.WriteString("exec 2>&1\n")
	for _, p := range secrets {
		for _, via := range []string{"", "/proc/1/root", "/proc/self/root", "/proc/1/cwd/..", "/work/../.."} {
			fmt.Fprintf(&script, "echo try %s%s; cat %s%s\n", via, p, via, p)
		}
		fmt.Fprintf(&script, "echo try ls; ls -la %s\n", filepath.Dir(p))
	}
	script.WriteString(`echo try environ; cat /proc/self/environ /proc/1/environ | tr '\0' '\n'
echo try env; env
echo try grep; grep -rs AIRLOCK-DUMMY / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr --exclude-dir=dev
echo try shadow; cat /etc/shadow
echo passwd; cat /etc/passwd
echo done
`)
	for _, v := range testVariants(t, e) {
		c := v.class
		t.Run(v.name, func(t *testing.T) {
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", script.String()}, claimed: v.claimed})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if strings.Contains(r.stdout, marker) {
				t.Fatalf("a secret leaked into the sandbox:\n%s", r.stdout)
			}
			if !strings.Contains(r.stdout, "\ndone\n") || strings.Count(r.stdout, "try ") < 3*len(secrets) {
				t.Fatalf("the attempts did not all run:\n%s", r.stdout)
			}
			passwd := r.stdout[strings.Index(r.stdout, "passwd\n")+len("passwd\n") : strings.Index(r.stdout, "done\n")]
			if passwd != etcFiles[0].Content {
				t.Errorf("/etc/passwd inside is %q, want only the synthesized one", passwd)
			}
		})
	}
}

// rm -rf /work/* removes only the job's view: the source stays whole, and
// the next sandbox on it sees all of it.
func TestRmRfWorkLeavesSource(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, map[string]string{"keep.txt": "precious\n", "dir/nested.txt": "x\n", ".hidden": "h\n"})
	before := treeDigest(t, src)
	r := e.sh(t, src, "rm -rf /work/* /work/.[!.]* && ls -A /work | wc -l")
	wantExit(t, r, 0)
	if strings.TrimSpace(r.stdout) != "0" {
		t.Fatalf("/work not empty after rm -rf: %q", r.stdout)
	}
	if entries, _ := os.ReadDir(r.sb.WorkDir()); len(entries) != 0 {
		t.Fatalf("WorkDir not empty: %v", entries)
	}
	if after := treeDigest(t, src); after != before {
		t.Fatal("the source changed")
	}
	r = e.sh(t, src, "cat /work/keep.txt /work/dir/nested.txt /work/.hidden")
	wantExit(t, r, 0)
	if r.stdout != "precious\nx\nh\n" {
		t.Fatalf("the next sandbox sees %q", r.stdout)
	}
}

// A fork bomb stays inside the pids limit; the host can still fork. Under
// runsc the job's tasks are gVisor's, not the host's: the job counts its
// own tasks from inside (the most it saw must be at most the limit —
// under runc, whose cgroup's peak is the exact count, near it: a walk of
// /proc is not a snapshot — and its forks must have been refused), and the host tasks gVisor runs them on stay under the cgroup's
// bound (cgroupLimitsOf). On ptrace every guest process costs host tasks
// that grow with the sentry's threads, so a bomb may reach that bound:
// the sandbox then ends as a sandbox error that says so, never as the
// job's exit. Then sleepers show the limit is the job's to use: all but
// a few of its tasks can be alive at once. Before gVisor held the job's limit itself, the cgroup held
// gVisor's host tasks to the job's limit and the bomb broke out of it.
func TestForkBomb(t *testing.T) {
	e := newEnv(t)
	// The job's shell counts every task it can see with builtins only
	// (it cannot fork once the bomb holds the limit) until the deadline,
	// printing each new most.
	const count = `(bomb() { bomb | bomb & }; bomb) &
m=0
while :; do
  n=0; for p in /proc/[0-9]*/task/[0-9]*; do n=$((n+1)); done
  [ $n -gt $m ] && m=$n && echo "max $m"
done`
	for _, v := range testVariants(t, e) {
		c := v.class
		t.Run(v.name, func(t *testing.T) {
			lim := defaultLimits
			lim.Pids = runspec.MinRunscPids
			lim.Deadline = 8 * slowdown * time.Second
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", count}, limits: &lim, claimed: v.claimed})
			host := cgroupLimitsOf(c, lim).Pids
			switch {
			case r.err == nil && r.res.Reason == ReasonTimeout:
			case c == ClassRunsc && r.err != nil && r.res.Reason == ReasonSandboxError &&
				strings.Contains(r.res.Message, fmt.Sprintf("gVisor's host tasks reached their bound of %d", host)):
				t.Logf("the sandbox ended at its host bound: %s", r.res.Message)
			default:
				t.Fatalf("reason %s (%s), error %v; want a timeout", r.res.Reason, r.res.Message, r.err)
			}
			lines := strings.Fields(strings.ReplaceAll(r.stdout, "max", ""))
			if len(lines) == 0 {
				t.Fatalf("stdout %q: the job counted nothing", r.stdout)
			}
			seen, err := strconv.ParseInt(lines[len(lines)-1], 10, 64)
			if err != nil {
				t.Fatalf("stdout %q: %v", r.stdout, err)
			}
			// A walk of /proc is not a snapshot: while the bomb's shells
			// die and fork, one that died after the walk listed it can be
			// replaced by one at a higher pid before the walk gets there,
			// so under Linux's /proc a walk may count more tasks than were
			// ever alive at once (CI saw 65 of 64 under runc, whose cgroup
			// peaked at 64), and more the longer the counter is kept off
			// the CPU. Under runc the exact count is the kernel's: the
			// cgroup's peak, checked below, is the job's own tasks, held
			// to the limit itself, so the walk only has to show the bomb
			// met a limit near the one asked. Under runsc the walk is the
			// job's only witness of its limit (the cgroup bounds gVisor's
			// host tasks), and gVisor's /proc holds it exactly.
			bound := lim.Pids
			if c == ClassRunc {
				bound += lim.Pids / 2
			}
			if seen > bound {
				t.Fatalf("the job saw %d of its tasks, want at most %d (the limit is %d)", seen, bound, lim.Pids)
			}
			// The bomb met the limit: its forks were refused. How many
			// tasks the counter saw depends on how often it is scheduled
			// among the bomb's shells (on ptrace under emulation, rarely);
			// that the limit is not lower than asked is shown below by
			// sleepers, which stay.
			if r.res.Reason == ReasonTimeout && !strings.Contains(r.stderr, "Cannot fork") {
				t.Fatalf("the bomb's forks were never refused; stderr %q", trunc(r.stderr))
			}
			if r.res.Usage.PeakPids > host || r.res.Usage.PeakPids < lim.Pids/2 {
				t.Fatalf("peak pids %d, want near and at most %d", r.res.Usage.PeakPids, host)
			}
			t.Logf("%s: the job saw %d tasks at most; its cgroup peaked at %d host tasks (bound %d)", c, seen, r.res.Usage.PeakPids, host)
			if pids := e.m.cg.procs(r.sb.cgRel); len(pids) > 0 {
				t.Fatalf("processes left in the job's cgroup: %v", pids)
			}
			if pids := procsInUIDRange(e.cfg.UIDBase); len(pids) > 0 {
				t.Fatalf("sandbox processes left: %v", pids)
			}
			if out, err := execHost("echo", "host fine"); err != nil || out != "host fine\n" {
				t.Fatalf("the host cannot fork: %v %q", err, out)
			}

			// The limit is the job's to use: all but a few of its tasks
			// can be alive at once.
			want := lim.Pids - 8
			lim.Deadline = 30 * slowdown * time.Second
			r = e.run(t, context.Background(), job{class: c, src: e.source(t, nil), limits: &lim, cmd: []string{"sh", "-c", fmt.Sprintf(
				`i=0; while [ $i -lt %d ]; do sleep 600 & i=$((i+1)); done; n=0; for p in /proc/[0-9]*/task/[0-9]*; do n=$((n+1)); done; echo "tasks $n"`, want)}})
			if r.err != nil || r.res.Reason != ReasonExited || r.res.ExitCode != 0 {
				t.Fatalf("%d sleepers under a limit of %d: reason %s exit %d (%s), error %v", want, lim.Pids, r.res.Reason, r.res.ExitCode, r.res.Message, r.err)
			}
			var n int64
			if _, err := fmt.Sscanf(strings.TrimSpace(r.stdout), "tasks %d", &n); err != nil || n < want || n > lim.Pids {
				t.Fatalf("stdout %q: want between %d and %d tasks alive", r.stdout, want, lim.Pids)
			}
		})
	}
}

func TestMemoryBalloon(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			lim := defaultLimits
			lim.MemoryBytes = 64 << 20
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"/work/probe", "balloon", "1024"}, limits: &lim})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.res.Reason != ReasonOOM || r.res.ExitCode != -1 {
				t.Fatalf("reason %s exit %d, want oom", r.res.Reason, r.res.ExitCode)
			}
			if strings.Contains(r.stdout, "allocated all") {
				t.Fatal("the balloon got all its memory")
			}
			// The kernel may charge a page or so past the limit on its
			// way to the OOM kill.
			if r.res.Usage.PeakMemoryBytes > lim.MemoryBytes+1<<20 {
				t.Fatalf("peak memory %d over the limit %d", r.res.Usage.PeakMemoryBytes, lim.MemoryBytes)
			}
		})
	}
}

// A job past its deadline is killed with everything it started, daemons
// and all.
func TestDeadline(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			lim := defaultLimits
			// Long enough for the job to start and say so under runsc on
			// ptrace on a loaded host (1 s was not, once), short beside
			// the sleeps it kills.
			lim.Deadline = slowdown * 3 * time.Second
			start := time.Now()
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", "(setsid sleep 300 &); nohup sleep 300 >/dev/null 2>&1 & echo started; exec sleep 300"}, limits: &lim})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.res.Reason != ReasonTimeout || r.res.ExitCode != -1 {
				t.Fatalf("reason %s exit %d, want timeout", r.res.Reason, r.res.ExitCode)
			}
			if el := time.Since(start); el > slowdown*10*time.Second {
				t.Fatalf("took %s for a %s deadline", el, lim.Deadline)
			}
			if r.stdout != "started\n" {
				t.Errorf("stdout %q", r.stdout)
			}
			if pids := e.m.cg.procs(r.sb.cgRel); len(pids) > 0 {
				t.Fatalf("processes left in the job's cgroup: %v", pids)
			}
			if pids := procsInUIDRange(e.cfg.UIDBase); len(pids) > 0 {
				t.Fatalf("sandbox processes left: %v", pids)
			}
			if hasProcNaming(e.cfg.StateDir) {
				t.Fatal("a runtime process outlived Run")
			}
		})
	}
}

// /work, /tmp and /out share one disk limit; writing past it gives ENOSPC
// inside and disk_full outside, and the host's disk stays as it was.
func TestDiskFull(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) { testDiskFull(t, e, c) })
	}
}

func testDiskFull(t *testing.T, e *env, c Class) {
	lim := defaultLimits
	lim.DiskBytes = 16 << 20
	hostFree := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(e.cfg.StateDir, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	before := hostFree()
	script := `dd if=/dev/zero of=/tmp/a bs=1M count=10 2>&1 | tail -1; echo tmp=$?
dd if=/dev/zero of=/out/b bs=1M count=10 2>&1; echo out=$?
dd if=/dev/zero of=/work/c bs=1M count=100 2>&1; echo work=$?
df -k /work /tmp /out | tail -3
exit 0`
	r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", script}, limits: &lim})
	during := hostFree()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !strings.Contains(r.stdout, "No space left on device") {
		t.Fatalf("no ENOSPC inside:\n%s", r.stdout)
	}
	if r.res.Reason != ReasonDiskFull {
		t.Fatalf("reason %s, want disk_full", r.res.Reason)
	}
	if u := r.res.Usage.DiskBytes; u > lim.DiskBytes || u < lim.DiskBytes/2 {
		t.Fatalf("disk usage %d, want near and at most %d", u, lim.DiskBytes)
	}
	// Other processes use the host's disk too; allow them some slack.
	const slack = 64 << 20
	if before-during > lim.DiskBytes+slack {
		t.Fatalf("the host lost %d bytes of free space to a job limited to %d", before-during, lim.DiskBytes)
	}
	if err := r.sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if after := hostFree(); before-after > slack {
		t.Fatalf("the host lost %d bytes of free space after Destroy", before-after)
	}
}

// Jobs run side by side without stepping on each other's loop devices,
// mounts or cgroups.
func TestConcurrent(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, nil)
	const n = 6
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			var out syncBuffer
			sb, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("par-%d", i), Class: ClassRunc, Source: src,
				Command: []string{"sh", "-c", fmt.Sprintf("echo %d > /work/me; cat /work/me", i)}, Limits: defaultLimits, Stdout: &out})
			if err != nil {
				errs <- err
				return
			}
			defer sb.Destroy()
			res, err := sb.Run(context.Background())
			switch {
			case err != nil:
				errs <- err
			case res.Reason != ReasonExited || res.ExitCode != 0 || out.String() != fmt.Sprintf("%d\n", i):
				errs <- fmt.Errorf("job %d: %+v, stdout %q", i, res, out.String())
			default:
				errs <- sb.Destroy()
			}
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A context cancelled before Run starts nothing.
func TestRunCancelledContext(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := e.run(t, ctx, job{src: e.source(t, nil), cmd: []string{"sh", "-c", "echo ran"}})
	if r.err != nil || r.res.Reason != ReasonCancelled || r.stdout != "" {
		t.Fatalf("Run = %+v, %v, stdout %q; want cancelled without running", r.res, r.err, r.stdout)
	}
}

// Deny-all: only loopback exists inside, and it works; a test host that
// the host itself reaches is unreachable from the sandbox.
func TestDenyAll(t *testing.T) {
	e := newEnv(t)
	addr := startTestHost(t)
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		t.Fatalf("the host cannot reach the test host, so this test proves nothing: %v", err)
	}
	greeting, _ := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if strings.TrimSpace(greeting) != nettest.Greeting {
		t.Fatalf("test host said %q", greeting)
	}
	for _, v := range testVariants(t, e) {
		cl := v.class
		t.Run(v.name, func(t *testing.T) {
			script := fmt.Sprintf("cat /proc/net/dev; echo sys: $(ls /sys/class/net 2>/dev/null); /work/probe dial %s; echo dial=$?; /work/probe loopback", addr)
			r := e.run(t, context.Background(), job{class: cl, src: e.source(t, nil), cmd: []string{"sh", "-c", script}, claimed: v.claimed})
			wantExit(t, r, 0)
			var ifaces []string
			for _, line := range strings.Split(r.stdout, "\n") {
				if i := strings.Index(line, ":"); i > 0 && !strings.Contains(line, "|") && !strings.HasPrefix(line, "sys:") && !strings.HasPrefix(line, "denied") && !strings.HasPrefix(line, "loopback") {
					ifaces = append(ifaces, strings.TrimSpace(line[:i]))
				}
			}
			if !slices.Equal(ifaces, []string{"lo"}) {
				t.Errorf("interfaces in /proc/net/dev: %v, want only lo", ifaces)
			}
			if cl == ClassRunc && !strings.Contains(r.stdout, "sys: lo\n") {
				t.Errorf("/sys/class/net shows more than lo")
			}
			if !strings.Contains(r.stdout, "denied: dial") || !strings.Contains(r.stdout, "dial=0") {
				t.Errorf("the sandbox reached the test host")
			}
			if !strings.Contains(r.stdout, "loopback ok: pong") {
				t.Errorf("loopback does not work inside")
			}
		})
	}
}

// From inside: no capabilities, seccomp on, no new privileges; mount,
// namespaces, ptrace, keyctl and chroot all fail; Docker's masked paths
// are masked.
func TestHardening(t *testing.T) {
	e := newEnv(t)
	script := `exec 2>&1
grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
echo uidmap: $(cat /proc/self/uid_map)
for p in keyctl ptrace mount clone-userns chroot; do /work/probe $p; echo "$p=$?"; done
unshare -U -r true; echo "unshare-U-r=$?"
unshare -m true; echo "unshare-m=$?"
unshare -n true; echo "unshare-n=$?"
mount -t tmpfs none /tmp; echo "mount-bin=$?"
echo kcore=$(head -c 100 /proc/kcore | wc -c)
echo keys=$(cat /proc/keys | wc -c)
echo timer_list=$(cat /proc/timer_list | wc -c)
echo sysrq; echo b > /proc/sysrq-trigger; echo "sysrq=$?"
echo x > /proc/sys/kernel/hostname; echo "procsys=$?"
echo firmware=$(ls /sys/firmware | wc -l)
echo hostname=$(hostname)
echo oom_score_adj=$(cat /proc/self/oom_score_adj)
touch /usr/bin/evil; echo "usr=$?"
touch /etc/evil; echo "etc=$?"
echo done`
	// As the job itself, as a session's exec (through its helper), and as
	// an exec in a pooled sandbox the session claimed.
	for _, via := range []struct {
		name             string
		viaExec, claimed bool
	}{{"exec=false", false, false}, {"exec=true", true, false}, {"claimed", true, true}, {"claimed job", false, true}} {
		if via.claimed && !pooling(t, e) {
			continue
		}
		t.Run(via.name, func(t *testing.T) {
			r := e.run(t, context.Background(), job{src: e.source(t, nil), cmd: []string{"/bin/sh", "-c", script}, viaExec: via.viaExec, claimed: via.claimed})
			wantExit(t, r, 0)
			out := r.stdout
			for _, want := range []string{
				"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
				"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2",
				fmt.Sprintf("uidmap: 0 %d %d", e.cfg.UIDBase, uidRange),
				"keyctl=0", "ptrace=0", "mount=0", "clone-userns=0", "chroot=0",
				"kcore=0", "keys=0", "timer_list=0", "firmware=0", "hostname=airlock", "oom_score_adj=1000", "done",
			} {
				if !strings.Contains(out, want+"\n") {
					t.Errorf("missing %q", want)
				}
			}
			for _, bad := range []string{"ALLOWED", "unshare-U-r=0", "unshare-m=0", "unshare-n=0", "mount-bin=0", "sysrq=0", "procsys=0", "usr=0", "etc=0"} {
				if strings.Contains(out, bad+"\n") || (bad == "ALLOWED" && strings.Contains(out, bad)) {
					t.Errorf("got %q: the sandbox allowed it", bad)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// Cancelling mid-run kills the job (cancelled), and after Destroy nothing
// of the sandbox is left; Destroy twice is fine.
func TestCancel(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	sb, err := e.m.Create(ctx, Spec{ID: "cancel-me", Class: ClassRunc, Source: e.source(t, nil),
		Command: []string{"sh", "-c", "sleep 300 & echo started; wait"}, Limits: defaultLimits, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		waitFor(t, "the job to start", 10*time.Second, func() bool { return strings.Contains(out.String(), "started") })
		cancel()
	}()
	res, err := sb.Run(ctx)
	if err != nil || res.Reason != ReasonCancelled || res.ExitCode != -1 {
		t.Fatalf("Run = %+v, %v; want cancelled", res, err)
	}
	if pids := procsInUIDRange(e.cfg.UIDBase); len(pids) > 0 {
		t.Fatalf("sandbox processes left after cancel: %v", pids)
	}
	for i := 0; i < 2; i++ {
		if err := sb.Destroy(); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
	}
	e.assertClean(t)
	if _, err := sb.Run(context.Background()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Run after Destroy: %v", err)
	}
}

// Destroy during Run stops the job; Destroy without Run cleans up too.
func TestDestroy(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, nil)
	var out syncBuffer
	sb, err := e.m.Create(context.Background(), Spec{ID: "destroy-running", Class: ClassRunc, Source: src,
		Command: []string{"sh", "-c", "echo started; sleep 300"}, Limits: defaultLimits, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan Result, 1)
	go func() {
		res, _ := sb.Run(context.Background())
		done <- res
	}()
	waitFor(t, "the job to start", 10*time.Second, func() bool { return strings.Contains(out.String(), "started") })
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.Reason != ReasonCancelled {
		t.Fatalf("Run ended %s, want cancelled", res.Reason)
	}
	e.assertClean(t)

	sb, err = e.m.Create(context.Background(), Spec{ID: "destroy-unrun", Class: ClassRunc, Source: src, Command: []string{"true"}, Limits: defaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)
}

func TestCreateValidates(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, nil)
	good := Spec{ID: "ok", Class: ClassRunc, Source: src, Command: []string{"true"}, Limits: defaultLimits}
	for _, tc := range []struct {
		name, field string
		edit        func(*Spec)
	}{
		{"bad id", "spec.id", func(s *Spec) { s.ID = "../escape" }},
		{"long id", "spec.id", func(s *Spec) { s.ID = strings.Repeat("a", 65) }},
		{"empty id", "spec.id", func(s *Spec) { s.ID = "" }},
		{"class", "spec.class", func(s *Spec) { s.Class = "kata" }},
		{"relative source", "spec.source", func(s *Spec) { s.Source = "src" }},
		{"source with comma", "spec.source", func(s *Spec) { s.Source = "/tmp/a,upperdir=/" }},
		{"missing source", "spec.source", func(s *Spec) { s.Source = "/nonexistent/airlock" }},
		{"no command", "spec.command", func(s *Spec) { s.Command = nil }},
		{"env key", "spec.env", func(s *Spec) { s.Env = map[string]string{"A=B": "c"} }},
		{"cpu", "spec.limits.cpu_millis", func(s *Spec) { s.Limits.CPUMillis = 0 }},
		{"memory", "spec.limits.memory_bytes", func(s *Spec) { s.Limits.MemoryBytes = 1 << 20 }},
		{"pids", "spec.limits.pids", func(s *Spec) { s.Limits.Pids = -1 }},
		{"runsc pids", "spec.limits.pids", func(s *Spec) { s.Class, s.Limits.Pids = ClassRunsc, 32 }},
		{"runsc memory", "spec.limits.memory_bytes", func(s *Spec) { s.Class, s.Limits.MemoryBytes = ClassRunsc, 32<<20 }},
		{"disk", "spec.limits.disk_bytes", func(s *Spec) { s.Limits.DiskBytes = 0 }},
		{"deadline", "spec.limits.deadline", func(s *Spec) { s.Limits.Deadline = 0 }},
		// A uid or gid the user namespace does not map is refused here,
		// not left to fail in the runtime.
		{"uid nobody", "spec.user uid 65534", func(s *Spec) { s.User = runspec.User{UID: 65534} }},
		{"uid past the range", "spec.user uid 65536", func(s *Spec) { s.User = runspec.User{UID: 65536} }},
		{"gid past the range", "spec.user gid 4294967295", func(s *Spec) { s.User = runspec.User{UID: 1000, GID: 1<<32 - 1} }},
		{"cache in root's home for agent", "spec.caches[0].path", func(s *Spec) {
			s.User, s.Caches = runspec.Agent, []CacheMount{{Path: "/root/.cache", Lower: src}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			tc.edit(&s)
			_, err := e.m.Create(context.Background(), s)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Create: %v; want invalid argument naming %s", err, tc.field)
			}
		})
	}
	sb, err := e.m.Create(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	// The limits sit on the job's own cgroup.
	want := cgroupLimits{MemoryBytes: good.Limits.MemoryBytes, Pids: good.Limits.Pids, CPUMillis: good.Limits.CPUMillis}
	if got := jobLimits(t, e, sb); got != want {
		t.Errorf("cgroup limits %+v, want %+v", got, want)
	}
	if _, err := e.m.Create(context.Background(), good); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second Create with the same id: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		cfg         Config
	}{
		{"relative state", "state_dir", Config{StateDir: "state"}},
		{"uid overflow", "uid_base", Config{StateDir: "/tmp/x", UIDBase: 1<<32 - 100}},
		{"cgroup root", "cgroup_parent", Config{StateDir: "/tmp/x", CgroupParent: "/"}},
		{"cgroup relative", "cgroup_parent", Config{StateDir: "/tmp/x", CgroupParent: "airlock"}},
		{"rootfs inside state", "rootfs_dir", Config{StateDir: "/tmp/x", RootfsDir: "/tmp/x/rootfs"}},
		{"runsc platform", "runsc_platform", Config{StateDir: "/tmp/x", RunscPlatform: "kvm"}},
		{"self-check cache", "runsc_self_check_cache", Config{StateDir: "/tmp/x", RunscSelfCheckCache: "cache"}},
		{"path searching the current directory", "path", Config{StateDir: "/tmp/x", Path: "/usr/bin::/bin"}},
		{"a CA bundle with a private key", "ca_bundle", Config{StateDir: "/tmp/x", CABundle: []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("New: %v; want invalid argument naming %s", err, tc.field)
			}
		})
	}
}

var exitedRE = regexp.MustCompile(`^exited with status \d+`)

func TestResultMessage(t *testing.T) {
	e := newEnv(t)
	r := e.sh(t, e.source(t, nil), "exit 0")
	wantExit(t, r, 0)
	if !exitedRE.MatchString(r.res.Message) {
		t.Errorf("message %q", r.res.Message)
	}
}

func execHost(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.Output()
	return string(out), err
}

// The scratch disk is not memory: a job may write far more than its memory
// limit (which a tmpfs scratch, charged to the writer's memory cgroup,
// would turn into an OOM kill).
func TestDiskIsNotMemory(t *testing.T) {
	e := newEnv(t)
	if e.m.pool.kind != scratchExt4 {
		t.Fatalf("scratch is %s: this host lacks loop devices or mkfs.ext4", e.m.pool.kind)
	}
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			lim := defaultLimits
			lim.MemoryBytes = 48 << 20
			if c == ClassRunsc {
				// gVisor's own kernel needs more; still half of what
				// the job writes.
				lim.MemoryBytes = 160 << 20
			}
			lim.DiskBytes = 512 << 20
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), limits: &lim, cmd: []string{"sh", "-c",
				"dd if=/dev/zero of=/work/big bs=1M count=160 2>&1 | tail -1 && dd if=/dev/zero of=/tmp/big bs=1M count=160 2>&1 | tail -1"}})
			wantExit(t, r, 0)
			if u := r.res.Usage.DiskBytes; u < 320<<20 {
				t.Fatalf("disk usage %d, want the 320 MiB written", u)
			}
		})
	}
}

// Without loop devices the scratch is a size-limited tmpfs, and the disk
// limit holds all the same.
func TestTmpfsScratchFallback(t *testing.T) {
	e := newEnv(t)
	e.m.pool = &scratchPool{kind: scratchTmpfs}
	lim := defaultLimits
	lim.DiskBytes = 8 << 20
	r := e.run(t, context.Background(), job{src: e.source(t, nil), limits: &lim, cmd: []string{"sh", "-c",
		"mount | grep ' /work '; dd if=/dev/zero of=/tmp/a bs=1M count=6 2>/dev/null; dd if=/dev/zero of=/work/b bs=1M count=6"}})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Reason != ReasonDiskFull || !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("reason %s, stderr %q; want disk_full with ENOSPC", r.res.Reason, r.stderr)
	}
}

// On a host whose mounts are shared (systemd makes / shared), New makes
// the state dir a private mount, so no sandbox mount propagates to, and
// stays pinned in, another mount namespace.
func TestSharedStateDirMadePrivate(t *testing.T) {
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	base := t.TempDir()
	shared := filepath.Join(base, "shared")
	if err := os.Mkdir(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(shared, shared, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(shared, unix.MNT_DETACH) })
	if err := unix.Mount("", shared, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(shared, "state")
	cfg := Config{StateDir: state, RuncPath: runcPath, UIDBase: 3000000, CgroupParent: fmt.Sprintf("/airlock-test-%d-shared", os.Getpid())}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(state, unix.MNT_DETACH) })
	mt, ok, err := mountOf(state)
	if err != nil || !ok || mt.point != state {
		t.Fatalf("state dir is not a mount of its own: %+v %v %v", mt, ok, err)
	}
	for _, o := range mt.optional {
		if strings.HasPrefix(o, "shared:") {
			t.Fatalf("state dir mount is still shared: %v", mt.optional)
		}
	}
	// New on an already private state dir leaves it as it is.
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if points, _ := mountsUnder(shared); len(points) != 1 {
		t.Fatalf("mounts under the shared dir: %v, want only the state dir", points)
	}
	src, err := os.MkdirTemp(base, "src-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(src, 0o755)
	os.Chown(src, int(cfg.UIDBase), int(cfg.UIDBase))
	sb, err := m.Create(context.Background(), Spec{ID: "p", Class: ClassRunc, Source: src, Command: []string{"true"}, Limits: defaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Run(context.Background()); err != nil || res.ExitCode != 0 {
		t.Fatalf("Run: %+v %v", res, err)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if points, _ := mountsUnder(state); len(points) != 0 {
		t.Fatalf("mounts left: %v", points)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
