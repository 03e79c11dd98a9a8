package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// warm makes a pooled sandbox for spec's shape, destroyed at cleanup.
func (e *env) warm(t testing.TB, spec Spec) *Sandbox {
	t.Helper()
	sb, err := e.m.Warm(context.Background(), WarmSpec{Name: fmt.Sprintf("%s%d", PoolPrefix, testSeq.Add(1)), Class: ClassRunc,
		User: spec.User, Limits: spec.Limits, NetNS: spec.NetNS})
	if err != nil {
		t.Fatalf("Warm: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return sb
}

// claimed is a pooled sandbox made for spec and claimed by it.
func (e *env) claimed(ctx context.Context, spec Spec) (*Sandbox, error) {
	sb, err := e.m.Warm(ctx, WarmSpec{Name: fmt.Sprintf("%s%d", PoolPrefix, testSeq.Add(1)), Class: spec.Class,
		User: spec.User, Limits: spec.Limits, NetNS: spec.NetNS})
	if err != nil {
		return nil, err
	}
	if err := sb.Claim(spec); err != nil {
		return nil, errors.Join(err, sb.Destroy())
	}
	return sb, nil
}

// runClaimed runs sb, claimed, as a session until the returned stop, and
// waits until it is ready.
func runClaimed(t *testing.T, sb *Sandbox, ready *atomic.Bool) func() Result {
	t.Helper()
	stop := background(t, sb)
	waitFor(t, "the claimed session to be ready", 10*time.Second, ready.Load)
	return stop
}

// TestWarmHoldsNothingBeforeClaim: a pooled sandbox, from inside, before
// any claim, has an empty /work with nothing mounted on it, no job's
// environment, and only Airlock's own processes; on the host, no claim
// file and no /work overlay. Its claim then brings exactly the job's
// /work (read-write, nosuid, nodev), its environment and cwd, its git
// objects read-only, its limits and a ready session at once; the job's
// writes reach the host's view of /work; and after Destroy nothing is
// left.
func TestWarmHoldsNothingBeforeClaim(t *testing.T) {
	e := newEnv(t)
	if !pooling(t, e) {
		return
	}
	ctx := context.Background()
	lim := defaultLimits
	lim.Deadline = 2 * time.Minute
	sb := e.warm(t, Spec{Limits: lim})
	r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `echo "work=[$(ls -A /work)] objects=[$(ls -A /.airlock/git-objects)]"
grep -c ' /work ' /proc/self/mountinfo; echo "procs=[$(cat /proc/[0-9]*/comm | sort | tr '\n' ' ')]"; env | sort`}})
	if r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("exec before the claim: %+v", r)
	}
	lines := strings.Split(r.stdout, "\n")
	// Its init and the sleep it waits on, the exec helper, and this exec.
	if len(lines) < 3 || lines[0] != "work=[] objects=[]" || lines[1] != "0" {
		t.Fatalf("before the claim, /work, the objects and /work's mounts: %q", lines[:min(2, len(lines))])
	}
	// The helper's name is the fd it was executed from.
	procs := strings.Fields(strings.TrimSuffix(strings.TrimPrefix(lines[2], "procs=["), "]"))
	for _, p := range procs {
		if _, err := strconv.Atoi(p); err != nil && !slices.Contains([]string{"bash", "sleep", "sh", "cat", "sort", "tr"}, p) {
			t.Errorf("before the claim, a process that is not Airlock's or the exec's: %q in %v", p, procs)
		}
	}
	if !slices.Contains(procs, "sleep") || !slices.Contains(procs, "bash") {
		t.Errorf("before the claim, no idle init: %v", procs)
	}
	if strings.Contains(r.stdout, "FROM_THE_JOB") {
		t.Errorf("before the claim, the job's environment: %q", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(sb.dir, claimFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a claim file before the claim: %v", err)
	}
	if ents, err := os.ReadDir(sb.WorkDir()); err != nil || len(ents) != 0 {
		t.Errorf("the host's /work before the claim: %v %v", ents, err)
	}
	if _, ok, _ := mountOf(sb.WorkDir()); ok {
		if m, _, _ := mountOf(sb.WorkDir()); m.point == sb.WorkDir() {
			t.Errorf("the host's /work is a mount before the claim")
		}
	}
	if _, err := sb.Run(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Run before a claim: %v, want a refusal", err)
	}

	src := e.source(t, map[string]string{"README": "the job's\n"})
	objects := t.TempDir()
	if err := os.WriteFile(filepath.Join(objects, "pack"), []byte("objects\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(objects, 0o755); err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	claimLim := lim
	claimLim.Pids, claimLim.CPUMillis = 77, 500
	spec := Spec{ID: "claimer", Class: ClassRunc, Source: src, GitObjects: objects, Command: IdleCommand, Limits: claimLim,
		Env: map[string]string{"FROM_THE_JOB": "yes"}, Ready: func() { ready.Store(true) }}
	began := time.Now()
	if err := sb.Claim(spec); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	claimTook := time.Since(began)
	if sb.spec.ID != "claimer" || sb.Name() == "claimer" || !strings.HasPrefix(sb.Name(), PoolPrefix) {
		t.Errorf("after the claim: id %q, name %q", sb.spec.ID, sb.Name())
	}
	if b, err := os.ReadFile(filepath.Join(sb.dir, claimFile)); err != nil || string(b) != "claimer" {
		t.Errorf("the claim file: %q %v", b, err)
	}
	stop := runClaimed(t, sb, &ready)
	t.Logf("claim %v, then ready %v after it", claimTook, time.Since(began)-claimTook)
	r = runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `cat /work/README; pwd; echo "$FROM_THE_JOB"; cat /.airlock/git-objects/pack
grep ' /work \| /.airlock/git-objects ' /proc/self/mountinfo; echo new > /work/new; touch /.airlock/git-objects/x 2>&1; cat /proc/self/cgroup`}})
	if r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("exec after the claim: %+v", r)
	}
	if !strings.HasPrefix(r.stdout, "the job's\n/work\nyes\nobjects\n") {
		t.Errorf("after the claim, /work, the cwd, the env and the objects: %q", r.stdout)
	}
	opts := map[string][]string{}
	for _, l := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(l); len(f) > 6 && (f[4] == "/work" || f[4] == "/.airlock/git-objects") {
			opts[f[4]] = strings.Split(f[5], ",")
		}
	}
	for point, want := range map[string][]string{"/work": {"rw", "nosuid", "nodev"}, "/.airlock/git-objects": {"ro", "nosuid", "nodev", "noexec"}} {
		for _, o := range want {
			if !slices.Contains(opts[point], o) {
				t.Errorf("after the claim, %s's options %v, want %s", point, opts[point], o)
			}
		}
	}
	if !strings.Contains(r.stdout, "Read-only file system") {
		t.Errorf("after the claim, a write to the git objects: %q", r.stdout)
	}
	if b, err := os.ReadFile(filepath.Join(sb.UpperDir(), "new")); err != nil || string(b) != "new\n" {
		t.Errorf("the job's write, from the host: %q %v", b, err)
	}
	// The claim's pids limit is in force: 77 tasks, and a fork past it
	// fails.
	r = runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `for i in $(seq 1 100); do sleep 30 & done 2>/dev/null; echo forked`}})
	if st := sb.m.cg.stats(sb.cgRel); st.peakPids != 77 || r.stdout == "forked\n" {
		t.Errorf("100 sleeps under a claimed pids limit of 77: every fork worked, or the peak is not the limit (%+v, %q)", st, r.stdout)
	}
	res := stop()
	if res.Reason != ReasonCancelled {
		t.Errorf("the claimed session's end: %+v", res)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)
}

// TestClaimsShareNothing: two sandboxes pooled for one shape and claimed
// by two jobs at once share no file, process, namespace or cgroup; what
// the first leaves behind (files in /work, /tmp, /out, $HOME and
// /dev/shm, a process of its own) is nowhere in the second, nor in a
// third pooled after the first is gone.
func TestClaimsShareNothing(t *testing.T) {
	e := newEnv(t)
	if !pooling(t, e) {
		return
	}
	ctx := context.Background()
	lim := defaultLimits
	lim.Deadline = 2 * time.Minute
	user := runspec.User{UID: 1000, GID: 1000}
	shape := Spec{Limits: lim, User: user}
	claim := func(sb *Sandbox, id string) func() Result {
		var ready atomic.Bool
		spec := Spec{ID: id, Class: ClassRunc, Source: e.source(t, map[string]string{"README": id}), Command: IdleCommand, Limits: lim, User: user,
			Ready: func() { ready.Store(true) }}
		if err := sb.Claim(spec); err != nil {
			t.Fatalf("Claim by %s: %v", id, err)
		}
		return runClaimed(t, sb, &ready)
	}
	const ident = `for n in mnt net pid ipc uts cgroup user; do echo "$n=$(readlink /proc/self/ns/$n)"; done`
	a, b := e.warm(t, shape), e.warm(t, shape)
	stopA, stopB := claim(a, "job-a"), claim(b, "job-b")
	ra := runExec(t, ctx, a, ExecSpec{Argv: []string{"sh", "-c", `for d in /work /tmp /out "$HOME" /dev/shm; do echo a > $d/marker-a || exit 1; done
setsid sleep 300 >/dev/null 2>&1 < /dev/null & ` + ident}})
	if ra.err != nil || ra.res.ExitCode != 0 {
		t.Fatalf("job a: %+v", ra)
	}
	// check looks, from sb, for what a left; with aLive, it compares
	// their namespaces and host parts too (a's are free for reuse once
	// it is gone).
	check := func(sb *Sandbox, who string, aLive bool) {
		t.Helper()
		r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `cat /work/README; echo
for d in /work /tmp /out "$HOME" /dev/shm; do ls -A $d; done | grep -c marker-a
for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline)" = "sleep 300 " ] && echo found; done | grep -c found
` + ident}})
		lines := strings.Split(r.stdout, "\n")
		if len(lines) < 4 || lines[0] != who || lines[1] != "0" || lines[2] != "0" {
			t.Errorf("%s sees: %q", who, r.stdout)
		}
		if !aLive {
			return
		}
		for _, l := range strings.Split(ra.stdout, "\n") {
			// Every namespace but the user one (the same id mapping, made
			// anew by each sandbox) differs.
			if strings.HasPrefix(l, "user=") || l == "" {
				continue
			}
			if strings.Contains(r.stdout, l+"\n") {
				t.Errorf("%s shares a's namespace %s", who, l)
			}
		}
		if sb.cgRel == a.cgRel || sb.scr.loop == a.scr.loop && a.scr.loop != "" || sb.dir == a.dir {
			t.Errorf("%s and a share a cgroup, loop device or directory", who)
		}
	}
	// The search works: a finds its own.
	if r := runExec(t, ctx, a, ExecSpec{Argv: []string{"sh", "-c", `for d in /work /tmp /out "$HOME" /dev/shm; do ls -A $d; done | grep -c marker-a
for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline)" = "sleep 300 " ] && echo found; done | grep -c found`}}); r.stdout != "5\n1\n" {
		t.Errorf("a's own search for its markers and process: %q", r.stdout)
	}
	check(b, "job-b", true)
	stopA()
	if err := a.Destroy(); err != nil {
		t.Fatal(err)
	}
	c := e.warm(t, shape)
	stopC := claim(c, "job-c")
	check(c, "job-c", false)
	stopB()
	stopC()
}

// TestClaimRefuses: a claim by a job of another shape, by a pooled name, a second claim, a claim of a sandbox not pooled, and one
// whose init died while it waited, are each refused; a bad pooled name
// and a class not pooled are refused by Warm. A refused claim leaves the
// sandbox as it was (the mismatches) or refuses again.
func TestClaimRefuses(t *testing.T) {
	e := newEnv(t)
	if !pooling(t, e) {
		return
	}
	lim := defaultLimits
	lim.Deadline = time.Minute
	src := e.source(t, nil)
	sb := e.warm(t, Spec{Limits: lim})
	job := func(f func(*Spec)) Spec {
		s := Spec{ID: "claimer", Class: ClassRunc, Source: src, Command: IdleCommand, Limits: lim}
		if f != nil {
			f(&s)
		}
		return s
	}
	for name, spec := range map[string]Spec{
		"another user":   job(func(s *Spec) { s.User = runspec.User{UID: 1000, GID: 1000} }),
		"another disk":   job(func(s *Spec) { s.Limits.DiskBytes *= 2 }),
		"another shm":    job(func(s *Spec) { s.Limits.MemoryBytes = 32 << 20 }),
		"another netns":  job(func(s *Spec) { s.NetNS = "/proc/self/ns/net" }),
		"caches":         job(func(s *Spec) { s.Caches = []CacheMount{{Path: "/root/.cache", Lower: t.TempDir()}} }),
		"a pooled name":  job(func(s *Spec) { s.ID = PoolPrefix + "x" }),
		"a missing path": job(func(s *Spec) { s.Source = "/nonexistent" }),
	} {
		if err := sb.Claim(spec); err == nil {
			t.Errorf("a claim by %s was taken", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(sb.dir, claimFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused claim wrote the claim file: %v", err)
	}
	if err := sb.Claim(job(nil)); err != nil {
		t.Fatalf("the shape's claim after the refusals: %v", err)
	}
	if err := sb.Claim(job(func(s *Spec) { s.ID = "second" })); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a second claim: %v", err)
	}

	// A sandbox not pooled.
	plain, err := e.m.Create(context.Background(), job(func(s *Spec) { s.ID = "plain" }))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Destroy()
	if err := plain.Claim(job(nil)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a claim of a sandbox not pooled: %v", err)
	}

	// Its init killed while it waited.
	dead := e.warm(t, Spec{Limits: lim})
	if err := e.m.cg.kill(dead.cgRel, killWait); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the runtime to exit", 10*time.Second, func() bool {
		select {
		case <-dead.warm.done:
			return true
		default:
			return false
		}
	})
	if err := dead.Claim(job(nil)); !errors.Is(err, errNotRunning) {
		t.Errorf("a claim of a sandbox whose init died: %v", err)
	}

	tiny := lim
	tiny.MemoryBytes = 1 << 20
	for _, c := range []struct {
		ws   WarmSpec
		want string
	}{
		{WarmSpec{Name: "job-id", Class: ClassRunc, Limits: lim}, "warm.name"},
		{WarmSpec{Name: PoolPrefix, Class: ClassRunc, Limits: lim}, "warm.name"},
		{WarmSpec{Name: PoolPrefix + "a_b", Class: ClassRunc, Limits: lim}, "warm.name"},
		{WarmSpec{Name: PoolPrefix + "gv", Class: ClassRunsc, Limits: lim}, "warm.class"},
		{WarmSpec{Name: PoolPrefix + "tiny", Class: ClassRunc, Limits: tiny}, "warm.limits."},
		{WarmSpec{Name: PoolPrefix + "user", Class: ClassRunc, Limits: lim, User: runspec.User{UID: runspec.MaxUserID + 1}}, "warm.user"},
		{WarmSpec{Name: PoolPrefix + "netns", Class: ClassRunc, Limits: lim, NetNS: "/nonexistent"}, "net_ns"},
	} {
		sb, err := e.m.Warm(context.Background(), c.ws)
		if err == nil {
			sb.Destroy()
			t.Errorf("Warm(%+v) was taken", c.ws)
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Warm(%+v): %v, want an invalid argument naming %s", c.ws, err, c.want)
		}
	}
}

// TestWarmRecover: after an executor's crash, Recover removes a pooled
// sandbox no job claimed without reporting it, and reports (and keeps,
// when asked) a claimed one under its job's id.
func TestWarmRecover(t *testing.T) {
	e := newEnv(t)
	if !pooling(t, e) {
		return
	}
	lim := defaultLimits
	lim.Deadline = time.Minute
	idle, err := e.m.Warm(context.Background(), WarmSpec{Name: PoolPrefix + "idle", Class: ClassRunc, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	claimedSb, err := e.claimed(context.Background(), Spec{ID: "kept-job", Class: ClassRunc, Source: e.source(t, nil), Command: IdleCommand, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(claimedSb.UpperDir(), "work-file"), []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A new Manager on the same state, as the next executor process.
	m, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Recover(context.Background(), func(id string) bool { return id == "kept-job" })
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if !slices.Equal(got, []string{"kept-job"}) {
		t.Errorf("Recover reported %v, want [kept-job]", got)
	}
	// Killed, and out of their cgroups: gone in a moment.
	waitFor(t, "the killed sandboxes' processes to be gone", 5*time.Second, func() bool { return len(procsInUIDRange(e.cfg.UIDBase)) == 0 })
	if !m.Kept("kept-job") {
		t.Errorf("the claimed session's scratch was not kept under its job's id")
	}
	if err := m.DiscardKept("kept-job"); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)
	// The crashed process's handles, which a real crash has no more.
	for _, sb := range []*Sandbox{idle, claimedSb} {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy after Recover: %v", err)
		}
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
}

// TestClaimedJobParity: a batch job in a claimed pooled sandbox (its
// command the sandbox's main exec, through the exec helper) ends as the
// same job does in a sandbox made for it: the same reason, status, output
// and environment, as root and as another user; a command not found or not
// executable, a signal, a background process left holding the output
// (the job ends with its command, as a container's init), the deadline,
// the memory limit and the disk limit.
func TestClaimedJobParity(t *testing.T) {
	e := newEnv(t)
	if !pooling(t, e) {
		return
	}
	src := e.source(t, map[string]string{"README": "parity\n"})
	lim := func(f func(*Limits)) *Limits {
		l := defaultLimits
		if f != nil {
			f(&l)
		}
		return &l
	}
	sh := func(script string) []string { return []string{"/bin/sh", "-c", script} }
	agent := runspec.User{UID: 1000, GID: 1000}
	for _, tc := range []struct {
		name   string
		cmd    []string
		user   runspec.User
		limits *Limits
		// same compares stdout byte for byte; else only the reason and
		// status are compared.
		same bool
	}{
		{"status and streams", sh("echo out; echo err >&2; cat /work/README; exit 3"), runspec.User{}, nil, true},
		{"identity and environment", sh(`id; pwd; echo "$HOME"; umask; ulimit -a; env | sort; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status`), runspec.User{}, nil, true},
		{"as agent", sh(`id; pwd; echo "$HOME"; touch /work/mine && ls -n /work/mine | cut -d' ' -f3,4; env | sort; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status`), agent, nil, true},
		{"not found", []string{"no-such-command"}, runspec.User{}, nil, false},
		{"not executable", []string{"/work/README"}, runspec.User{}, nil, false},
		{"background left running", sh("(sleep 300; echo late) & echo early"), runspec.User{}, nil, true},
		{"deadline", sh("echo started; sleep 300"), runspec.User{}, lim(func(l *Limits) { l.Deadline = 2 * time.Second }), true},
		{"memory", []string{"/work/probe", "balloon", "512"}, runspec.User{}, lim(func(l *Limits) { l.MemoryBytes = 64 << 20 }), false},
		{"disk", sh("dd if=/dev/zero of=/tmp/big bs=1M count=200 2>/dev/null; echo wrote"), runspec.User{}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cold := e.run(t, ctx, job{src: src, cmd: tc.cmd, user: tc.user, limits: tc.limits})
			began := time.Now()
			warm := e.run(t, ctx, job{src: src, cmd: tc.cmd, user: tc.user, limits: tc.limits, claimed: true})
			took := time.Since(began)
			if cold.err != nil || warm.err != nil {
				t.Fatalf("cold %v, claimed %v", cold.err, warm.err)
			}
			if cold.res.Reason != warm.res.Reason || cold.res.ExitCode != warm.res.ExitCode {
				t.Errorf("cold ended %s %d (%s), claimed %s %d (%s)", cold.res.Reason, cold.res.ExitCode, cold.res.Message,
					warm.res.Reason, warm.res.ExitCode, warm.res.Message)
			}
			if tc.same && (cold.stdout != warm.stdout || cold.stderr != warm.stderr) {
				t.Errorf("output differs:\ncold stdout %q\nclaimed stdout %q\ncold stderr %q\nclaimed stderr %q", cold.stdout, warm.stdout, cold.stderr, warm.stderr)
			}
			if tc.name == "background left running" && took > 10*time.Second {
				t.Errorf("a claimed job whose command exited took %v: it waited on the process it left", took)
			}
			if !strings.HasPrefix(warm.sb.Name(), PoolPrefix) {
				t.Errorf("the claimed run's sandbox is %s", warm.sb.Name())
			}
		})
	}
	// The one difference: a claimed job's command is not its PID
	// namespace's init, so a signal it sends itself, which the kernel
	// drops for an init with no handler, kills it as it would anywhere
	// else.
	cold := e.run(t, context.Background(), job{src: src, cmd: sh("kill -9 $$")})
	warm := e.run(t, context.Background(), job{src: src, cmd: sh("kill -9 $$"), claimed: true})
	if cold.res.ExitCode != 0 || warm.res.ExitCode != 128+9 {
		t.Errorf("a job's SIGKILL to itself: %d as init, %d claimed; want 0 and 137", cold.res.ExitCode, warm.res.ExitCode)
	}
}

// TestWarmStartFails: a pooled sandbox whose runtime cannot start is
// removed, and Warm says why, at once: nothing waits for a Run that never
// began, and nothing of it is left.
func TestWarmStartFails(t *testing.T) {
	e := newEnv(t)
	if !pooling(t, e) {
		return
	}
	if _, ok := e.m.Available(ClassRunc); !ok {
		t.Fatal("runc unavailable")
	}
	rt := e.m.runtimes[ClassRunc]
	path := rt.path
	rt.path = filepath.Join(t.TempDir(), "no-runc")
	defer func() { rt.path = path }()
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Warm(context.Background(), WarmSpec{Name: PoolPrefix + "broken", Class: ClassRunc, Limits: defaultLimits})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no-runc") {
			t.Errorf("Warm with a runtime that cannot start: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Warm hangs when its runtime cannot start")
	}
	rt.path = path
	e.assertClean(t)
}
