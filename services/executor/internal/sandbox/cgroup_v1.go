package sandbox

import (
	"encoding/binary"
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

// The v1 controllers a job's own cgroup lives in; blkio too where it is
// mounted, for the disk bandwidth bounds.
var jobControllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// cgroupsV1 drives the v1 hierarchies. The runtime deletes its child when
// the container ends, and the counters outlive it in the job's cgroup
// (the OOM count excepted: watchOOM).
type cgroupsV1 struct {
	// ctls maps a v1 controller to its hierarchy's mount point.
	ctls map[string]string
	// used are the controllers job cgroups are made in.
	used []string
	// roots is every cgroup mount point, v1 and v2, named ones included: a
	// runtime makes directories in all of them, and all must be removed.
	roots []string
	// noPeaks samples the peaks instead of reading the kernel's (fallBack).
	noPeaks bool
}

func newCgroupsV1(ms []mount) (*cgroupsV1, error) {
	c := &cgroupsV1{ctls: map[string]string{}}
	seen := map[string]bool{}
	for _, m := range ms {
		if m.fstype != "cgroup" && m.fstype != "cgroup2" {
			continue
		}
		if m.root != "/" {
			// Only a hierarchy mounted from its root has the absolute
			// paths the runtime's cgroupsPath names.
			continue
		}
		if !seen[m.point] {
			seen[m.point] = true
			c.roots = append(c.roots, m.point)
		}
		if m.fstype == "cgroup" {
			for _, opt := range strings.Split(m.superOptions, ",") {
				if _, ok := c.ctls[opt]; !ok {
					c.ctls[opt] = m.point
				}
			}
		}
	}
	for _, ctl := range jobControllers {
		if _, ok := c.ctls[ctl]; !ok {
			return nil, fmt.Errorf("cgroups: no v1 hierarchy with the %s controller is mounted (and %s is not the cgroup v2 hierarchy)", ctl, unifiedMount)
		}
	}
	c.used = slices.Clone(jobControllers)
	if _, ok := c.ctls["blkio"]; ok {
		c.used = append(c.used, "blkio")
	}
	return c, nil
}

func (c *cgroupsV1) mode() string                        { return "v1" }
func (c *cgroupsV1) controllers() []string               { return slices.Clone(c.used) }
func (c *cgroupsV1) parentPath(configured string) string { return configured }
func (c *cgroupsV1) sampling() bool                      { return c.noPeaks }
func (c *cgroupsV1) fallBack()                           { c.noPeaks = true }

func (c *cgroupsV1) dirs(rel string) []string {
	var out []string
	for _, root := range c.roots {
		out = append(out, filepath.Join(root, rel))
	}
	return out
}

func (c *cgroupsV1) current(rel string) (int64, int64) {
	return readInt(filepath.Join(c.dir("memory", rel), "memory.usage_in_bytes")),
		readInt(filepath.Join(c.dir("pids", rel), "pids.current"))
}

func (c *cgroupsV1) dir(ctl, rel string) string { return filepath.Join(c.ctls[ctl], rel) }

// create makes rel in every job controller and sets the limits. It fails if
// rel exists: a leftover of a crashed executor that Recover has not removed.
func (c *cgroupsV1) create(rel string, l Limits, _ ioLimits, _ string) error {
	for _, ctl := range c.used {
		d := c.dir(ctl, rel)
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", ctl, err)
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s %s: %w", ctl, rel, err)
		}
	}
	mem := strconv.FormatInt(l.MemoryBytes, 10)
	writes := []struct{ ctl, file, value string }{
		{"memory", "memory.limit_in_bytes", mem},
		// memsw bounds memory plus swap; equal to the limit, no swap.
		{"memory", "memory.memsw.limit_in_bytes", mem},
		{"pids", "pids.max", strconv.FormatInt(l.Pids, 10)},
		{"cpu", "cpu.cfs_period_us", strconv.Itoa(cfsPeriodMicros)},
		{"cpu", "cpu.cfs_quota_us", strconv.FormatInt(l.CPUMillis*cfsPeriodMicros/1000, 10)},
	}
	for _, w := range writes {
		err := os.WriteFile(filepath.Join(c.dir(w.ctl, rel), w.file), []byte(w.value), 0)
		if err != nil && !(w.file == "memory.memsw.limit_in_bytes" && errors.Is(err, fs.ErrNotExist)) {
			return fmt.Errorf("cgroup %s: set %s=%s: %w", rel, w.file, w.value, err)
		}
	}
	return nil
}

func (c *cgroupsV1) createLeaf(rel string, l Limits) error { return c.create(rel, l, ioLimits{}, "") }

func (c *cgroupsV1) procsFiles(rel string) []string {
	var out []string
	for _, ctl := range c.used {
		if f := filepath.Join(c.dir(ctl, rel), "cgroup.procs"); !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// prepareParent bounds the memory of rel, the parent of every job's
// cgroup, to limit bytes, making rel if it does not exist. Job cgroups are
// made below it afterwards, so its memory.use_hierarchy can still be turned
// on where the kernel leaves it off: without it a parent's limit does not
// cover its children. The other hierarchies' parents are made with the
// first job.
func (c *cgroupsV1) prepareParent(rel string, limit int64) error {
	if limit <= 0 {
		return nil
	}
	dir := c.dir("memory", rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cgroup memory: %w", err)
	}
	hier := filepath.Join(dir, "memory.use_hierarchy")
	if b, err := os.ReadFile(hier); err == nil && strings.TrimSpace(string(b)) == "0" {
		if err := os.WriteFile(hier, []byte("1"), 0); err != nil {
			return fmt.Errorf("cgroup %s: set memory.use_hierarchy=1: %w", rel, err)
		}
	}
	// A parent left by an earlier executor may have another limit:
	// setLimits orders the writes for either direction.
	cur := readInt(filepath.Join(dir, "memory.limit_in_bytes"))
	return c.setLimits(rel, Limits{MemoryBytes: cur}, Limits{MemoryBytes: limit})
}

// checkOutside fails if this process is in rel or below it in a job
// controller's hierarchy: job limits there would bound the executor, and
// Recover would kill it as a leftover job.
func (c *cgroupsV1) checkOutside(rel string) error {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		// hierarchy-id:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			if slices.Contains(jobControllers, ctl) && (f[2] == rel || strings.HasPrefix(f[2], rel+"/")) {
				return fmt.Errorf("the executor itself is in %s cgroup %s; job cgroups must be made elsewhere", ctl, f[2])
			}
		}
	}
	return nil
}

// setLimits changes rel's memory, pids and CPU limits from cur to l. On
// any failure it puts back what it had already written, so cur stays in
// force, and returns the write's error: EBUSY when the kernel cannot
// reclaim the job's memory down to a lower limit.
func (c *cgroupsV1) setLimits(rel string, cur, l Limits) error {
	type write struct {
		ctl, file string
		old, new  int64
	}
	var ws []write
	if l.MemoryBytes != cur.MemoryBytes {
		mem := write{"memory", "memory.limit_in_bytes", cur.MemoryBytes, l.MemoryBytes}
		sw := write{"memory", "memory.memsw.limit_in_bytes", cur.MemoryBytes, l.MemoryBytes}
		// The kernel refuses memsw below the memory limit: it goes up
		// first and down last. Memory goes before pids and CPU because it
		// is the one a live job can refuse.
		if l.MemoryBytes > cur.MemoryBytes {
			ws = append(ws, sw, mem)
		} else {
			ws = append(ws, mem, sw)
		}
	}
	if l.Pids != cur.Pids {
		ws = append(ws, write{"pids", "pids.max", cur.Pids, l.Pids})
	}
	if l.CPUMillis != cur.CPUMillis {
		ws = append(ws, write{"cpu", "cpu.cfs_quota_us", cur.CPUMillis * cfsPeriodMicros / 1000, l.CPUMillis * cfsPeriodMicros / 1000})
	}
	set := func(w write, v int64) error {
		err := os.WriteFile(filepath.Join(c.dir(w.ctl, rel), w.file), []byte(strconv.FormatInt(v, 10)), 0)
		if err != nil && w.file == "memory.memsw.limit_in_bytes" && errors.Is(err, fs.ErrNotExist) {
			return nil // no swap accounting: nothing to bound
		}
		return err
	}
	for i, w := range ws {
		if err := set(w, w.new); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = set(ws[j], ws[j].old)
			}
			return fmt.Errorf("cgroup %s: set %s=%d: %w", rel, w.file, w.new, err)
		}
	}
	return nil
}

// watchOOM registers an eventfd that the kernel signals whenever rel's
// memory cgroup runs out of memory. The oom_kill counter in
// memory.oom_control cannot say it: it counts only kills of tasks in that
// very cgroup, and the job's tasks live in the runtime's child, which the
// runtime deletes with its counter when the container ends.
func (c *cgroupsV1) watchOOM(rel string) (int, error) {
	dir := c.dir("memory", rel)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("oom eventfd: %w", err)
	}
	ctl, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		unix.Close(efd)
		return -1, err
	}
	defer ctl.Close()
	reg := fmt.Sprintf("%d %d", efd, ctl.Fd())
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(reg), 0); err != nil {
		unix.Close(efd)
		return -1, fmt.Errorf("register oom notification: %w", err)
	}
	return efd, nil
}

// oomEvents reads (and resets) the count of OOM notifications on efd.
func oomEvents(efd int) uint64 {
	if efd < 0 {
		return 0
	}
	var buf [8]byte
	if n, err := unix.Read(efd, buf[:]); err != nil || n != 8 {
		return 0
	}
	return binary.NativeEndian.Uint64(buf[:])
}

func (c *cgroupsV1) stats(rel string) cgroupStats {
	var s cgroupStats
	s.cpu = c.cpuTime(rel)
	if !c.noPeaks {
		s.peakMemory = readInt(filepath.Join(c.dir("memory", rel), "memory.max_usage_in_bytes"))
		s.peakPids = readInt(filepath.Join(c.dir("pids", rel), "pids.peak"))
	}
	s.oomKills = c.oomKills(rel)
	s.pidsMaxHit = readKey(filepath.Join(c.dir("pids", rel), "pids.events"), "max")
	return s
}

// cpuTime is rel's CPU time, the one statistic an exec reads besides its
// OOM kills: an exec reads them before and after, so it reads no others.
func (c *cgroupsV1) cpuTime(rel string) time.Duration {
	return time.Duration(readInt(filepath.Join(c.dir("cpuacct", rel), "cpuacct.usage")))
}

// runtimeBlockIO hands the disk bandwidth bounds to the runtime for its
// own cgroup: v1 throttling is not hierarchical, so bounds on the job's
// cgroup would not bind the tasks in the child. It binds direct I/O only:
// v1 does not charge page cache writeback to the cgroup that dirtied it.
func (c *cgroupsV1) runtimeBlockIO(io ioLimits, dev string) *specs.LinuxBlockIO {
	if !io.set() || dev == "" {
		return nil
	}
	var major, minor int64
	if _, err := fmt.Sscanf(dev, "%d:%d", &major, &minor); err != nil {
		return nil
	}
	var b specs.LinuxBlockIO
	at := func(rate int64) []specs.LinuxThrottleDevice {
		if rate <= 0 {
			return nil
		}
		d := specs.LinuxThrottleDevice{Rate: uint64(rate)}
		d.Major, d.Minor = major, minor
		return []specs.LinuxThrottleDevice{d}
	}
	b.ThrottleReadBpsDevice, b.ThrottleWriteBpsDevice = at(io.ReadBPS), at(io.WriteBPS)
	return &b
}

// oomKills counts the OOM kills in rel and in the runtime's child below
// it: a v1 memory cgroup counts only kills of its own tasks.
func (c *cgroupsV1) oomKills(rel string) int64 {
	return readKey(filepath.Join(c.dir("memory", rel), "memory.oom_control"), "oom_kill") +
		readKey(filepath.Join(c.dir("memory", filepath.Join(rel, runtimeCgroup)), "memory.oom_control"), "oom_kill")
}

// readLimits reads rel's limits back; the memsw limit must equal the
// memory limit (no swap), where the kernel accounts swap.
func (c *cgroupsV1) readLimits(rel string) (cgroupLimits, error) {
	var l cgroupLimits
	mem := c.dir("memory", rel)
	read := func(dir, file string) (int64, error) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	var err error
	if l.MemoryBytes, err = read(mem, "memory.limit_in_bytes"); err != nil {
		return l, err
	}
	if sw, err := read(mem, "memory.memsw.limit_in_bytes"); err == nil {
		l.SwapBytes = sw - l.MemoryBytes
	} else if !errors.Is(err, fs.ErrNotExist) {
		return l, err
	}
	if l.Pids, err = read(c.dir("pids", rel), "pids.max"); err != nil {
		return l, err
	}
	quota, err := read(c.dir("cpu", rel), "cpu.cfs_quota_us")
	if err != nil {
		return l, err
	}
	period, err := read(c.dir("cpu", rel), "cpu.cfs_period_us")
	if err != nil || period <= 0 {
		return l, fmt.Errorf("cpu.cfs_period_us: %v", err)
	}
	l.CPUMillis = quota * 1000 / period
	if slices.Contains(c.used, "blkio") {
		// Throttling is flat in v1: its bounds sit on the runtime's child
		// (runtimeBlockIO), there while the job runs.
		ctr := c.dir("blkio", filepath.Join(rel, runtimeCgroup))
		l.ReadBPS = throttleValue(filepath.Join(ctr, "blkio.throttle.read_bps_device"))
		l.WriteBPS = throttleValue(filepath.Join(ctr, "blkio.throttle.write_bps_device"))
	}
	return l, nil
}

// throttleValue reads a "major:minor value" file's first value; 0 if none.
func throttleValue(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n
}

// procs lists the processes in rel and every cgroup below it.
func (c *cgroupsV1) procs(rel string) []int { return procsUnder(c.dir("freezer", rel)) }

// kill ends every process in rel and below. It freezes the tree first so
// nothing can fork between reading the process list and the kills (a fork
// bomb would otherwise outrun it), sends SIGKILL to every process, thaws so
// the signals are delivered, and waits until the cgroups are empty.
func (c *cgroupsV1) kill(rel string, wait time.Duration) error {
	if len(c.procs(rel)) == 0 {
		return nil
	}
	state := filepath.Join(c.dir("freezer", rel), "freezer.state")
	frozen := os.WriteFile(state, []byte("FROZEN"), 0) == nil
	if frozen {
		awaitFrozen(func() (bool, bool) {
			b, _ := os.ReadFile(state)
			s := strings.TrimSpace(string(b))
			return s == "FROZEN", s == "THAWED"
		})
	}
	for _, pid := range c.procs(rel) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	if frozen {
		_ = os.WriteFile(state, []byte("THAWED"), 0)
	}
	return killLeft(rel, c.dir("freezer", rel), wait)
}

// remove deletes rel and everything below it from every hierarchy,
// including those where only the runtime made directories.
func (c *cgroupsV1) remove(rel string) error {
	var errs []error
	for _, root := range c.roots {
		if err := rmdirTree(filepath.Join(root, rel)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// children lists the cgroup names directly below rel in any hierarchy.
func (c *cgroupsV1) children(rel string) []string { return childDirs(c.dirs(rel)) }

// removeParent removes rel, the emptied parent, from every hierarchy.
func (c *cgroupsV1) removeParent(rel string) error { return rmdirEach(c.dirs(rel)) }
