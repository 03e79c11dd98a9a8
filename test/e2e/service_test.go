//go:build linux

package e2e

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The one way the e2e tests kill, stop and start a service of the stack
// as an operator (or the kernel) would: killService, startService, and
// stack.restartService (restart_test.go) built on them.

// serviceProc is one run of a service: the process `dev up` started (cmd
// nil: reaped by pid) or one the test started (cmd set, reaped by
// cmd.Wait, whose result goes to exited).
type serviceProc struct {
	name   string
	pid    int
	cmd    *exec.Cmd
	exited chan error
	dead   bool
	log    string // its log, when the test started it
}

// killService SIGKILLs p and reaps it, failing the test unless it died of
// that very signal: a service that exited by itself meanwhile crashed.
// With group set the signal goes to the process group p leads (its own
// session's), so the git it runs dies with it, as when a container or a
// service unit is killed; without, p dies alone, as when the OOM killer
// picks it, and its children run on. Either way they are this process's
// to reap (see reapOrphans).
func killService(t *testing.T, s *stack, p *serviceProc, group bool) {
	t.Helper()
	target := p.pid
	if group {
		target = -p.pid
	}
	if err := syscall.Kill(target, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s (pid %d, group %v): %v", p.name, p.pid, group, err)
	}
	var ws syscall.WaitStatus
	if p.cmd == nil {
		uws, err := reap(p.pid, stopTimeout)
		if err != nil {
			t.Fatalf("reap the killed %s: %v", p.name, err)
		}
		ws = syscall.WaitStatus(uws)
	} else {
		select {
		case err := <-p.exited:
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("%s (pid %d) ended with %v, want death by SIGKILL", p.name, p.pid, err)
			}
			ws = ee.Sys().(syscall.WaitStatus)
		case <-time.After(stopTimeout):
			t.Fatalf("%s (pid %d) still there %v after SIGKILL", p.name, p.pid, stopTimeout)
		}
	}
	p.dead = true
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s (pid %d) ended with %v, want death by SIGKILL; log:\n%s", p.name, p.pid, ws, lastLines(cmp.Or(p.log, s.services[p.name].Log), 20))
	}
	if st := procState(p.pid); st != "" {
		t.Fatalf("killed %s (pid %d) still in the process table (state %s)", p.name, p.pid, st)
	}
}

// proc returns the running process of service name: the one a test
// started (its Wait is this process's) or else the one `dev up` started.
func (s *stack) proc(name string) *serviceProc {
	pid := s.services[name].PID
	if p, ok := s.procs[pid]; ok {
		return p
	}
	return &serviceProc{name: name, pid: pid}
}

// startService starts service name again from the stack's config, its log
// appended, in its own session, records its pid in the pid file (so `dev
// down` would stop it) and registers its graceful stop, which must exit 0,
// in t.Cleanup. Unless ready is nil it returns once ready succeeds, tried
// every poll, failing the test if the service exits first or is not ready
// within readyWithin.
func startService(t testing.TB, s *stack, name string, poll time.Duration, ready func() error) *serviceProc {
	t.Helper()
	svc, ok := s.services[name]
	if !ok {
		t.Fatalf("no service %q in the stack", name)
	}
	p := startProcess(t, t, name, []string{bin(name), "--config", svc.Config}, svc.Log, nil)
	if s.procs == nil {
		s.procs = map[int]*serviceProc{}
	}
	s.procs[p.pid] = p
	pidFile := filepath.Join(s.dir, name, name+".pid")
	if err := os.WriteFile(pidFile, []byte(fmt.Sprintf("%d\n", p.pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	svc.PID = p.pid
	s.services[name] = svc
	if ready != nil {
		p.waitReady(t, svc.DataDir, svc.Log, poll, ready)
	}
	return p
}

// startProcess starts argv as service name, its output appended to log,
// in its own session, and registers its graceful stop, which must exit 0,
// in owner's Cleanup (t's, or a parent test's for a process that outlives
// the subtest t that starts it). With enter set the process is started
// inside what enter runs its function in (a network namespace:
// nettest.Host.Do).
func startProcess(t, owner testing.TB, name string, argv []string, log string, enter func(func() error) error) *serviceProc {
	t.Helper()
	logf, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if enter == nil {
		err = cmd.Start()
	} else {
		err = enter(cmd.Start)
	}
	logf.Close()
	if err != nil {
		t.Fatal(err)
	}
	p := &serviceProc{name: name, pid: cmd.Process.Pid, cmd: cmd, exited: make(chan error, 1), log: log}
	go func() { p.exited <- cmd.Wait() }()
	owner.Cleanup(func() {
		// A service killed or stopped meanwhile (say by a later restart)
		// was reaped by whoever did it.
		if p.dead {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.exited:
			if err != nil {
				owner.Errorf("cleanup: started %s (pid %d): %v, want a clean exit 0", name, p.pid, err)
			}
		case <-time.After(stopTimeout):
			_ = cmd.Process.Kill()
			<-p.exited
			owner.Errorf("cleanup: started %s (pid %d) still ran %v after SIGTERM; killed", name, p.pid, stopTimeout)
		}
		p.dead = true
	})
	return p
}

// readyWithin is how long a started service may take to be ready. A
// service's start first recovers what its last run left, and an executor's
// recovery waits on the kernel: up to 5s for a runtime process and for
// each job cgroup to die, up to 30s for a kept session's loop device to be
// released, and on file system calls, which a host busy writing back
// (CI's, beside the sandbox tests) can stall for many seconds. A budget of
// 20s once failed an executor's restart in CI.
const readyWithin = time.Minute

// waitReady returns once ready succeeds, tried every poll, failing the test
// if the service exits first or is not ready within readyWithin; then it
// shows what the service was doing (stacks).
func (p *serviceProc) waitReady(t testing.TB, dataDir, log string, poll time.Duration, ready func() error) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(poll) {
		select {
		case err := <-p.exited:
			p.dead = true
			t.Fatalf("started %s exited at once (%v); processes holding its data directory's lock: %v; log:\n%s",
				p.name, err, lockHolders(filepath.Join(dataDir, ".lock")), lastLines(log, 20))
		default:
		}
		err := ready()
		if err == nil {
			return
		}
		if time.Since(start) > readyWithin {
			t.Fatalf("started %s still not ready after %v: %v\nlog:\n%s\n%s", p.name, readyWithin, err, lastLines(log, 20), p.stacks(log))
		}
	}
}

// stacks shows what a service that is not ready is doing: the kernel's
// view of each of its threads (a call blocked in the kernel shows only
// there), then, once SIGQUIT has ended it (a Go program writes every
// goroutine's stack to its stderr, p's log, on SIGQUIT), the goroutines
// that run the project's code. At most stacksMax bytes of it.
func (p *serviceProc) stacks(log string) string {
	var b strings.Builder
	b.WriteString(threadsOf(p.pid))
	fi, err := os.Stat(log)
	if err != nil {
		return b.String() + err.Error()
	}
	if err := syscall.Kill(p.pid, syscall.SIGQUIT); err != nil {
		return b.String() + fmt.Sprintf("SIGQUIT %s (pid %d): %v", p.name, p.pid, err)
	}
	select {
	case <-p.exited:
		p.dead = true
	case <-time.After(stopTimeout):
		// A thread stuck in the kernel writes its part late, if at all.
		fmt.Fprintf(&b, "%s (pid %d) still ran %v after SIGQUIT; its log so far:\n", p.name, p.pid, stopTimeout)
	}
	f, err := os.Open(log)
	if err != nil {
		return b.String() + err.Error()
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, fi.Size(), 64<<20))
	if err != nil {
		return b.String() + err.Error()
	}
	var ours []string
	for _, g := range strings.Split(string(data), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && strings.Contains(g, "github.com/airlockhq/airlock/") {
			ours = append(ours, g)
		}
	}
	fmt.Fprintf(&b, "%s's goroutines running the project's code at SIGQUIT (%d):\n%s", p.name, len(ours), strings.Join(ours, "\n\n"))
	if b.Len() > stacksMax {
		return b.String()[:stacksMax] + "\n[cut]"
	}
	return b.String()
}

// stacksMax bounds what stacks returns.
const stacksMax = 64 << 10

// threadsOf lists pid's threads as the kernel sees them: state, the
// kernel function a sleeping one waits in, its system call, and the
// kernel stack of one in uninterruptible sleep (D).
func threadsOf(pid int) string {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err.Error() + "\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "threads of pid %d (state, wchan, syscall):\n", pid)
	for _, e := range ents {
		read := func(name string) string {
			data, _ := os.ReadFile(filepath.Join(dir, e.Name(), name))
			return cmp.Or(strings.TrimSpace(string(data)), "?")
		}
		stat := read("stat")
		state := "?"
		if i := strings.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
			state = stat[i+2 : i+3]
		}
		fmt.Fprintf(&b, "  %s %s %s %s\n", e.Name(), state, read("wchan"), strings.Fields(read("syscall"))[0])
		if state == "D" {
			b.WriteString("    " + strings.ReplaceAll(read("stack"), "\n", "\n    ") + "\n")
		}
	}
	return b.String()
}
