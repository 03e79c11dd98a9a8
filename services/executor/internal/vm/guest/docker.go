//go:build linux

package guest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	dockerSocket   = "/run/docker.sock"
	dockerDeadline = 120 * time.Second // dockerd's start under TCG emulation is slow
	dockerLogLimit = 16 << 10
)

// dockerdPaths are where images put dockerd (Debian's docker.io: /usr/sbin).
var dockerdPaths = []string{"/usr/bin/dockerd", "/usr/sbin/dockerd"}

// tailLog keeps the last bytes of a daemon's output for an error message.
type tailLog struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailLog) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > dockerLogLimit {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-dockerLogLimit:]...)
	}
	return len(b), nil
}

func (t *tailLog) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// startDocker runs the root's dockerd with its data on the disk, and waits
// until its socket answers; the socket then belongs to uid:gid.
func (a *agent) startDocker(uid, gid uint32) error {
	dockerd := ""
	for _, p := range dockerdPaths {
		if _, err := os.Stat(p); err == nil {
			dockerd = p
			break
		}
	}
	if dockerd == "" {
		return fmt.Errorf("docker: no dockerd in the root at %s", strings.Join(dockerdPaths, " or "))
	}
	cg := cgroupDaemon
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return fmt.Errorf("docker cgroup: %w", err)
	}
	cgfd, err := unix.Open(cg, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("docker cgroup: %w", err)
	}
	defer unix.Close(cgfd)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	args := []string{dockerd, "--data-root=/var/lib/docker", "--exec-root=/run/docker", "--pidfile=/run/docker.pid",
		"--host=unix://" + dockerSocket, "--bridge=none", "--iptables=false", "--ip6tables=false",
		"--cgroup-parent=" + cgroupDocker}
	pid, exited, err := a.reaper.spawn(dockerd, args, &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		Files: []uintptr{null.Fd(), w.Fd(), w.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: cgfd},
	})
	w.Close()
	if err != nil {
		r.Close()
		return fmt.Errorf("docker: start %s: %w", dockerd, err)
	}
	a.dockerdPid, a.dockerdExited = pid, exited
	log := &tailLog{}
	go func() {
		defer r.Close()
		s := bufio.NewReader(r)
		s.WriteTo(log)
	}()
	deadline := time.After(dockerDeadline)
	for {
		if dockerPing() {
			break
		}
		select {
		case ws := <-exited:
			a.dockerdPid = 0
			return fmt.Errorf("docker: dockerd exited (status %d) before its socket answered; its log ends:\n%s", ws.ExitStatus(), log)
		case <-deadline:
			return fmt.Errorf("docker: dockerd's socket did not answer within %s; its log ends:\n%s", dockerDeadline, log)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := os.Chown(dockerSocket, int(uid), int(gid)); err != nil {
		return fmt.Errorf("docker socket: %w", err)
	}
	if err := os.Chmod(dockerSocket, 0o660); err != nil {
		return fmt.Errorf("docker socket: %w", err)
	}
	return nil
}

// dockerPing asks the socket's /_ping for OK.
func dockerPing() bool {
	c, err := net.DialTimeout("unix", dockerSocket, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.Contains(line, " 200 ")
}
