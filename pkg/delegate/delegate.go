// Package delegate starts a process in a cgroup of its own, delegated to
// it, where the executor needs one and would not otherwise have it: on a
// cgroup v2 host the executor makes its job cgroups below its own cgroup,
// which must hold no other process, and a process started from a login
// shell or a test runner shares that shell's session scope. systemd, where
// it runs the host, makes such a cgroup on request: a transient scope with
// Delegate=yes, which `systemd-run --scope` creates and then runs the
// command in (the same process: the pid is the command's).
package delegate

import (
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// Host is what the decision reads of the host.
type Host struct {
	// V2 is whether /sys/fs/cgroup is the unified hierarchy.
	V2 bool
	// Systemd is whether systemd runs the host (sd_booted: /run/systemd/system exists).
	Systemd bool
	// SystemdRun is the path of systemd-run, "" if there is none.
	SystemdRun string
	// Self is this process's cgroup v2 path ("0::" line of /proc/self/cgroup).
	Self string
}

// ReadHost reads the host this process runs on.
func ReadHost() Host {
	var h Host
	var st unix.Statfs_t
	h.V2 = unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
		h.Systemd = true
	}
	h.SystemdRun, _ = exec.LookPath("systemd-run")
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if rest, ok := strings.CutPrefix(line, "0::"); ok {
				h.Self = rest
			}
		}
	}
	return h
}

// Prefix returns what to put before a command so that it runs in a
// transient systemd scope named unit (systemd adds ".scope") with
// Delegate=yes, or nil where that is neither needed nor possible: a cgroup
// v1 host, the root cgroup (which may hold processes beside child
// cgroups), a host systemd does not run, or no systemd-run. Then the
// executor works in the cgroup it is started in, and says what is wrong
// with it if it cannot.
func (h Host) Prefix(unit string) []string {
	if !h.V2 || h.Self == "/" || !h.Systemd || h.SystemdRun == "" {
		return nil
	}
	return []string{h.SystemdRun, "--scope", "--quiet", "--collect", "--unit=" + unit, "--property=Delegate=yes", "--"}
}
