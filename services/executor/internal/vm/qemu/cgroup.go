package qemu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupMount is where the cgroup hierarchies are mounted.
const cgroupMount = "/sys/fs/cgroup"

// v1Controllers are the v1 hierarchies a job's cgroup is in, as runc puts
// it (the sandbox package reads and limits these).
var v1Controllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer", "blkio"}

// CgroupDirs are the directories of the cgroup cgroupsPath names: on a
// unified host /sys/fs/cgroup/<path>, else <mount>/<path> in each mounted
// v1 hierarchy of v1Controllers (a hierarchy holding several is named
// once).
func CgroupDirs(cgroupsPath string) ([]string, error) {
	rel, err := cleanCgroupPath(cgroupsPath)
	if err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupMount, &st); err != nil {
		return nil, fmt.Errorf("cgroups: statfs %s: %w", cgroupMount, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return []string{filepath.Join(cgroupMount, rel)}, nil
	}
	mounts, err := cgroupV1Mounts()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, ctl := range v1Controllers {
		if m, ok := mounts[ctl]; ok {
			if d := filepath.Join(m, rel); !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("cgroups: no v1 hierarchy of %s is mounted", strings.Join(v1Controllers, ", "))
	}
	return dirs, nil
}

// cleanCgroupPath checks a bundle's cgroupsPath: a path relative to each
// hierarchy's root ("/a/b" and "a/b" alike) that never climbs above it.
func cleanCgroupPath(p string) (string, error) {
	rel := strings.TrimPrefix(p, "/")
	if rel == "" || len(p) > 4096 || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") || strings.ContainsAny(rel, "\x00\n") {
		return "", fmt.Errorf("linux.cgroupsPath %q: want a clean path below the hierarchy's root", p)
	}
	return rel, nil
}

// cgroupV1Mounts maps each v1 controller to the mount point of the
// hierarchy holding it, for hierarchies mounted from their root (only
// those have the paths a cgroupsPath names).
func cgroupV1Mounts() (map[string]string, error) {
	// The calling thread's: the main one may be in a sandbox's mount
	// namespace for a moment (sandbox.MountInto).
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || g[0] != "cgroup" || f[3] != "/" {
			continue
		}
		point := unescapeMount(f[4])
		for _, opt := range strings.Split(g[2], ",") {
			if _, ok := out[opt]; !ok {
				out[opt] = point
			}
		}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// JoinCgroup makes each of dirs if missing and moves this whole process
// into it, so that QEMU, started after, is there too: its memory, CPU and
// pids count against the job's limits, as runc's job does.
func JoinCgroup(dirs []string) error {
	pid := []byte(strconv.Itoa(os.Getpid()))
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroups: %w", err)
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), pid, 0); err != nil {
			return fmt.Errorf("cgroups: join %s: %w", d, err)
		}
	}
	return nil
}

// RemoveCgroup removes dirs once the processes in them have gone,
// retrying for a short while: a killed process leaves its cgroup a moment
// after it is reaped.
func RemoveCgroup(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		deadline := time.Now().Add(2 * time.Second)
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("cgroups: remove %s: %w", d, err))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
