package dev

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/pkg/pki"
)

// pidFile is where the named process of the stack in dir (a service or the
// git server) keeps its pid. This file holds how those processes are
// started detached, found again and stopped.
func pidFile(dir, name string) string { return filepath.Join(dir, name, name+".pid") }

func writePID(dir, name string, pid int) error {
	return pki.WriteFileAtomic(pidFile(dir, name), []byte(strconv.Itoa(pid)+"\n"), 0o600)
}

// reservation holds a free port on each of its hosts, all distinct, by
// listening on it, until the process that is to bind it is about to start:
// while a port is held nothing else on the machine can take it, neither
// another program's listener nor an outgoing connection given it as its
// ephemeral port. The moment between a release and the process's own bind
// is left; a process that loses its port in it exits at start-up, its log
// saying the address is in use, and dev up starts the stack again on new
// ports (startError.portTaken).
type reservation struct {
	addrs []string
	held  map[string]net.Listener
}

// reserveAddresses reserves a free port on each of hosts.
func reserveAddresses(hosts []string) (*reservation, error) {
	r := &reservation{held: map[string]net.Listener{}}
	for _, host := range hosts {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			r.close()
			return nil, fmt.Errorf("--host %s: %w", host, err)
		}
		addr := l.Addr().String()
		r.addrs = append(r.addrs, addr)
		r.held[addr] = l
	}
	return r, nil
}

// release lets addr's port go, for the process about to bind it.
func (r *reservation) release(addr string) {
	if l, ok := r.held[addr]; ok {
		l.Close()
		delete(r.held, addr)
	}
}

// close lets every port still held go.
func (r *reservation) close() {
	for addr := range r.held {
		r.release(addr)
	}
}

// startError is a process of the stack that exited during start-up.
type startError struct {
	msg string
	// what names the process, as the message does.
	what string
	// portTaken says the process's log, from this start on, reports that
	// binding its address failed as in use: its port was taken after the
	// reservation let it go.
	portTaken bool
}

func (e *startError) Error() string { return e.msg }

// exitedAtStart is the startError of s, named what, having exited with
// err during start-up.
func exitedAtStart(what string, s *devService, err error) *startError {
	var portTaken bool
	if f, ferr := os.Open(s.Log); ferr == nil {
		// Only what this start wrote: the log is appended to across runs.
		if _, ferr := f.Seek(s.logFrom, io.SeekStart); ferr == nil {
			data, _ := io.ReadAll(io.LimitReader(f, 1<<20))
			// As Go's net package says it: "listen tcp ADDR: bind: address already in use".
			portTaken = bytes.Contains(data, []byte(s.Address+": bind: "+syscall.EADDRINUSE.Error()))
		}
		f.Close()
	}
	return &startError{
		msg:       fmt.Sprintf("%s exited during start-up (%v); last log lines:\n%s", what, err, tail(s.Log, 20)),
		what:      what,
		portTaken: portTaken,
	}
}

// awaitStart polls the started process s (what names it in errors) until
// attempt says it is ready, it exits, or ctx ends. attempt makes one check
// within the deadline of the context it is given, and says what it saw
// when the process is not ready.
func awaitStart(ctx context.Context, what string, s *devService, exited <-chan error, attempt func(context.Context) (ready bool, saw string)) error {
	var last string
	for {
		select {
		case err := <-exited:
			return exitedAtStart(what, s, err)
		default:
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		ready, saw := attempt(actx)
		cancel()
		if ready {
			return nil
		}
		if ctx.Err() != nil {
			select {
			case err := <-exited: // an exit says more than the time
				return exitedAtStart(what, s, err)
			default:
			}
			if last == "" {
				last = saw // the attempt ctx cut short is all there is
			}
			return fmt.Errorf("%s was not ready in time (last: %s); last log lines:\n%s", what, last, tail(s.Log, 20))
		}
		last = saw
		time.Sleep(50 * time.Millisecond)
	}
}

// startProcess starts one process of the stack, argv, detached from this
// process, in its own session so it outlives the CLI and a terminal's
// signals. env is its whole environment; nil inherits this process's. It
// lets s's port go from r just before the process starts.
func startProcess(argv, env []string, s *devService, r *reservation) (int, chan error, error) {
	if err := os.MkdirAll(filepath.Dir(s.Log), 0o700); err != nil {
		return 0, nil, err
	}
	logf, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, nil, err
	}
	defer logf.Close()
	if s.logFrom, err = logf.Seek(0, io.SeekEnd); err != nil {
		return 0, nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	r.release(s.Address)
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd.Process.Pid, done, nil
}

func readPID(dir, name string) (int, error) {
	data, err := os.ReadFile(pidFile(dir, name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// runningPID returns the pid of the named service of the stack in dir if
// that process is alive and really is that service: a pid file can outlive
// its process, and the kernel reuses pids.
func runningPID(dir, name string) (int, bool) {
	pid, err := readPID(dir, name)
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte("\x00"+devPaths(dir, name).Config+"\x00")) {
		return 0, false
	}
	return pid, alive(pid)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may hold spaces.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// stopProcess stops the named service gracefully, then by force, and says
// which it took.
func stopProcess(dir, name string, timeout time.Duration) string {
	defer os.Remove(pidFile(dir, name))
	pid, ok := runningPID(dir, name)
	if !ok {
		return "not running"
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return "not running"
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return "stopped"
		}
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for range 100 {
		if !alive(pid) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "killed after " + timeout.String()
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
