package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// dialPortWait bounds making one forwarded connection.
const dialPortWait = 10 * time.Second

// DialPort connects to TCP port on the loopback of the running sandbox,
// as a process inside it would, and returns the connection. No TCP port
// listens on the host for it:
//
//   - runc: the job shares the kernel's network stack, so the connection
//     is made from a thread that has joined the job's network namespace
//     (and is then thrown away with its goroutine, never reused);
//   - runsc: gVisor keeps its own network stack, whose loopback the host
//     kernel cannot reach (not even from the job's namespace), so runsc's
//     own port-forward connects to a short-lived Unix listener made here
//     (in a directory only root can enter, gone once connected) and
//     joins that connection to the port on gVisor's loopback;
//   - vm: refused.
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d is not between 1 and 65535", errdefs.ErrInvalidArgument, port)
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	state, ending := s.state, s.ending
	s.mu.Unlock()
	// A sandbox not yet running (a session just woken, whose Run has
	// begun) is waited for below, as an exec waits for it.
	if state > stateRunning || ending {
		return nil, fmt.Errorf("%w: sandbox %s is not running", errdefs.ErrFailedPrecondition, s.spec.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, dialPortWait)
	defer cancel()
	// Until the sandbox's process is up, the runtime has no container to
	// forward into.
	if _, err := s.waitUp(ctx); err != nil {
		return nil, err
	}
	switch s.spec.Class {
	case ClassRunc:
		return s.dialInNetns(ctx, port)
	case ClassRunsc:
		return s.dialRunsc(ctx, port)
	}
	return nil, fmt.Errorf("%w: port forwarding is not supported under runtime class %s", errdefs.ErrFailedPrecondition, s.spec.Class)
}

// openNetns opens the sandbox's network namespace: the one the executor
// made, or the runtime's own through the job's first process. That one
// is found through the pid in the pid file, which a dead process's
// reuse could point elsewhere, so it is checked: the process is pinned
// (a pidfd) while its namespace is opened and must be alive after, and
// the namespace must not be the executor's own (every job has its own;
// the host's is never dialed from).
func (s *Sandbox) openNetns() (netns.NsHandle, error) {
	if s.spec.NetNS != "" {
		h, err := netns.GetFromPath(s.spec.NetNS)
		if err != nil {
			return netns.None(), fmt.Errorf("sandbox %s: open its network namespace: %w", s.spec.ID, err)
		}
		return h, nil
	}
	pid := readPid(s.pidFile)
	if pid <= 0 {
		return netns.None(), fmt.Errorf("%w: sandbox %s has no process yet", errdefs.ErrFailedPrecondition, s.spec.ID)
	}
	gone := fmt.Errorf("%w: sandbox %s: its process %d is gone", errdefs.ErrFailedPrecondition, s.spec.ID, pid)
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return netns.None(), gone
	}
	defer unix.Close(pidfd)
	h, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return netns.None(), fmt.Errorf("sandbox %s: open its network namespace: %w", s.spec.ID, err)
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		h.Close()
		return netns.None(), gone
	}
	if err := notOwnNetns(h); err != nil {
		h.Close()
		return netns.None(), fmt.Errorf("sandbox %s: process %d: %w", s.spec.ID, pid, err)
	}
	return h, nil
}

// ownNetns is the executor's network namespace, read at start: before
// any thread joined a job's (a thread that did is never reused, but the
// main one, wedged, would answer for /proc/self afterwards).
var ownNetns, ownNetnsErr = func() (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Stat("/proc/self/ns/net", &st)
	return st, err
}()

// notOwnNetns refuses h when it is the executor's own network namespace.
func notOwnNetns(h netns.NsHandle) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		return err
	}
	if ownNetnsErr != nil {
		return fmt.Errorf("the executor's own network namespace: %w", ownNetnsErr)
	}
	if st.Dev == ownNetns.Dev && st.Ino == ownNetns.Ino {
		return fmt.Errorf("%w: its network namespace is the executor's own, not a job's: refused", errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (s *Sandbox) dialInNetns(ctx context.Context, port int) (net.Conn, error) {
	target, err := s.openNetns()
	if err != nil {
		return nil, err
	}
	defer target.Close()
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread joins the job's namespace and is never unlocked: when
		// this goroutine ends the runtime ends the thread, so no other
		// goroutine ever runs in the job's namespace. The socket keeps the
		// namespace it was made in.
		runtime.LockOSThread()
		if err := unix.Setns(int(target), unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("sandbox %s: join its network namespace: %w", s.spec.ID, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		done <- result{c, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, refusedPort(port, r.err)
	}
	return r.c, nil
}

// refusedPort says that nothing took the connection, as a precondition
// the caller can act on (start the server), or passes err on.
func refusedPort(port int, err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w: nothing listens on port %d in the session", errdefs.ErrFailedPrecondition, port)
	}
	return fmt.Errorf("connect to port %d in the session: %w", port, err)
}

func (s *Sandbox) dialRunsc(ctx context.Context, port int) (net.Conn, error) {
	// runsc's port-forward takes a path to connect to, not a descriptor:
	// a socket in a directory only root can enter, gone once connected.
	// Under the temporary directory, not the sandbox's: a socket's path
	// is at most 107 bytes.
	dir, err := os.MkdirTemp("", "airlock-pf-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	args := s.rt.global("")
	args = append(args, "port-forward", "--stream", sock, s.name, strconv.Itoa(port))
	cmd := exec.CommandContext(ctx, s.rt.path, args...)
	cmd.Env = runtimeEnv
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &limitedBuffer{b: &bytes.Buffer{}, max: 4096}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox %s: start runsc port-forward: %w", s.spec.ID, err)
	}
	accepted := make(chan *net.UnixConn, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	// runsc returns once gVisor has connected to the port (or failed to);
	// its connection to the listener may still be in the accept queue
	// then, so the accept is waited for (bounded by ctx) before the
	// listener closes: at once only when runsc failed.
	werr := cmd.Wait()
	var c *net.UnixConn
	if werr == nil {
		select {
		case c = <-accepted:
		case <-ctx.Done():
		}
	}
	l.Close()
	if c == nil {
		c = <-accepted
	}
	if werr != nil {
		if c != nil {
			c.Close()
		}
		out.mu.Lock()
		msg := out.b.String()
		out.mu.Unlock()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to port %d in the session: %w", port, ctx.Err())
		}
		if containsRefused(msg) {
			return nil, fmt.Errorf("%w: nothing listens on port %d in the session", errdefs.ErrFailedPrecondition, port)
		}
		if strings.Contains(msg, "unsupported network type") {
			// gVisor forwards only into a sandbox started in a network
			// namespace (--network=sandbox); without the executor's
			// network policy a sandbox runs with --network=none.
			return nil, fmt.Errorf("%w: sandbox %s runs without a network namespace of the executor's (runsc --network=none): its ports cannot be forwarded", errdefs.ErrFailedPrecondition, s.spec.ID)
		}
		return nil, fmt.Errorf("sandbox %s: runsc port-forward: %v: %s", s.spec.ID, werr, msg)
	}
	if c == nil {
		return nil, fmt.Errorf("sandbox %s: runsc port-forward connected no stream", s.spec.ID)
	}
	return c, nil
}

func containsRefused(msg string) bool {
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "ECONNREFUSED")
}
