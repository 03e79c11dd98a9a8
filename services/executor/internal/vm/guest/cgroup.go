//go:build linux

package guest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The guest's cgroups: the pids limit is on cgroupParent, so the job's
// processes and dockerd's containers share it; the agent stays in the root,
// dockerd and containerd (their threads count as pids) in cgroupDaemon.
const (
	cgroupRoot   = "/sys/fs/cgroup"
	cgroupParent = cgroupRoot + "/airlock"
	cgroupJob    = cgroupParent + "/job"
	cgroupDocker = "/airlock/docker" // dockerd's --cgroup-parent
	cgroupDaemon = cgroupRoot + "/airlock-dockerd"
)

func (a *agent) setupCgroups(pids int64) error {
	write := func(p, v string) error {
		if err := os.WriteFile(p, []byte(v), 0); err != nil {
			return fmt.Errorf("cgroup %s: %w", p, err)
		}
		return nil
	}
	if err := os.MkdirAll(cgroupJob, 0o755); err != nil {
		return fmt.Errorf("cgroup %s: %w", cgroupJob, err)
	}
	for _, p := range []string{cgroupRoot, cgroupParent} {
		if err := write(filepath.Join(p, "cgroup.subtree_control"), "+pids +memory +cpu"); err != nil {
			if err := write(filepath.Join(p, "cgroup.subtree_control"), "+pids"); err != nil {
				return err
			}
		}
	}
	if pids > 0 {
		if err := write(filepath.Join(cgroupParent, "pids.max"), strconv.FormatInt(pids, 10)); err != nil {
			return err
		}
	}
	fd, err := unix.Open(cgroupJob, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", cgroupJob, err)
	}
	a.jobCg = fd
	return nil
}
