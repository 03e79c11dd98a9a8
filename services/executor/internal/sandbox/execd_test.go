package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// wantExecHelper asserts the exec path e's manager chose is the one this
// kernel calls for — the helper on Linux 6.15 or newer (PIDFD_INFO_EXIT),
// `runc exec` before — and reports whether it is the helper. Both ways
// the tests that call it then check that path.
func wantExecHelper(t *testing.T, e *env) bool {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", release, err)
	}
	want := major > 6 || major == 6 && minor >= 15
	got, why := e.m.ExecHelper()
	if got != want {
		t.Fatalf("Linux %s: exec helper used=%t (%s), want %t", release, got, why, want)
	}
	t.Logf("Linux %s: exec helper used=%t %s", release, got, why)
	return got
}

// TestExecHelperKernel: the manager uses the helper exactly when the
// kernel reads a pidfd's exit status, and a binary that is not the helper
// is refused before any exec needs it.
func TestExecHelperKernel(t *testing.T) {
	e := newEnv(t)
	wantExecHelper(t, e)
	if why := checkExecd("/bin/true"); !strings.Contains(why, "probe mode") {
		t.Fatalf("checkExecd(/bin/true) = %q, want a refusal of its exit status", why)
	}
	if why := checkExecd(filepath.Join(t.TempDir(), "none")); why == "" {
		t.Fatal("checkExecd of a missing binary passed")
	}
}

// helperPids lists, from inside sb, the pids of processes with the exec
// helper's capabilities (CAP_SETUID and CAP_SETGID permitted, nothing else).
func helperPids(t *testing.T, sb *Sandbox) []string {
	t.Helper()
	r := runExec(t, context.Background(), sb, ExecSpec{Argv: []string{"sh", "-c",
		`for s in /proc/[0-9]*/status; do grep -q '^CapPrm:[[:space:]]*00000000000000c0$' $s 2>/dev/null && basename $(dirname $s); done; true`}})
	if r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("list the helper: %+v %v", r.res, r.err)
	}
	return strings.Fields(r.stdout)
}

// TestExecHelperBoundary attacks the exec path from a job's side, as root
// in the sandbox (the default user, the helper's own uid): exec 1 finds the
// exec helper, tries to trace it, read or write its memory, get at its
// socket or any named socket, leaves a process writing to its own output
// forever, and kills the helper. Every later exec's status and output must
// be its own. Under runsc, whose execs start from outside the sandbox
// (runsc exec), there is no helper to attack: the writer left behind and
// the later execs' own status and output are checked.
func TestExecHelperBoundary(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, nil)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			sb, _ := e.session(t, c, src)
			ctx := context.Background()
			if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"true"}}); r.err != nil || r.res.ExitCode != 0 {
				t.Fatalf("first exec: %+v %v", r.res, r.err)
			}
			target := ""
			if c == ClassRunc && !wantExecHelper(t, e) {
				// An older kernel: execs start with runc exec, and no
				// helper runs in the sandbox.
				if pids := helperPids(t, sb); len(pids) != 0 {
					t.Fatalf("processes with the helper's capabilities on a kernel without PIDFD_INFO_EXIT: %v", pids)
				}
			} else if c == ClassRunc {
				pids := helperPids(t, sb)
				if len(pids) != 1 {
					t.Fatalf("processes with the helper's capabilities: %v, want one", pids)
				}
				target = pids[0]
			}
			script := `setsid sh -c 'trap "" PIPE; while :; do echo FORGED; echo FORGED >&2; sleep 0.01; done' &
if [ -n "$1" ]; then
	/work/probe tamper "$1"; echo tamper=$?
	kill -9 "$1"; echo kill=$?
fi
echo exec1 done`
			r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", script, "attack", target}})
			if r.err != nil || r.res.Reason != ReasonExited || r.res.ExitCode != 0 {
				t.Fatalf("the attacking exec: %+v %v", r.res, r.err)
			}
			if strings.Contains(r.stdout, "ALLOWED") || (target != "" && !strings.Contains(r.stdout, "tamper=0\n")) {
				t.Fatalf("the job got at the exec path's process %s:\n%s", target, r.stdout)
			}
			if target != "" && !strings.Contains(r.stdout, "kill=0\n") {
				t.Fatalf("the job could not kill the helper (the test means to): %s", r.stdout)
			}
			for i := range 3 {
				r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `echo "mine $0"; echo "err $0" >&2; exit 5`, fmt.Sprint(i)}})
				if r.err != nil || r.res.Reason != ReasonExited || r.res.ExitCode != 5 {
					t.Fatalf("exec %d after the attack: %+v %v, want exited 5", i+2, r.res, r.err)
				}
				if r.stdout != fmt.Sprintf("mine %d\n", i) || r.stderr != fmt.Sprintf("err %d\n", i) {
					t.Fatalf("exec %d after the attack: stdout %q stderr %q, want its own output alone", i+2, r.stdout, r.stderr)
				}
			}
			if target != "" {
				// A new helper serves the session: the killed one is gone.
				if pids := helperPids(t, sb); len(pids) != 1 || pids[0] == target {
					t.Fatalf("helpers after the kill: %v (killed %s)", pids, target)
				}
			}
		})
	}
}

// TestExecHelperFallback: a session whose helper cannot start (its binary
// is not there) still execs, through the runtime.
func TestExecHelperFallback(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ExecdPath = "/nonexistent/airlock-execd" })
	if ok, why := e.m.ExecHelper(); ok || !strings.Contains(why, "/nonexistent/airlock-execd") {
		t.Fatalf("ExecHelper() = %t, %q; want the missing helper named", ok, why)
	}
	sb, _ := e.session(t, ClassRunc, e.source(t, nil))
	r := runExec(t, context.Background(), sb, ExecSpec{Argv: []string{"sh", "-c", "echo hi; exit 4"}})
	if r.err != nil || r.res.ExitCode != 4 || r.stdout != "hi\n" {
		t.Fatalf("exec without a helper: %+v %v %q", r.res, r.err, r.stdout)
	}
}

// TestExecHelperGivesUp: a helper that passed the start-up check but
// cannot start in a session (here its binary is gone since) is tried a
// bounded number of times; the session's execs go through runc exec.
func TestExecHelperGivesUp(t *testing.T) {
	e := newEnv(t)
	if !wantExecHelper(t, e) {
		return
	}
	e.m.cfg.ExecdPath = filepath.Join(t.TempDir(), "gone")
	sb, _ := e.session(t, ClassRunc, e.source(t, nil))
	for i := range execdMaxFails + 3 {
		r := runExec(t, context.Background(), sb, ExecSpec{Argv: []string{"sh", "-c", "echo hi; exit 4"}})
		if r.err != nil || r.res.ExitCode != 4 || r.stdout != "hi\n" {
			t.Fatalf("exec %d: %+v %v %q", i, r.res, r.err, r.stdout)
		}
	}
	sb.execdMu.Lock()
	fails := sb.execdFails
	sb.execdMu.Unlock()
	if fails != execdMaxFails {
		t.Fatalf("the helper's start was tried %d times, want %d", fails, execdMaxFails)
	}
}

// TestExecMake is real work through the exec path: make compiling and
// linking a threaded C program, which then runs.
func TestExecMake(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, map[string]string{
		"Makefile": "CFLAGS = -O2 -pthread\n\nsum: main.o sum.o\n\t$(CC) $(CFLAGS) -o $@ $^\n\n%.o: %.c\n\t$(CC) $(CFLAGS) -c -o $@ $<\n",
		"sum.c":    "long sum(long from, long to) { long s = 0; for (long i = from; i < to; i++) s += i; return s; }\n",
		"main.c": `#include <pthread.h>
#include <stdio.h>
long sum(long, long);
static long part[8];
static void *run(void *arg) { long i = (long)arg; part[i] = sum(i * 1000000, (i + 1) * 1000000); return 0; }
int main(void) {
	pthread_t th[8];
	for (long i = 0; i < 8; i++) pthread_create(&th[i], 0, run, (void *)i);
	long total = 0;
	for (int i = 0; i < 8; i++) { pthread_join(th[i], 0); total += part[i]; }
	printf("sum=%ld\n", total);
	return 0;
}
`,
	})
	sb, _ := e.session(t, ClassRunc, src)
	ctx := context.Background()
	if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"make", "-j4"}}); r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("make: %+v %v\n%s", r.res, r.err, r.stderr)
	}
	r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"./sum"}})
	if want := fmt.Sprintf("sum=%d\n", int64(8000000)*7999999/2); r.err != nil || r.res.ExitCode != 0 || r.stdout != want {
		t.Fatalf("./sum: %+v %v %q, want %q", r.res, r.err, r.stdout, want)
	}
}

// execdConnOf is sb's current helper, or nil.
func execdConnOf(sb *Sandbox) *execdConn {
	sb.execdMu.Lock()
	defer sb.execdMu.Unlock()
	return sb.execd
}

// TestExecHelperLifecycle: a session's helper is up before its first exec
// (started with the sandbox), serves that exec, survives being stopped by
// the job (SIGSTOP: one exec fails as a sandbox error, bounded, and a new
// helper serves the next), leaks no executor fd over 200 execs, and is
// gone with the sandbox's Run.
func TestExecHelperLifecycle(t *testing.T) {
	e := newEnv(t)
	if !wantExecHelper(t, e) {
		return // the kernel's fallback; wantExecHelper asserted it
	}
	sb, stop := e.session(t, ClassRunc, e.source(t, nil))
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	var pre *execdConn
	for pre = execdConnOf(sb); pre == nil; pre = execdConnOf(sb) {
		if time.Now().After(deadline) {
			t.Fatal("no exec helper 30 s after the session started, before any exec")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"true"}}); r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("first exec: %+v %v", r.res, r.err)
	}
	if got := execdConnOf(sb); got != pre {
		t.Fatal("the first exec started a helper of its own; want the one started with the sandbox")
	}

	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	for i := range 200 {
		var out syncBuffer
		x := ExecSpec{Argv: []string{"sh", "-c", `read l; echo "$l $0"`, fmt.Sprint(i)}, Stdin: strings.NewReader("in\n"), Stdout: &out, Stderr: io.Discard}
		if res, err := sb.Exec(ctx, x); err != nil || res.ExitCode != 0 || out.String() != fmt.Sprintf("in %d\n", i) {
			t.Fatalf("exec %d: %+v %v %q", i, res, err, out.String())
		}
	}
	after := fds()
	for end := time.Now().Add(2 * time.Second); after > before && time.Now().Before(end); after = fds() {
		time.Sleep(50 * time.Millisecond) // an output copier closing its end
	}
	if after > before {
		t.Fatalf("executor fds: %d before 200 execs, %d after", before, after)
	}

	pids := helperPids(t, sb)
	if len(pids) != 1 {
		t.Fatalf("helpers: %v, want one", pids)
	}
	// From the background, once this exec has ended: the helper reaps
	// its commands, so one it stops while running cannot end well.
	if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `setsid sh -c 'sleep 0.3; kill -STOP "$0"' "$0" >/dev/null 2>&1 &`, pids[0]}}); r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("stop the helper: %+v %v", r.res, r.err)
	}
	time.Sleep(time.Second)
	start := time.Now()
	r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "exit 3"}})
	if r.err != nil || r.res.Reason != ReasonSandboxError || time.Since(start) > execdReplyWait+5*time.Second {
		t.Fatalf("an exec through a stopped helper: %+v %v after %s, want a sandbox error within %s", r.res, r.err, time.Since(start), execdReplyWait)
	}
	if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "exit 3"}}); r.err != nil || r.res.Reason != ReasonExited || r.res.ExitCode != 3 {
		t.Fatalf("the exec after: %+v %v, want exited 3", r.res, r.err)
	}
	if got := helperPids(t, sb); len(got) != 1 || got[0] == pids[0] {
		t.Fatalf("helpers after the stopped one: %v (stopped %s)", got, pids[0])
	}
	c := execdConnOf(sb)
	stop()
	if execdConnOf(sb) != nil || !c.dead {
		t.Fatal("the helper outlived the sandbox's Run")
	}
}

// TestExecHelperParity: what an exec promises comes out the same through
// the helper as through `runc exec`: exit statuses (a signal's too), a
// command that cannot be found or executed, stdin, env, cwd, the user.
func TestExecHelperParity(t *testing.T) {
	e := newEnv(t)
	if !wantExecHelper(t, e) {
		return
	}
	rt := newEnv(t, func(c *Config) { c.ExecdPath = "" })
	cases := []ExecSpec{
		{Argv: []string{"sh", "-c", "exit 7"}},
		{Argv: []string{"sh", "-c", "kill -9 $$"}},
		{Argv: []string{"sh", "-c", "kill -TERM $$"}},
		{Argv: []string{"no-such-command"}},
		{Argv: []string{"/no/such/file"}},
		{Argv: []string{"/etc/passwd"}},
		{Argv: []string{"/work"}},
		{Argv: []string{"sh", "-c", `echo "$FOO|$(pwd)|$(id -u):$(id -g)|$(cat)"`}, Env: map[string]string{"FOO": "bar baz"}, Cwd: "/tmp", Stdin: strings.NewReader("from stdin")},
		{Argv: []string{"pwd"}},
		{Argv: []string{"ls", "/proc/self/fd"}}, // 0 1 2 and ls's own: nothing of the helper's
		{Argv: []string{"pwd"}, Cwd: "/no/such/dir"},
	}
	type outcome struct {
		Reason   Reason
		ExitCode int
		Stdout   string
		Err      bool
	}
	run := func(env *env, x ExecSpec) outcome {
		sb, _ := env.session(t, ClassRunc, env.source(t, nil))
		if s, ok := x.Stdin.(*strings.Reader); ok {
			x.Stdin = strings.NewReader(func() string { b, _ := io.ReadAll(s); s.Seek(0, io.SeekStart); return string(b) }())
		}
		r := runExec(t, context.Background(), sb, x)
		return outcome{r.res.Reason, r.res.ExitCode, r.stdout, r.err != nil}
	}
	for _, x := range cases {
		want, got := run(rt, x), run(e, x)
		if got != want {
			t.Errorf("%q (cwd %q): through the helper %+v, through runc exec %+v", x.Argv, x.Cwd, got, want)
		}
	}
}
