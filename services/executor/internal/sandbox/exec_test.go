package sandbox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// session starts a sandbox running IdleCommand and returns it with a
// function that stops it and returns Run's result.
func (e *env) session(t *testing.T, c Class, src string) (*Sandbox, func() Result) {
	t.Helper()
	id := fmt.Sprintf("sess-%d", testSeq.Add(1))
	lim := defaultLimits
	lim.Deadline = 2 * time.Minute
	sb, err := e.m.Create(context.Background(), Spec{ID: id, Class: c, Source: src, Command: IdleCommand, Limits: lim})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	run := background(t, sb)
	var once sync.Once
	var res Result
	stop := func() Result {
		once.Do(func() {
			res = run()
			if err := sb.Destroy(); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		})
		return res
	}
	t.Cleanup(func() { stop() })
	return sb, stop
}

// background runs sb until the returned stop, which cancels the run and
// returns its result (the same on every call).
func background(t *testing.T, sb *Sandbox) func() Result {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result, 1)
	go func() {
		res, err := sb.Run(ctx)
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		done <- res
	}()
	var once sync.Once
	var res Result
	return func() Result {
		once.Do(func() { cancel(); res = <-done })
		return res
	}
}

type execRan struct {
	res            ExecResult
	err            error
	stdout, stderr string
}

func runExec(t *testing.T, ctx context.Context, sb *Sandbox, x ExecSpec) execRan {
	t.Helper()
	var out, errb syncBuffer
	x.Stdout, x.Stderr = &out, &errb
	res, err := sb.Exec(ctx, x)
	r := execRan{res: res, err: err, stdout: out.String(), stderr: errb.String()}
	t.Logf("exec %v: reason=%s exit=%d msg=%q wall=%s err=%v\nstdout: %s\nstderr: %s", x.Argv, res.Reason, res.ExitCode, res.Message, res.WallTime, err, trunc(r.stdout), trunc(r.stderr))
	return r
}

// countProcs counts, from inside, the processes whose command line is one
// of its arguments.
const countProcs = `n=0; for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); for w in "$@"; do [ "$c" = "$w " ] && n=$((n+1)); done; done; echo $n`

// TestExec drives a session's sandbox as an agent does: state carries from
// one exec to the next, stdin and exit statuses arrive, a timeout or a
// cancel stops exactly the exec's process group while the sandbox and a
// background exec live on, and stopping the sandbox ends the execs in it.
func TestExec(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, map[string]string{"README": "hello\n"})
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			sb, stop := e.session(t, c, src)
			ctx := context.Background()

			r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `echo out; echo err >&2; cat; echo "$GREETING" "$PWD"; exit 3`},
				Env: map[string]string{"GREETING": "hi"}, Cwd: "/tmp", Stdin: strings.NewReader("from stdin\n")})
			if r.err != nil || r.res.Reason != ReasonExited || r.res.ExitCode != 3 {
				t.Fatalf("first exec: %+v %v, want exited 3", r.res, r.err)
			}
			if r.stdout != "out\nfrom stdin\nhi /tmp\n" || r.stderr != "err\n" {
				t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
			}
			if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "echo edited >> README; echo state > /tmp/s"}}); r.res.ExitCode != 0 {
				t.Fatalf("edit: %+v", r.res)
			}
			if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"cat", "/work/README", "/tmp/s"}}); r.stdout != "hello\nedited\nstate\n" {
				t.Fatalf("state did not carry from one exec to the next: %q", r.stdout)
			}
			// A process that keeps stdin open unread, left in the
			// background: the exec still ends when its command does.
			r = runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "exec 3<&0; sleep 1000 & echo bye"}, Stdin: strings.NewReader(strings.Repeat("x", 512<<10))})
			if r.err != nil || r.res.ExitCode != 0 || r.res.WallTime > 10*time.Second {
				t.Fatalf("an exec leaving unread stdin behind: %+v %v", r.res, r.err)
			}
			if c == ClassRunc {
				// Past the memory limit: the exec ends oom, the session
				// lives on. (Under runsc the kernel's OOM killer takes
				// gVisor's sentry, and so the whole session.)
				r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "head -c 400000000 /dev/zero | tail -n 1 > /dev/null"}})
				if r.err != nil || r.res.Reason != ReasonOOM {
					t.Fatalf("an exec past the memory limit: %+v %v", r.res, r.err)
				}
			}
			if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"no-such-command"}}); r.err != nil || r.res.ExitCode != 127 {
				t.Fatalf("a missing command: %+v %v, want exit 127", r.res, r.err)
			}

			// A background exec, running throughout.
			bgCtx, bgCancel := context.WithCancel(ctx)
			bg := make(chan execRan, 1)
			go func() {
				bg <- runExec(t, bgCtx, sb, ExecSpec{Argv: []string{"sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo up > /tmp/bg; while :; do sleep 0.1; done`}, KillGrace: 5 * time.Second})
			}()
			waitFor(t, "the background exec", 20*time.Second, func() bool {
				return runExec(t, ctx, sb, ExecSpec{Argv: []string{"cat", "/tmp/bg"}}).stdout == "up\n"
			})

			// A timeout kills the exec's whole process group, children
			// and grandchildren, and nothing else.
			r = runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", `sh -c 'sleep 300' & sleep 301 & echo started; wait`}, Timeout: 2 * time.Second})
			if r.err != nil || r.res.Reason != ReasonTimeout || r.stdout != "started\n" {
				t.Fatalf("timed-out exec: %+v %v", r.res, r.err)
			}
			if r.res.WallTime > 15*time.Second {
				t.Fatalf("the timed-out exec took %s", r.res.WallTime)
			}
			waitFor(t, "the timed-out exec's processes to go", 10*time.Second, func() bool {
				out := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", countProcs, "count", "sleep 300", "sleep 301"}}).stdout
				return out == "0\n"
			})
			select {
			case r := <-bg:
				t.Fatalf("the background exec ended with the timed-out one: %+v", r.res)
			default:
			}

			// Cancelling sends SIGTERM first: the exec's trap runs.
			bgCancel()
			r = <-bg
			if r.err != nil || r.res.Reason != ReasonCancelled || !strings.Contains(r.stdout, "got TERM") {
				t.Fatalf("cancelled exec: %+v %v stdout %q", r.res, r.err, r.stdout)
			}

			// Stopping the sandbox ends what runs in it.
			long := make(chan execRan, 1)
			go func() { long <- runExec(t, ctx, sb, ExecSpec{Argv: []string{"sleep", "300"}}) }()
			time.Sleep(500 * time.Millisecond)
			res := stop()
			if res.Reason != ReasonCancelled {
				t.Fatalf("the session's own result: %+v", res)
			}
			select {
			case r := <-long:
				if r.res.Reason != ReasonCancelled && r.err == nil {
					t.Fatalf("an exec in a stopped sandbox: %+v", r.res)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("an exec outlived its sandbox by 30 s")
			}
			if _, err := sb.Exec(ctx, ExecSpec{Argv: []string{"true"}}); err == nil {
				t.Fatal("Exec in a destroyed sandbox worked")
			}
		})
	}
}

func TestExecValidates(t *testing.T) {
	for _, x := range []ExecSpec{
		{},
		{Argv: []string{""}},
		{Argv: []string{"a\x00b"}},
		{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}},
		{Argv: []string{"true"}, Cwd: "work"},
		{Argv: []string{"true"}, Cwd: "/work/../etc"},
		{Argv: []string{"true"}, Timeout: -1},
	} {
		if err := x.validate(); err == nil {
			t.Errorf("%+v: accepted", x)
		}
	}
}

// TestRestart: a sandbox restarted after its Run keeps /work's changes and
// /out, and nothing else: /tmp, $HOME and processes are gone.
func TestRestart(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, map[string]string{"README": "hello\n"})
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			id := fmt.Sprintf("sess-%d", testSeq.Add(1))
			lim := defaultLimits
			lim.Deadline = 2 * time.Minute
			sb, err := e.m.Create(context.Background(), Spec{ID: id, Class: c, Source: src, Command: IdleCommand, Limits: lim})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := sb.Destroy(); err != nil {
					t.Errorf("Destroy: %v", err)
				}
			})
			runFor := func(f func()) Result {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan Result, 1)
				go func() { res, _ := sb.Run(ctx); done <- res }()
				f()
				cancel()
				return <-done
			}
			ctx := context.Background()
			runFor(func() {
				r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "echo kept >> README; mkdir -p /out/r; echo out > /out/r/x; echo t > /tmp/t; echo h > /root/h; (sleep 1000 &) ; echo ok"}})
				// The sleep it leaves running holds nothing open.
				if r.stdout != "ok\n" || r.res.Reason != ReasonExited || r.res.WallTime > 10*time.Second {
					t.Fatalf("setup: %+v %q", r.res, r.stderr)
				}
			})
			if err := sb.Restart(); err != nil {
				t.Fatalf("Restart: %v", err)
			}
			var after execRan
			runFor(func() {
				after = runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c",
					`cat /work/README /out/r/x; ls -A /tmp /root; for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000' || true`}})
			})
			if after.stdout != "hello\nkept\nout\n/root:\n\n/tmp:\n0\n" && after.stdout != "hello\nkept\nout\n/root:\n/tmp:\n0\n" {
				t.Fatalf("after Restart: %q", after.stdout)
			}
			if err := sb.Restart(); err != nil {
				t.Fatal(err)
			}
			if err := sb.Restart(); err == nil {
				t.Fatal("Restart of a sandbox not run since: allowed")
			}
		})
	}
}
