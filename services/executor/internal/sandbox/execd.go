package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox/execd"
)

// A runc session's execs start through its exec helper (package
// sandbox/execd): a process the runtime starts in the sandbox once, with
// the sandbox's namespaces, cgroup, seccomp filter, no_new_privs and
// rlimits, holding one end of an anonymous socketpair. For each exec the
// executor sends the command and its stdin, stdout and stderr (pipes made
// for this exec alone); the helper forks it as the job's user, in a
// session of its own, and returns a pidfd of it. The exit status is the
// kernel's, read from that pidfd (PIDFD_INFO_EXIT) once the helper has
// reaped the command: nothing the helper (or a job) says is taken for it.
// A dead helper (a job root in the sandbox can kill it) fails the exec in
// flight as a sandbox error and is started again for the next.

// execdReplyWait bounds how long the helper has to answer a request (a
// fork and exec); past it, the helper is taken for dead.
const execdReplyWait = 10 * time.Second

// execdConn is the executor's end of one helper.
type execdConn struct {
	mu   sync.Mutex // one request at a time
	sock int
	// pidfd is the helper's own (to kill it when it is given up);
	// initPid, the sandbox init's host pid it was started under.
	pidfd, initPid int
	pidNS          uint64 // the sandbox's pid namespace (inode)
	dead           bool
	errPath        string // the helpers' stderr
}

// alive reports whether the helper looks alive: its process has not
// ended and its end of the socket is not closed. (One that dies after
// fails the exec then in flight.)
func (c *execdConn) alive() bool {
	fds := []unix.PollFd{{Fd: int32(c.sock), Events: unix.POLLIN}}
	if c.pidfd >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(c.pidfd), Events: unix.POLLIN})
	}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 0
}

func (c *execdConn) close() {
	if c.pidfd >= 0 {
		_ = unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
		unix.Close(c.pidfd)
		c.pidfd = -1
	}
	if c.sock >= 0 {
		unix.Close(c.sock)
		c.sock = -1
	}
	c.dead = true
}

// closeExecd gives up the sandbox's helper, if it has one.
func (s *Sandbox) closeExecd() {
	s.execdMu.Lock()
	defer s.execdMu.Unlock()
	s.closeExecdLocked()
}

func (s *Sandbox) closeExecdLocked() {
	if s.execd != nil {
		s.execd.mu.Lock()
		s.execd.close()
		s.execd.mu.Unlock()
		s.execd = nil
	}
}

// useExecd reports whether the sandbox's execs go through a helper.
func (s *Sandbox) useExecd() bool {
	return s.rt.class == ClassRunc && s.m.execdWhy == "" && (s.spec.isSession() || s.claimed)
}

// checkExecd says why the exec helper at path cannot serve execs here, or
// "" if it can: it runs the helper's binary once in its probe mode (it
// exits execd.ProbeStatus at once) with a pidfd, and reads that exit
// status back from the pidfd once reaped, as every exec's is read. A
// kernel without PIDFD_GET_INFO (Linux 6.13) or PIDFD_INFO_EXIT (6.15) —
// Debian 12's 6.1, say — fails it, and execs go through `runc exec`: an
// exec's status is never one the executor could not read.
func checkExecd(path string) string {
	if path == "" {
		return "no exec helper is configured (sandbox.execd)"
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	kernel := "Linux " + unix.ByteSliceToString(uts.Release[:])
	pidfd := -1
	cmd := exec.Command(path, execd.ProbeArg)
	cmd.Env = runtimeEnv
	cmd.SysProcAttr = &syscall.SysProcAttr{PidFD: &pidfd}
	err := cmd.Run()
	if pidfd >= 0 {
		defer unix.Close(pidfd)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return fmt.Sprintf("run the exec helper %s: %v", path, err)
	}
	if got := cmd.ProcessState.ExitCode(); got != execd.ProbeStatus {
		return fmt.Sprintf("the exec helper %s exited %d in its probe mode, want %d (not an airlock-execd?)", path, got, execd.ProbeStatus)
	}
	if pidfd < 0 {
		return kernel + " gave no pidfd of a child (pidfd needs Linux 5.3)"
	}
	info := pidfdInfo{Mask: pidfdInfoExit}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pidfd), pidfdGetInfo, uintptr(unsafe.Pointer(&info))); e != 0 {
		return fmt.Sprintf("%s cannot read a pidfd's exit status (ioctl PIDFD_GET_INFO: %v; it needs Linux 6.15)", kernel, e)
	}
	if info.Mask&pidfdInfoExit == 0 {
		return kernel + " does not report a reaped process's exit status through its pidfd (PIDFD_INFO_EXIT needs Linux 6.15)"
	}
	if ws := syscall.WaitStatus(info.ExitCode); !ws.Exited() || ws.ExitStatus() != execd.ProbeStatus {
		return fmt.Sprintf("%s reported the exit status %#x through a pidfd, want exited %d", kernel, info.ExitCode, execd.ProbeStatus)
	}
	return ""
}

// prestart waits for a session's sandbox to be up (Run, in the
// background), starts its exec helper if it has one, and calls
// Spec.Ready. A helper that fails to start is logged and the session is
// ready all the same: the first exec tries again, or goes through the
// runtime.
func (s *Sandbox) prestart(ctx context.Context) {
	proc, err := s.waitUp(ctx)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, errdefs.ErrFailedPrecondition) {
			return // stopped, or ended before it came up
		}
		// Not up in time: ready all the same, so its execs say why they
		// cannot start, rather than a session that never runs.
		s.m.log.Warn("sandbox: the session's sandbox did not come up", "job_id", s.spec.ID, "error", err)
		if s.spec.Ready != nil {
			s.spec.Ready()
		}
		return
	}
	if s.useExecd() {
		if _, err := s.execdFor(proc); err != nil && ctx.Err() == nil {
			s.m.log.Warn("sandbox: start the exec helper", "job_id", s.spec.ID, "error", err)
		}
	}
	if s.spec.Ready != nil && ctx.Err() == nil {
		s.spec.Ready()
	}
}

// execdFor returns the sandbox's live helper, starting one if it has none
// (or its helper died, or belongs to a sandbox since restarted). A
// sandbox that is ending gets none: Run's end closes the helper, and
// none may start after.
func (s *Sandbox) execdFor(proc *specs.Process) (*execdConn, error) {
	s.execdMu.Lock()
	defer s.execdMu.Unlock()
	if s.isEnding() {
		s.closeExecdLocked()
		return nil, fmt.Errorf("sandbox %s: not running: no exec helper", s.spec.ID)
	}
	initPid := readPid(s.pidFile)
	if c := s.execd; c != nil {
		c.mu.Lock()
		ok := !c.dead && c.initPid == initPid && c.alive()
		if !ok {
			c.close()
		}
		c.mu.Unlock()
		if ok {
			return c, nil
		}
		s.execd = nil
	}
	if s.execdFailInit == initPid && s.execdFails >= execdMaxFails {
		return nil, errExecdGaveUp
	}
	c, err := s.startExecd(proc, initPid)
	if err != nil {
		if s.execdFailInit != initPid {
			s.execdFailInit, s.execdFails = initPid, 0
		}
		s.execdFails++
		return nil, err
	}
	s.execdFails = 0
	s.execd = c
	return c, nil
}

// execdMaxFails bounds the helper's failed starts in one run of a sandbox:
// past it, its execs go through the runtime without trying again (a start
// can take execdReplyWait to fail).
const execdMaxFails = 3

// errExecdGaveUp: execdMaxFails failed starts (each logged).
var errExecdGaveUp = errors.New("the exec helper failed to start too often")

// startExecd starts the helper with one `runc exec` (not detached: it stays
// the helper's parent, and reaps it): as the sandbox's
// root (uid 0 of its user namespace, no host privilege) with only the
// capabilities execd.Caps, from its binary passed as an fd (nothing is
// added to the sandbox's file system), holding its end of the socketpair.
func (s *Sandbox) startExecd(proc *specs.Process, initPid int) (*execdConn, error) {
	if initPid <= 0 {
		return nil, fmt.Errorf("sandbox %s: no init pid for the exec helper", s.spec.ID)
	}
	ns, err := pidNSOf(initPid)
	if err != nil {
		return nil, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	c := &execdConn{sock: pair[0], pidfd: -1, initPid: initPid, pidNS: ns, errPath: filepath.Join(s.dir, "execd.stderr")}
	theirs := os.NewFile(uintptr(pair[1]), "execd-socket")
	defer theirs.Close()
	bin, err := os.Open(s.m.cfg.ExecdPath)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("exec helper: %w", err)
	}
	defer bin.Close()
	p := *proc
	p.Args = []string{fmt.Sprintf("/proc/self/fd/%d", execd.BinaryFD)}
	p.Env = []string{"PATH=/usr/bin:/bin"}
	p.Cwd = "/"
	p.User = specs.User{UID: 0, GID: 0}
	p.Capabilities = &specs.LinuxCapabilities{Bounding: execd.Caps, Permitted: execd.Caps, Effective: execd.Caps}
	p.Terminal = false
	data, err := json.Marshal(&p)
	if err != nil {
		c.close()
		return nil, err
	}
	procFile := filepath.Join(s.dir, "execd.json")
	logPath := filepath.Join(s.dir, "execd.log")
	defer os.Remove(procFile)
	if err := os.WriteFile(procFile, data, 0o600); err != nil {
		c.close()
		return nil, err
	}
	// Not detached (-d): runc stays the helper's parent and reaps it, and
	// this process reaps runc. A detached helper would be reparented to
	// whatever subreaper is above the executor, which may never reap it.
	args := append(s.rt.global(logPath), "exec", "--preserve-fds", "2", "--process", procFile, s.name)
	cmd := exec.Command(s.rt.path, args...)
	cmd.Env = runtimeEnv
	cmd.Dir = s.dir
	cmd.ExtraFiles = []*os.File{theirs, bin}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The helper's stderr, through runc, goes to a file of the sandbox's
	// directory, read when the helper fails.
	errFile, err := os.OpenFile(c.errPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		c.close()
		return nil, err
	}
	defer errFile.Close()
	cmd.Stdout, cmd.Stderr = errFile, errFile
	if err := cmd.Start(); err != nil {
		c.close()
		return nil, fmt.Errorf("start the exec helper: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	theirs.Close()
	if err := setRecvTimeout(c.sock, execdReplyWait); err != nil {
		c.close()
		return nil, err
	}
	// The helper's first message: ready, with a pidfd of itself.
	var hello execd.Response
	fds, err := execd.Recv(c.sock, &hello)
	if err == nil && !hello.Ready {
		err = errors.New(hello.Error)
	}
	if err == nil && len(fds) != 1 {
		err = fmt.Errorf("its first message came with %d fds, want its pidfd", len(fds))
	}
	if err == nil {
		c.pidfd = fds[0]
		fds = nil
		_, err = c.checkPidfd(c.pidfd)
	}
	closeFDs(fds)
	if err != nil {
		c.close()
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("the exec helper did not come up: %v%s%s", err, prefixed(strings.Join(logErrors(logPath), "; ")), stderrTail(c.errPath))
	}
	return c, nil
}

// execdStderr is the tail of what the sandbox's helpers wrote to stderr,
// prefixed ": ", or "".
func stderrTail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return prefixed(strings.TrimSpace(string(data)))
}

// prefixed is ": "+s, or "" for "".
func prefixed(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func setRecvTimeout(fd int, d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// pidNSOf is the inode of pid's pid namespace.
func pidNSOf(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// PIDFD_GET_MNT_NAMESPACE and PIDFD_GET_PID_NAMESPACE, _IO(PIDFS_IOCTL_MAGIC,
// 3 and 5) in linux/pidfd.h (Linux 6.11; the helper needs 6.15 anyway).
const (
	pidfdGetMntNamespace = 0xFF03
	pidfdGetPidNamespace = 0xFF05
)

// pidfdNamespace is an fd of one of pidfd's process's namespaces (req, a
// PIDFD_GET_*_NAMESPACE); ESRCH once the process has exited.
func pidfdNamespace(pidfd int, req uintptr) (int, error) {
	nsfd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pidfd), req, 0)
	if e != 0 {
		return -1, e
	}
	return int(nsfd), nil
}

// pidfdPidNS is the inode of the pid namespace of pidfd's process;
// ESRCH once it has been reaped.
func pidfdPidNS(pidfd int) (uint64, error) {
	nsfd, err := pidfdNamespace(pidfd, pidfdGetPidNamespace)
	if err != nil {
		return 0, err
	}
	defer unix.Close(nsfd)
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// errExecdGone is an exec whose helper died or failed under it.
var errExecdGone = errors.New("the sandbox's exec helper failed")

// start sends req with its three fds and returns the command's pidfd and
// host pid, or the helper's refusal (res filled: the command could not be
// executed), or an error wrapping errExecdGone (the helper is given up).
func (c *execdConn) start(req execd.Request, stdio []int) (pidfd, hostPid int, refused *execd.Response, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return -1, 0, nil, errExecdGone
	}
	gone := func(err error) (int, int, *execd.Response, error) {
		c.close()
		return -1, 0, nil, fmt.Errorf("%w: %v%s", errExecdGone, err, stderrTail(c.errPath))
	}
	if err := execd.Send(c.sock, req, stdio...); err != nil {
		return gone(err)
	}
	var resp execd.Response
	fds, err := execd.Recv(c.sock, &resp)
	if err != nil {
		return gone(err)
	}
	if resp.Error != "" {
		closeFDs(fds)
		if resp.Code == 0 {
			return gone(errors.New(resp.Error))
		}
		return -1, 0, &resp, nil
	}
	if len(fds) != 1 {
		closeFDs(fds)
		return gone(fmt.Errorf("an answer with %d fds, want a pidfd", len(fds)))
	}
	pid, err := c.checkPidfd(fds[0])
	if err != nil {
		unix.Close(fds[0])
		return gone(err)
	}
	return fds[0], pid, nil, nil
}

// checkPidfd verifies that fd is a pidfd of a process in the sandbox's pid
// namespace, one level below the executor's, and returns its host pid (0
// if it has already been reaped: it can then only be a process that was
// in it, as the helper, which has no other, sent it).
func (c *execdConn) checkPidfd(fd int) (int, error) {
	nspid, err := pidfdNSpid(fd)
	if err != nil {
		return 0, err
	}
	if len(nspid) == 1 && nspid[0] == "-1" {
		return 0, nil
	}
	if len(nspid) != 2 {
		return 0, fmt.Errorf("pidfd of a process with NSpid %v, want one in the sandbox's pid namespace", nspid)
	}
	pid, err := strconv.Atoi(nspid[0])
	if err != nil {
		return 0, fmt.Errorf("pidfd NSpid %v: %v", nspid, err)
	}
	// The namespace from the pidfd itself while the process runs. Once it
	// has exited the pidfd no longer names its namespaces (ESRCH), and
	// `true` often has by now.
	ns, err := pidfdPidNS(fd)
	switch {
	case errors.Is(err, unix.ESRCH):
		var reaped bool
		if ns, reaped, err = exitedPidNS(fd, pid); reaped {
			return 0, nil // nothing under /proc speaks for it now
		}
		if err != nil {
			return 0, err
		}
	case err != nil:
		return 0, fmt.Errorf("PIDFD_GET_PID_NAMESPACE: %w", err)
	}
	if ns != c.pidNS {
		return 0, fmt.Errorf("pidfd of a process (host pid %d) outside the sandbox's pid namespace", pid)
	}
	// The pidfd still names that process (its pid was not reused).
	if err := unix.PidfdSendSignal(fd, 0, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return 0, err
	}
	return pid, nil
}

// exitedPidNS is the pid namespace of pidfd's exited process, host pid
// pid, from its /proc entry, which a zombie keeps until it is reaped; or
// reaped. A stat of /proc/PID is only of this process if the process is
// still unreaped after the stat (its pid is not reused before). A stat
// that fails (ENOENT, ESRCH or EACCES, as the reaping goes) is tried again
// until fdinfo says reaped.
func exitedPidNS(pidfd, pid int) (ns uint64, reaped bool, err error) {
	for try := 0; ; try++ {
		ns, err := pidNSOf(pid)
		now, ferr := pidfdNSpid(pidfd)
		switch {
		case ferr != nil:
			return 0, false, ferr
		case len(now) == 1 && now[0] == "-1":
			return 0, true, nil
		case err == nil:
			return ns, false, nil
		case try == 100:
			return 0, false, fmt.Errorf("the pid namespace of an exited exec's process (host pid %d): %w", pid, err)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// pidfdNSpid is the NSpid line of pidfd's fdinfo: the process's pid in
// each pid namespace from the executor's down, or "-1" once reaped.
func pidfdNSpid(fd int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return nil, err
	}
	var nspid []string
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			nspid = strings.Fields(v)
		}
	}
	return nspid, nil
}

// pidfdInfo is struct pidfd_info (linux/pidfd.h) up to its exit code.
type pidfdInfo struct {
	Mask, CgroupID                                                    uint64
	Pid, Tgid, Ppid, Ruid, Rgid, Euid, Egid, Suid, Sgid, Fsuid, Fsgid uint32
	ExitCode                                                          int32
	CoredumpMask, spare                                               uint32
}

const (
	pidfdGetInfo  = 0xC040FF0B // _IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info), 64 bytes
	pidfdInfoExit = 1 << 3
)

// pidfdExit waits for the process of pidfd to end and be reaped and
// returns its wait status, as the kernel recorded it.
func pidfdExit(pidfd int) (syscall.WaitStatus, error) {
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, -1)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return 0, err
		}
	}
	// Ended; the helper (or, if it died, the sandbox's init) reaps it
	// at once.
	deadline := time.Now().Add(execdReplyWait)
	for delay := 50 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
		info := pidfdInfo{Mask: pidfdInfoExit}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pidfd), pidfdGetInfo, uintptr(unsafe.Pointer(&info)))
		if e != 0 && e != unix.ESRCH {
			return 0, fmt.Errorf("PIDFD_GET_INFO: %v", e)
		}
		if e == 0 && info.Mask&pidfdInfoExit != 0 {
			return syscall.WaitStatus(info.ExitCode), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the exec's process ended but was not reaped within %s", execdReplyWait)
		}
		time.Sleep(delay)
	}
}

// execViaHelper is Exec through the sandbox's helper. handled is false
// when the helper could not be started: the caller then execs through the
// runtime.
func (s *Sandbox) execViaHelper(ctx context.Context, x ExecSpec, res ExecResult, proc *specs.Process) (_ ExecResult, handled bool, _ error) {
	c, err := s.execdFor(proc)
	if errors.Is(err, errExecdGaveUp) {
		return res, false, nil
	}
	if err != nil {
		s.m.log.Warn("sandbox: exec helper unavailable; exec through the runtime", "job_id", s.spec.ID, "error", err)
		return res, false, nil
	}
	pipes, err := newOutputPipes()
	if err != nil {
		return res, true, err
	}
	var stdinR, stdinW *os.File
	if x.Stdin != nil {
		stdinR, stdinW, err = os.Pipe()
	} else {
		stdinR, err = os.Open(os.DevNull)
	}
	if err != nil {
		pipes.started(false)
		return res, true, err
	}
	groups := make([]uint32, 0, len(proc.User.AdditionalGids))
	groups = append(groups, proc.User.AdditionalGids...)
	req := execd.Request{Argv: x.Argv, Env: proc.Env, Cwd: proc.Cwd, UID: proc.User.UID, GID: proc.User.GID, Groups: groups}
	cpu0, oom0 := s.m.cg.cpuTime(s.cgRel), s.oomKills()
	start := time.Now()
	pidfd, hostPid, refused, err := c.start(req, []int{int(stdinR.Fd()), int(pipes.outW.Fd()), int(pipes.errW.Fd())})
	stdinR.Close()
	pipes.started(err == nil && refused == nil)
	if err != nil || refused != nil {
		if stdinW != nil {
			stdinW.Close()
		}
		if err != nil {
			res.Reason, res.Message = ReasonSandboxError, err.Error()
			return res, true, nil
		}
		res.Reason, res.ExitCode, res.Message = ReasonExited, refused.Code, "the command could not be executed: "+refused.Error
		res.WallTime = time.Since(start)
		return res, true, nil
	}
	defer unix.Close(pidfd)
	if stdinW != nil {
		go func() {
			_, _ = io.Copy(stdinW, x.Stdin)
			stdinW.Close()
		}()
		defer stdinW.Close()
	}
	pipes.copy(x.Stdout, x.Stderr)
	var status syscall.WaitStatus
	waitC := make(chan error, 1)
	go func() {
		var err error
		status, err = pidfdExit(pidfd)
		waitC <- err
	}()
	// The command leads a session and process group of its own (the
	// helper's setsid), named by its host pid.
	// The group's id is its leader's pid, which the host may reuse once
	// the helper has reaped the leader: the group is signalled only while
	// the pidfd's process is still there (running, or a zombie not yet
	// reaped, whose pid cannot be reused).
	group := func(sig syscall.Signal) {
		if unix.PidfdSendSignal(pidfd, sig, nil, 0) == nil && hostPid > 0 {
			_ = syscall.Kill(-hostPid, sig)
		}
	}
	stopped, werr := superviseExec(ctx, x, start, waitC, group, func() { group(syscall.SIGKILL) })
	wall := time.Since(start)
	ending := s.isEnding()
	if x.exited != nil {
		x.exited()
	}
	pipes.drain(outputDrainGrace) // a process the exec left running may hold it open
	cpu1, oom1 := s.m.cg.cpuTime(s.cgRel), s.oomKills()
	res.WallTime, res.CPUTime = wall, max(0, cpu1-cpu0)
	code := -1
	if werr == nil {
		switch {
		case status.Exited():
			code = status.ExitStatus()
		case status.Signaled():
			code = 128 + int(status.Signal())
		}
	}
	if s.execStopped(&res, x, stopped, ending, oom1 > oom0, code) {
		return res, true, nil
	}
	if werr != nil || code < 0 {
		res.Reason, res.Message = ReasonSandboxError, fmt.Sprintf("the exec's exit status could not be read: %v (status %#x)", werr, int(status))
		return res, true, nil
	}
	res.Reason, res.ExitCode = ReasonExited, code
	res.Message = fmt.Sprintf("exited with status %d", code)
	return res, true, nil
}
