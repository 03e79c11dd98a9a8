package sandbox

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCheckPidfdExited: the pid-namespace check of an exec's pidfd holds
// for a process that has exited and is not yet reaped (the pidfd no
// longer names its namespaces then, and a fast command usually is such a
// zombie when the helper's answer arrives): a zombie in the sandbox's
// namespace is accepted with its host pid, one in another namespace is
// refused, and a reaped one is accepted with pid 0 (nothing can be
// signalled). With the check read from the pidfd alone, the zombie in the
// wrong namespace was accepted.
func TestCheckPidfdExited(t *testing.T) {
	pidfd := -1
	cmd := exec.Command("sleep", "0.3")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, PidFD: &pidfd}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a process in a pid namespace of its own: %v", err)
	}
	defer unix.Close(pidfd)
	ns, err := pidNSOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pidNSOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	in, out := &execdConn{pidNS: ns}, &execdConn{pidNS: other}
	if pid, err := in.checkPidfd(pidfd); err != nil || pid != cmd.Process.Pid {
		t.Fatalf("running, its own namespace: pid %d, %v; want %d", pid, err, cmd.Process.Pid)
	}
	if _, err := out.checkPidfd(pidfd); err == nil || !strings.Contains(err.Error(), "outside the sandbox's pid namespace") {
		t.Fatalf("running, another namespace: %v, want a refusal", err)
	}
	// Exited, not reaped (cmd.Wait is not called yet).
	if _, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 10_000); err != nil {
		t.Fatal(err)
	}
	if _, err := pidfdPidNS(pidfd); err == nil {
		t.Log("this kernel still names an exited process's namespaces through its pidfd")
	}
	if pid, err := in.checkPidfd(pidfd); err != nil || pid != cmd.Process.Pid {
		t.Fatalf("a zombie, its own namespace: pid %d, %v; want %d", pid, err, cmd.Process.Pid)
	}
	if pid, err := out.checkPidfd(pidfd); err == nil || !strings.Contains(err.Error(), "outside the sandbox's pid namespace") {
		t.Fatalf("a zombie, another namespace: pid %d, %v; want a refusal", pid, err)
	}
	_ = cmd.Wait()
	if pid, err := in.checkPidfd(pidfd); err != nil || pid != 0 {
		t.Fatalf("reaped: pid %d, %v; want 0 and no error", pid, err)
	}
}
