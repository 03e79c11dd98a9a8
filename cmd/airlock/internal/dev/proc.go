package dev

import (
	"bytes"
	"fmt"
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

// freeAddresses reserves a free port on each host, all distinct. They are
// released before the services bind them; a collision in that window fails
// start-up loudly rather than silently.
func freeAddresses(hosts []string) ([]string, error) {
	var out []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, host := range hosts {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("--host %s: %w", host, err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// startProcess starts one process of the stack, argv, detached from this
// process, in its own session so it outlives the CLI and a terminal's
// signals. env is its whole environment; nil inherits this process's.
func startProcess(argv, env []string, s *devService) (int, chan error, error) {
	if err := os.MkdirAll(filepath.Dir(s.Log), 0o700); err != nil {
		return 0, nil, err
	}
	logf, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, nil, err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
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
