package execd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The fds the runtime passes the helper (--preserve-fds 2): its end of the
// socketpair, and its own binary, which it was started from
// (/proc/self/fd/4) and closes at once.
const (
	SockFD   = 3
	BinaryFD = 4
)

// Caps are the only capabilities the runtime starts the helper with:
// CAP_SETPCAP it uses at once to empty its bounding set (so no command it
// starts can regain anything), then drops; CAP_SETUID and CAP_SETGID it
// keeps, to switch each command to the job's user and groups.
var Caps = []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"}

// ProbeArg, as the helper's only argument, makes it exit ProbeStatus at
// once: the executor's check that the kernel reports a pidfd's exit status
// (sandbox.checkExecd).
const (
	ProbeArg    = "--probe-exit-status"
	ProbeStatus = 42
)

// Main is the helper: it serves requests on SockFD until the executor
// closes its end, and returns the process's exit status.
func Main() int {
	if len(os.Args) == 2 && os.Args[1] == ProbeArg {
		return ProbeStatus
	}
	// First of all: nothing in the sandbox (even its root, which has no
	// capabilities) may ptrace it or read its memory or fds.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail("prctl(PR_SET_DUMPABLE): %v", err)
	}
	unix.Close(BinaryFD)
	// No child inherits the socket.
	if _, err := unix.FcntlInt(SockFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fail("socket fd %d: %v", SockFD, err)
	}
	if err := dropCaps(); err != nil {
		_ = Send(SockFD, Response{Error: err.Error()})
		return fail("%v", err)
	}
	// Every command is a child of this process, reaped here as it ends
	// (one goroutine, not a thread per running command: threads count
	// against the sandbox's pids limit).
	go reap()
	// Ready, with a pidfd of itself: the executor's handle on it.
	self, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fail("pidfd_open(self): %v", err)
	}
	err = Send(SockFD, Response{Ready: true, Pid: os.Getpid()}, self)
	unix.Close(self)
	if err != nil {
		return fail("hello: %v", err)
	}
	for {
		var req Request
		fds, err := Recv(SockFD, &req)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0
		}
		if err != nil {
			return fail("read a request: %v", err)
		}
		resp, pidfd := start(req, fds)
		closeAll(fds)
		var out []int
		if pidfd >= 0 {
			out = []int{pidfd}
		}
		err = Send(SockFD, resp, out...)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if err != nil {
			return fail("answer: %v", err)
		}
	}
}

// reapMu keeps reap from reaping a child start has not yet opened a
// pidfd of; started wakes a reap that found no child to wait for.
var (
	reapMu  sync.Mutex
	started = make(chan struct{}, 1)
)

// reap reaps each child as it ends: it blocks in waitid for a child that
// has ended, without reaping it (WNOWAIT), then reaps under reapMu. The
// executor reads the exit status from the pidfd once the child is
// reaped, so the sooner the better: a blocked waitid wakes at once, where
// SIGCHLD through the Go runtime's signal handling took a few hundred
// microseconds.
func reap() {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOWAIT, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			<-started // none yet: wait for start to make one
			continue
		case err != nil:
			fmt.Fprintf(os.Stderr, "airlock-execd: waitid: %v\n", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		reapMu.Lock()
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 && !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		reapMu.Unlock()
	}
}

func fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "airlock-execd: "+format+"\n", args...)
	return 1
}

// dropCaps empties the bounding set, on every thread of the process (a
// fork may happen from any), and keeps only CAP_SETUID and CAP_SETGID.
func dropCaps() error {
	last := 63
	if data, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		fmt.Sscan(strings.TrimSpace(string(data)), &last)
	}
	for c := 0; c <= last; c++ {
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			return fmt.Errorf("drop capability %d from the bounding set: %v", c, e)
		}
	}
	if _, _, e := syscall.AllThreadsSyscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("clear the ambient set: %v", e)
	}
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	keep := uint32(1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID)
	data := &[2]unix.CapUserData{{Effective: keep, Permitted: keep}}
	_, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	runtime.KeepAlive(hdr)
	runtime.KeepAlive(data)
	if e != 0 {
		return fmt.Errorf("capset: %v", e)
	}
	return nil
}

// start forks req's command with fds as its stdin, stdout and stderr, in
// a session (and process group) of its own, as the request's user and
// groups, and returns a pidfd of it (-1 if it did not start).
func start(req Request, fds []int) (Response, int) {
	if len(fds) != 3 || len(req.Argv) == 0 {
		return Response{Error: fmt.Sprintf("a request needs an argv and 3 fds, got %d args and %d fds", len(req.Argv), len(fds))}, -1
	}
	prog, code, err := lookPath(req.Argv[0], req.Env)
	if err != nil {
		return Response{Error: err.Error(), Code: code}, -1
	}
	groups := make([]uint32, len(req.Groups))
	copy(groups, req.Groups)
	// The child is not reaped before its pidfd exists (its pid could be
	// reused): reap waits for reapMu.
	reapMu.Lock()
	defer reapMu.Unlock()
	pid, err := syscall.ForkExec(prog, req.Argv, &syscall.ProcAttr{
		Dir:   req.Cwd,
		Env:   req.Env,
		Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Credential: &syscall.Credential{Uid: req.UID, Gid: req.GID, Groups: groups},
		},
	})
	if err != nil {
		code := 126
		if errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		return Response{Error: fmt.Sprintf("exec: %q (cwd %s): %v", req.Argv[0], req.Cwd, err), Code: code}, -1
	}
	select {
	case started <- struct{}{}:
	default:
	}
	pidfd, perr := unix.PidfdOpen(pid, 0)
	if perr != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return Response{Error: fmt.Sprintf("pidfd_open: %v", perr)}, -1
	}
	return Response{Pid: pid}, pidfd
}

// lookPath resolves argv0 through env's PATH as a shell does: a name with
// a slash as it is, else the first regular file with an execute bit.
func lookPath(argv0 string, env []string) (string, int, error) {
	if strings.Contains(argv0, "/") {
		return argv0, 0, nil
	}
	dirs := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			dirs = v
		}
	}
	for _, dir := range strings.Split(dirs, ":") {
		if dir == "" {
			dir = "."
		}
		p := path.Join(dir, argv0)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, 0, nil
		}
	}
	return "", 127, fmt.Errorf("exec: %q: executable file not found in $PATH", argv0)
}
