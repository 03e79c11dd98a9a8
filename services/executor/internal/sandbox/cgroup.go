package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A job's own cgroup owns its limits and counters; the runtime gets a
// child of it without limits, which it deletes when the container ends,
// so the counters and the OOM reason are read after the runtime is gone.
// Two drivers do this: cgroupsV1 on hosts that mount the v1 hierarchies,
// cgroupsV2 on unified (v2-only) hosts. chooseCgroups picks one at start
// from what the host has.
type cgroupDriver interface {
	// mode is "v1" or "v2"; controllers are the ones the jobs' cgroups
	// use, for the executor's health report.
	mode() string
	controllers() []string
	// parentPath maps the configured cgroup_parent to the path, relative
	// to each hierarchy's root, that holds the job cgroups.
	parentPath(configured string) string
	// prepareParent makes the parent of every job cgroup (rel), with the
	// controllers the jobs need and, if limit is positive, a memory limit
	// over all of them.
	prepareParent(rel string, limit int64) error
	// checkOutside fails if this process is in rel or below it.
	checkOutside(rel string) error
	// create makes rel with l's limits; dev, if set, is the block device
	// ("major:minor") io bounds the job's disk bandwidth on.
	create(rel string, l Limits, io ioLimits, dev string) error
	// createLeaf makes rel with l's memory, pids and CPU limits, for
	// processes the executor starts in it itself (procsFiles): on v2 it
	// hands no controller down, so processes may join it.
	createLeaf(rel string, l Limits) error
	// procsFiles are rel's cgroup.procs files, one in each hierarchy a job
	// cgroup is made in: a process that writes 0 to each is in rel.
	procsFiles(rel string) []string
	// runtimeBlockIO is what the runtime must set in its own cgroup to
	// bound the disk bandwidth, where the job's cgroup cannot.
	runtimeBlockIO(io ioLimits, dev string) *specs.LinuxBlockIO
	// setLimits changes rel's memory, pids and CPU limits from cur to l,
	// all or nothing; an error wrapping EBUSY means the memory limit
	// cannot go below what the job holds.
	setLimits(rel string, cur, l Limits) error
	// readLimits reads rel's limits back from the kernel.
	readLimits(rel string) (cgroupLimits, error)
	// watchOOM returns an eventfd signalled on rel's OOMs, or -1 where
	// the counters in stats outlive the runtime's child by themselves.
	watchOOM(rel string) (int, error)
	stats(rel string) cgroupStats
	// cpuTime and oomKills are what an exec reads before and after.
	cpuTime(rel string) time.Duration
	oomKills(rel string) int64
	// current is rel's memory and task count now, for the peaks where
	// the kernel keeps none (sampling says whether it is needed).
	current(rel string) (memory, pids int64)
	sampling() bool
	// procs lists the processes in rel and below; kill ends them all and
	// waits until none is left.
	procs(rel string) []int
	kill(rel string, wait time.Duration) error
	// remove deletes rel and everything below it; children lists the
	// cgroups directly below rel; removeParent deletes the (empty) parent.
	remove(rel string) error
	children(rel string) []string
	removeParent(rel string) error
	// dirs lists rel's directory in every hierarchy, for tests and checks.
	dirs(rel string) []string
	// fallBack makes the driver do without what older kernels lack (the
	// peaks it then samples, cgroup.kill), so tests run those paths.
	fallBack()
}

// ioLimits bound a job's disk bandwidth, in bytes per second; 0 is none.
type ioLimits struct {
	ReadBPS, WriteBPS int64
}

func (l ioLimits) set() bool { return l.ReadBPS > 0 || l.WriteBPS > 0 }

// cgroupLimits are the limits a job's cgroup holds, as the kernel reports
// them. SwapBytes is what the job may swap beyond MemoryBytes: always 0.
type cgroupLimits struct {
	MemoryBytes int64
	SwapBytes   int64
	Pids        int64
	CPUMillis   int64
	ReadBPS     int64
	WriteBPS    int64
}

// cgroupStats are the counters of a job's cgroup.
type cgroupStats struct {
	cpu        time.Duration
	peakMemory int64
	oomKills   int64
	peakPids   int64
	pidsMaxHit int64
}

const cfsPeriodMicros = 100000

// runtimeCgroup is the name of the child handed to the runtime.
const runtimeCgroup = "ctr"

// cgroupHost is what the driver choice reads of the host: its mounts, this
// process's /proc/self/cgroup and a way to read the cgroup files.
type cgroupHost struct {
	mounts   []mount
	self     string
	readFile func(string) ([]byte, error)
}

func discoverCgroups() (cgroupDriver, error) {
	ms, err := readMounts()
	if err != nil {
		return nil, err
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	return chooseCgroups(cgroupHost{mounts: ms, self: string(self), readFile: os.ReadFile})
}

// chooseCgroups picks the driver: v2 where /sys/fs/cgroup is the unified
// hierarchy, v1 where the v1 hierarchies are mounted (a "hybrid" host's
// cgroup2 mount beside them, with no controllers, is left alone). It fails
// naming what is missing.
func chooseCgroups(h cgroupHost) (cgroupDriver, error) {
	for _, m := range h.mounts {
		if m.point == unifiedMount && m.fstype == "cgroup2" {
			return newCgroupsV2(h, m)
		}
	}
	return newCgroupsV1(h.mounts)
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// readKey reads "key value" lines and returns key's value.
func readKey(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// procsUnder lists the processes in the cgroup directory root and every
// cgroup below it.
func procsUnder(root string) []int {
	var out []int
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		out = append(out, pidsIn(p)...)
		return nil
	})
	return out
}

// pidsIn lists the processes in the cgroup directory dir alone.
func pidsIn(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// freezeWait bounds how long a kill waits for its freeze to take hold: a
// task in uninterruptible sleep can hold it back, and the kills are sent
// regardless once it has passed.
const freezeWait = 200 * time.Millisecond

// awaitFrozen waits, up to freezeWait, until state says the cgroup a kill
// froze is frozen. Another kill of the same cgroup may have thawed it
// meanwhile (state's thawed): that kill froze it, sent SIGKILL to every
// process in it and thawed it, so nothing in it can fork any more (a
// process with SIGKILL pending cannot) and this kill goes on at once.
// Freezing again would wait on the dying processes, and waiting for the
// freeze would wait out freezeWait for nothing.
func awaitFrozen(state func() (frozen, thawed bool)) {
	for end := time.Now().Add(freezeWait); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if frozen, thawed := state(); frozen || thawed {
			return
		}
	}
}

// killLeft sends SIGKILL to what is left under root until nothing is, or
// wait passes.
func killLeft(rel, root string, wait time.Duration) error {
	end := time.Now().Add(wait)
	for {
		left := procsUnder(root)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("cgroup %s: %d processes still alive after SIGKILL", rel, len(left))
		}
		for _, pid := range left {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// rmdirTree removes a cgroup directory bottom-up. Cgroup directories hold
// only virtual files, so rmdir is the whole removal; a just-killed task can
// keep one busy for a moment.
func rmdirTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		for try := 0; try < 200; try++ {
			err = unix.Rmdir(dirs[i])
			if err == nil || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
		}
	}
	return nil
}

// childDirs lists the directory names directly below each of dirs.
func childDirs(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(out, e.Name()) {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// rmdirEach removes each of dirs, which must be empty; one already gone is
// fine.
func rmdirEach(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup parent %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// writeCgroupFile writes value to a cgroup file, naming both on error.
func writeCgroupFile(dir, rel, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup %s: set %s=%s: %w", rel, file, value, err)
	}
	return nil
}

// blockDevice returns "major:minor" of the block device at path.
func blockDevice(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", fmt.Errorf("%s is not a block device", path)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), nil
}

// CgroupInfo says how this executor uses cgroups.
type CgroupInfo struct {
	// Mode is "v1" or "v2".
	Mode string
	// Controllers are the controllers job cgroups use.
	Controllers []string
	// Parent is the cgroup, relative to the hierarchy root, that holds the
	// job cgroups.
	Parent string
}

// Cgroups reports the cgroup mode and controllers in use.
func (m *Manager) Cgroups() CgroupInfo {
	return CgroupInfo{Mode: m.cg.mode(), Controllers: m.cg.controllers(), Parent: m.cgParent}
}
