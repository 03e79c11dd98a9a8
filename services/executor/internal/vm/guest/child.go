//go:build linux

package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// ChildArg0 is argv[0] of the agent re-executed as a job process's last step
// before execve: it drops privileges on the thread that then calls execve
// (capabilities and no_new_privs are per thread, so Go's fork cannot).
const ChildArg0 = "airlock-guest-exec"

// The child's file descriptors after stdin, stdout and stderr.
const (
	childSpecFD   = 3 // the proto.Process as JSON, then EOF
	childStatusFD = 4 // close-on-exec: EOF means execve worked; else "CODE message"
)

func init() {
	if len(os.Args) > 0 && os.Args[0] == ChildArg0 {
		// Keep main on the thread whose credentials execve passes on.
		runtime.LockOSThread()
	}
}

// setupFailed is the child's status when it failed before execve: the host
// sees a plain Error (a runtime failure), not an exec failure (126/127).
const setupFailed = 1

// Child is the re-executed agent's main; it never returns.
func Child() {
	status := os.NewFile(childStatusFD, "status")
	code, err := childExec()
	fmt.Fprintf(status, "%d %s", code, err)
	os.Exit(code)
}

func childExec() (int, error) {
	b, err := io.ReadAll(io.LimitReader(os.NewFile(childSpecFD, "spec"), proto.MaxPayload+1))
	if err != nil {
		return setupFailed, fmt.Errorf("read process spec: %w", err)
	}
	syscall.Close(childSpecFD)
	var p proto.Process
	if err := json.Unmarshal(b, &p); err != nil {
		return setupFailed, fmt.Errorf("decode process spec: %w", err)
	}
	for _, r := range p.Rlimits {
		res, ok := rlimits[r.Type]
		if !ok {
			return setupFailed, fmt.Errorf("rlimit %q: unknown", r.Type)
		}
		// syscall's Setrlimit, not a raw one: for RLIMIT_NOFILE it tells
		// syscall.Exec not to restore the soft limit Go raised at start.
		if err := syscall.Setrlimit(res, &syscall.Rlimit{Cur: r.Soft, Max: r.Hard}); err != nil {
			return setupFailed, fmt.Errorf("set %s: %w", r.Type, err)
		}
	}
	// The agent is exempt from the OOM killer; its children are not.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0); err != nil {
		return setupFailed, fmt.Errorf("oom_score_adj: %w", err)
	}
	// The bounding set needs CAP_SETPCAP to shrink, so it goes before setuid.
	for c := 0; c <= lastCap(); c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return setupFailed, fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return setupFailed, fmt.Errorf("clear ambient capabilities: %w", err)
	}
	groups := make([]int, len(p.AdditionalGIDs))
	for i, g := range p.AdditionalGIDs {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return setupFailed, fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(int(p.GID)); err != nil {
		return setupFailed, fmt.Errorf("setgid %d: %w", p.GID, err)
	}
	if err := syscall.Setuid(int(p.UID)); err != nil {
		return setupFailed, fmt.Errorf("setuid %d: %w", p.UID, err)
	}
	// uid 0 keeps its capabilities through setuid: clear them on this thread.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return setupFailed, fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return setupFailed, fmt.Errorf("no_new_privs: %w", err)
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := os.Chdir(cwd); err != nil {
		return setupFailed, fmt.Errorf("chdir to cwd (%q) set in config.json failed: %w", cwd, errors.Unwrap(err))
	}
	name := p.Args[0]
	path := name
	if !strings.Contains(name, "/") {
		os.Setenv("PATH", envValue(p.Env, "PATH"))
		found, err := exec.LookPath(name)
		if err != nil && !errors.Is(err, exec.ErrDot) {
			return 127, fmt.Errorf("exec: %q: executable file not found in $PATH", name)
		}
		path = found
	}
	if _, err := unix.FcntlInt(childStatusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return setupFailed, fmt.Errorf("status fd: %w", err)
	}
	err = syscall.Exec(path, p.Args, p.Env)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return 127, fmt.Errorf("exec: %q: no such file or directory", name)
	case errors.Is(err, syscall.EACCES):
		return 126, fmt.Errorf("exec: %q: permission denied", name)
	}
	return 126, fmt.Errorf("exec: %q: %w", name, err)
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// lastCap is the kernel's highest capability number.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	n := 0
	if err == nil {
		_, err = fmt.Sscanf(string(b), "%d", &n)
	}
	if err != nil {
		return 63 // dropping unknown ones is harmless: EINVAL is ignored
	}
	return n
}

var rlimits = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}
