package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/delegate"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// These tests run real sandboxes: they need root, cgroups (v1 here; v2 in
// the VM of `make test-cgroup2`) and the runc
// binary (AIRLOCK_RUNC, default <module root>/bin/runc) and, for the runsc
// tests, runsc (AIRLOCK_RUNSC, default <module root>/bin/runsc). Build both
// with `tools/sandbox/build.sh bin` from the module root. A missing
// prerequisite fails the tests; nothing is skipped.

var (
	runcPath, runscPath string
	execdBin            string // airlock-execd, built by setup
	probeBin            string // the static boundary-probe helper
	setupErr            error
	testSeq             atomic.Int64
	// selfCheckCache is where every env records runsc's self-check (as an
	// executor restarted on the same machine does): it runs once for the
	// test binary, not for each env. The self-check's own tests take a
	// fresh one (ownSelfCheck).
	selfCheckCache string
)

const helperEnv = "AIRLOCK_SANDBOX_TEST_HELPER"

// slowdown stretches the few timings that bound a runtime's start: make
// test-cgroup2's machine emulates its CPU (AIRLOCK_CGROUP2VM is set
// there), and runsc takes seconds to start a container on it.
var slowdown = time.Duration(map[bool]int{false: 1, true: 5}[os.Getenv("AIRLOCK_CGROUP2VM") != ""])

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	// On a cgroup v2 host run by systemd, the tests run in a scope of
	// their own, delegated to them, as the executor would in its unit: a
	// shell's session scope holds other processes (package delegate).
	if os.Getenv("AIRLOCK_TEST_SCOPED") == "" {
		if p := delegate.ReadHost().Prefix(fmt.Sprintf("airlock-sandbox-test-%d", os.Getpid())); p != nil {
			argv := append(p, os.Args...)
			err := syscall.Exec(argv[0], argv, append(os.Environ(), "AIRLOCK_TEST_SCOPED=1"))
			fmt.Fprintln(os.Stderr, "run the tests in a delegated systemd scope:", err)
		}
	}
	tmp, err := os.MkdirTemp("", "sandbox-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	selfCheckCache = filepath.Join(tmp, "selfcheck")
	setupErr = setup(tmp)
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

func setup(tmp string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the sandbox tests must run as root (uid 0), not uid %d", os.Geteuid())
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	runcPath = envOr("AIRLOCK_RUNC", filepath.Join(root, "bin", "runc"))
	runscPath = envOr("AIRLOCK_RUNSC", filepath.Join(root, "bin", "runsc"))
	for _, p := range []string{runcPath, runscPath} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("runtime binary %s: %v: run `tools/sandbox/build.sh bin` in %s (or set AIRLOCK_RUNC / AIRLOCK_RUNSC)", p, err, root)
		}
	}
	// The exec helper, static, as make builds it; or built beforehand
	// (AIRLOCK_TEST_EXECD) where there is no compiler: make test-cgroup2's VM.
	var cmd *exec.Cmd
	if execdBin = os.Getenv("AIRLOCK_TEST_EXECD"); execdBin != "" {
		if _, err := os.Stat(execdBin); err != nil {
			return fmt.Errorf("AIRLOCK_TEST_EXECD: %w", err)
		}
	} else {
		execdBin = filepath.Join(tmp, "airlock-execd")
		cmd = exec.Command("go", "build", "-o", execdBin, "../../cmd/airlock-execd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build the exec helper: %v: %s", err, out)
		}
	}
	// A probe built beforehand (AIRLOCK_TEST_PROBE) spares a compile where
	// one is slow: make test-cgroup2's emulated VM.
	if probeBin = os.Getenv("AIRLOCK_TEST_PROBE"); probeBin != "" {
		if _, err := os.Stat(probeBin); err != nil {
			return fmt.Errorf("AIRLOCK_TEST_PROBE: %v", err)
		}
		return nil
	}
	probeBin = filepath.Join(tmp, "probe")
	cmd = exec.Command("go", "build", "-o", probeBin, "./testdata/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the probe helper: %v: %s", err, out)
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/airlockhq/airlock\n")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("no go.mod of github.com/airlockhq/airlock above %s", dir)
}

// env is one test's sandbox world: its own state dir, cgroup parent and
// uid range, so tests never see each other's leftovers.
type env struct {
	t       *testing.T
	base    string
	cfg     Config
	m       *Manager
	secrets []string // host paths of dummy secrets
}

// newEnv makes an env; opts change its Config before the Manager is made.
func newEnv(t testing.TB, opts ...func(*Config)) *env {
	t.Helper()
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	n := testSeq.Add(1)
	base := t.TempDir()
	e := &env{base: base}
	e.cfg = Config{
		StateDir:     filepath.Join(base, "state"),
		RuncPath:     runcPath,
		RunscPath:    runscPath,
		ExecdPath:    execdBin,
		UIDBase:      testUIDBase(n),
		CgroupParent: fmt.Sprintf("/airlock-test-%d-%d", os.Getpid(), n),
		// Most tests only need runsc to work; TestRunscPlatforms runs the
		// self-check at its full length.
		RunscSelfCheck:      2 * time.Second,
		RunscSelfCheckCache: selfCheckCache,
		Logger:              slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	for _, o := range opts {
		o(&e.cfg)
	}
	m, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	// AIRLOCK_TEST_RUNSC_FS and AIRLOCK_TEST_RUNSC_BATCH run every runsc
	// test with other filesystem flags than runscFSFlags and
	// runscBatchFlags, to check a candidate before it becomes the
	// default (docs/performance.md).
	if v, ok := os.LookupEnv("AIRLOCK_TEST_RUNSC_FS"); ok {
		m.runtimes[ClassRunsc].fsFlags = strings.Fields(v)
	}
	if v, ok := os.LookupEnv("AIRLOCK_TEST_RUNSC_BATCH"); ok {
		m.runtimes[ClassRunsc].batchFlags = strings.Fields(v)
	}
	t.Cleanup(func() {
		e.assertClean(t)
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for _, dir := range m.cg.dirs(m.cgParent) {
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("cgroup parent left after Close: %s", dir)
			}
		}
	})
	return e
}

// ownSelfCheck gives an env the self-check cache of its own state dir (the
// executor's default), so its first probe runs runsc's self-check.
func ownSelfCheck(c *Config) { c.RunscSelfCheckCache = "" }

// testUIDBase gives each env its own uid range, distinct also from any other
// test process running at the same time (the range's processes are checked
// for survivors), and from the executor default 1000000.
func testUIDBase(n int64) uint32 {
	slot := (os.Getpid()%1024)*64 + int(n%64)
	return uint32(2000000 + slot*uidRange)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// source makes a source tree owned by the sandbox's root, holding files and
// the probe helper.
func (e *env) source(t testing.TB, files map[string]string) string {
	t.Helper()
	dir, err := os.MkdirTemp(e.base, "src-")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	probe, err := os.ReadFile(probeBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "probe"), probe, 0o755); err != nil {
		t.Fatal(err)
	}
	uid := int(e.cfg.UIDBase)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// syncBuffer is a bytes.Buffer safe for the output copier and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var defaultLimits = Limits{CPUMillis: 2000, MemoryBytes: 256 << 20, Pids: 128, DiskBytes: 64 << 20, Deadline: 30 * time.Second}

type job struct {
	class  Class
	src    string
	cmd    []string
	env    map[string]string
	limits *Limits
	user   runspec.User
	caches []CacheMount
	// image, if set, is the job's root instead of the host template.
	image *ImageRoot
	// extraCAs are the job's own CAs (Spec.ExtraCAs).
	extraCAs []byte
	// viaExec runs cmd as an exec in a session sandbox of the same spec
	// (under runc: through its exec helper) instead of as the job itself.
	viaExec bool
	// claimed makes the sandbox a pooled one (Warm) the job claims: a
	// batch job's command then runs as its main exec, and with viaExec the
	// session is the claimed one.
	claimed bool
}

type ran struct {
	sb             *Sandbox
	res            Result
	err            error
	stdout, stderr string
}

// run creates and runs a job and leaves the sandbox for the caller to
// inspect; it is destroyed (and checked gone) at cleanup.
func (e *env) run(t testing.TB, ctx context.Context, j job) ran {
	t.Helper()
	if j.class == "" {
		j.class = ClassRunc
	}
	lim := defaultLimits
	if j.limits != nil {
		lim = *j.limits
	}
	var out, errb syncBuffer
	id := fmt.Sprintf("job-%d", testSeq.Add(1))
	spec := Spec{ID: id, Class: j.class, Source: j.src, Command: j.cmd, Env: j.env, Limits: lim, User: j.user, Caches: j.caches, Image: j.image, ExtraCAs: j.extraCAs, Stdout: &out, Stderr: &errb}
	if j.viaExec {
		spec.Command, spec.Stdout, spec.Stderr = IdleCommand, nil, nil
	}
	var sb *Sandbox
	var err error
	if j.claimed {
		sb, err = e.claimed(ctx, spec)
	} else {
		sb, err = e.m.Create(ctx, spec)
	}
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	if j.viaExec {
		return e.runExecJob(t, ctx, sb, j)
	}
	res, err := sb.Run(ctx)
	r := ran{sb: sb, res: res, err: err, stdout: out.String(), stderr: errb.String()}
	t.Logf("%s %v: reason=%s exit=%d msg=%q usage=%+v\nstdout: %s\nstderr: %s", j.class, j.cmd, res.Reason, res.ExitCode, res.Message, res.Usage, trunc(r.stdout), trunc(r.stderr))
	return r
}

// runExecJob runs j.cmd as an exec in sb, a session's sandbox, and
// reports it as a job's run.
func (e *env) runExecJob(t testing.TB, ctx context.Context, sb *Sandbox, j job) ran {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _, _ = sb.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	var out, errb syncBuffer
	x, err := sb.Exec(ctx, ExecSpec{Argv: j.cmd, Stdout: &out, Stderr: &errb})
	res := Result{Reason: x.Reason, ExitCode: x.ExitCode, Message: x.Message}
	r := ran{sb: sb, res: res, err: err, stdout: out.String(), stderr: errb.String()}
	t.Logf("%s exec %v: reason=%s exit=%d msg=%q wall=%s\nstdout: %s\nstderr: %s", j.class, j.cmd, x.Reason, x.ExitCode, x.Message, x.WallTime, trunc(r.stdout), trunc(r.stderr))
	return r
}

func trunc(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

// sh runs a shell command in a runc sandbox with default limits.
func (e *env) sh(t testing.TB, src, script string) ran {
	t.Helper()
	return e.run(t, context.Background(), job{src: src, cmd: []string{"/bin/sh", "-c", script}})
}

// assertClean checks that nothing of any sandbox is left on the host.
func (e *env) assertClean(t testing.TB) {
	t.Helper()
	points, err := mountsUnder(e.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(points) > 0 {
		t.Errorf("mounts left under the state dir: %v", points)
	}
	for _, dir := range e.m.cg.dirs(e.m.cgParent) {
		ents, _ := os.ReadDir(dir)
		for _, ent := range ents {
			if ent.IsDir() {
				t.Errorf("cgroup left: %s", filepath.Join(dir, ent.Name()))
			}
		}
	}
	if pids := procsInUIDRange(e.cfg.UIDBase); len(pids) > 0 {
		t.Errorf("processes of the sandbox uid range still alive: %v", pids)
	}
	for _, d := range []string{"jobs", "runc", "runsc", "vm", "kept"} {
		ents, _ := os.ReadDir(filepath.Join(e.cfg.StateDir, d))
		for _, ent := range ents {
			if d == "vm" && ent.Name() == ".initramfs" {
				continue // airlock-vm's cache of the guest's initramfs, no job's
			}
			t.Errorf("left in %s: %s", d, ent.Name())
		}
	}
	// The kernel detaches an unmounted scratch's loop device in its own
	// time (seconds, under load): what is still attached after 15 s is
	// left.
	loops := loopsUnder(e.cfg.StateDir)
	for end := time.Now().Add(15 * time.Second); len(loops) > 0 && time.Now().Before(end); loops = loopsUnder(e.cfg.StateDir) {
		time.Sleep(100 * time.Millisecond)
	}
	if len(loops) > 0 {
		t.Errorf("loop devices still backed by files under the state dir: %v", loops)
	}
}

// procsInUIDRange lists processes whose real or effective uid is in the
// sandbox's mapped range. A zombie does not count: it has exited and holds
// nothing; only its (host) parent's wait remains. Nor does a process
// already in its exit (killed): a pid namespace's init leaves its cgroup
// first, then waits there for the rest of its namespace to be reaped,
// which after a fork bomb on a loaded host takes a moment.
func procsInUIDRange(base uint32) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "\nState:\tZ") || strings.Contains(string(b), "\nState:\tX") || exiting(e.Name()) {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == "Uid:" {
				for _, u := range f[1:3] {
					n, _ := strconv.ParseUint(u, 10, 32)
					if n >= uint64(base) && n < uint64(base)+uidRange {
						out = append(out, e.Name()+":"+statusName(b))
						break
					}
				}
			}
		}
	}
	return out
}

// exiting says whether process pid is in its exit: the kernel's
// PF_EXITING in the flags of /proc/PID/stat (its ninth field).
func exiting(pid string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// pfExiting is the kernel's PF_EXITING task flag.
const pfExiting = 0x4

func statusName(status []byte) string {
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Name:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "Name:"))
		}
	}
	return "?"
}

func loopsUnder(dir string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		p := trimDeleted(strings.TrimSpace(string(b)))
		if isUnder(p, dir) {
			out = append(out, f+"="+p)
		}
	}
	return out
}

func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
