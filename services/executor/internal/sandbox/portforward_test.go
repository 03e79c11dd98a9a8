package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// Without a namespace of the executor's, runc's is found through the pid
// file: a pid that now names a host process (here: the test itself, in
// the executor's namespace) or none is refused, never dialed from; a
// process in a namespace of its own is taken.
func TestPortForwardNetnsThroughPid(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (unshare --net)")
		}
		t.Skip("needs root (unshare --net)")
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	s := &Sandbox{spec: Spec{ID: "pf"}, pidFile: pidFile}
	setPid := func(pid int) {
		t.Helper()
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	setPid(os.Getpid())
	if h, err := s.openNetns(); err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "executor's own") {
		h.Close()
		t.Fatalf("a pid in the executor's namespace: %v, want refused", err)
	}

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	setPid(dead.Process.Pid)
	if _, err := s.openNetns(); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("a dead pid: %v, want gone", err)
	}

	job := exec.Command("unshare", "--net", "sleep", "30")
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Process.Kill(); job.Wait() })
	setPid(job.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, err := s.openNetns()
		if err == nil {
			h.Close()
			break
		}
		// Until unshare has made the namespace, it is the executor's.
		if time.Now().After(deadline) {
			t.Fatalf("a process in a namespace of its own: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
