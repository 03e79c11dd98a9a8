package sandbox

import (
	"bufio"
	"bytes"
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

	"golang.org/x/sys/unix"
)

// The v1 controllers a job's own cgroup lives in. The limits and the usage
// counters sit in that cgroup, which this package owns; the runtime gets a
// child of it without limits. The runtime deletes its child when the
// container ends, and the counters outlive it for Usage and the OOM reason.
var jobControllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// runtimeCgroup is the name of the child handed to the runtime.
const runtimeCgroup = "ctr"

const cfsPeriodMicros = 100000

// cgroups knows where each cgroup hierarchy is mounted.
type cgroups struct {
	// controllers maps a v1 controller to its hierarchy's mount point.
	controllers map[string]string
	// roots is every cgroup mount point, v1 and v2, named ones included: a
	// runtime makes directories in all of them, and all must be removed.
	roots []string
}

func discoverCgroups() (*cgroups, error) {
	ms, err := readMounts()
	if err != nil {
		return nil, err
	}
	c := &cgroups{controllers: map[string]string{}}
	seen := map[string]bool{}
	for _, m := range ms {
		switch m.fstype {
		case "cgroup2":
			if m.point == "/sys/fs/cgroup" {
				return nil, errors.New("cgroups: this host runs cgroup v2 only; the sandbox needs the v1 hierarchies")
			}
		case "cgroup":
		default:
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
				if _, ok := c.controllers[opt]; !ok {
					c.controllers[opt] = m.point
				}
			}
		}
	}
	for _, ctl := range jobControllers {
		if _, ok := c.controllers[ctl]; !ok {
			return nil, fmt.Errorf("cgroups: no v1 hierarchy with the %s controller is mounted", ctl)
		}
	}
	return c, nil
}

func (c *cgroups) dir(ctl, rel string) string { return filepath.Join(c.controllers[ctl], rel) }

// create makes rel in every job controller and sets the limits. It fails if
// rel exists: a leftover of a crashed executor that Recover has not removed.
func (c *cgroups) create(rel string, l Limits) error {
	for _, ctl := range jobControllers {
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

// limitParent bounds the memory of rel, the parent of every job's cgroup,
// to limit bytes, making rel if it does not exist. Job cgroups are made
// below it afterwards, so its memory.use_hierarchy can still be turned on
// where the kernel leaves it off: without it a parent's limit does not
// cover its children.
func (c *cgroups) limitParent(rel string, limit int64) error {
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
func (c *cgroups) checkOutside(rel string) error {
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
func (c *cgroups) setLimits(rel string, cur, l Limits) error {
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
func (c *cgroups) watchOOM(rel string) (int, error) {
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

// cgroupStats are the counters of a job's cgroup.
type cgroupStats struct {
	cpu        time.Duration
	peakMemory int64
	oomKills   int64
	peakPids   int64
	pidsMaxHit int64
}

func (c *cgroups) stats(rel string) cgroupStats {
	var s cgroupStats
	s.cpu = c.cpuTime(rel)
	s.peakMemory = readInt(filepath.Join(c.dir("memory", rel), "memory.max_usage_in_bytes"))
	s.oomKills = c.oomKills(rel)
	s.peakPids = readInt(filepath.Join(c.dir("pids", rel), "pids.peak"))
	s.pidsMaxHit = readKey(filepath.Join(c.dir("pids", rel), "pids.events"), "max")
	return s
}

// cpuTime is rel's CPU time, the one statistic an exec reads besides its
// OOM kills: an exec reads them before and after, so it reads no others.
func (c *cgroups) cpuTime(rel string) time.Duration {
	return time.Duration(readInt(filepath.Join(c.dir("cpuacct", rel), "cpuacct.usage")))
}

// oomKills counts the OOM kills in rel.
func (c *cgroups) oomKills(rel string) int64 {
	return readKey(filepath.Join(c.dir("memory", rel), "memory.oom_control"), "oom_kill")
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

// procs lists the processes in rel and every cgroup below it.
func (c *cgroups) procs(rel string) []int {
	var out []int
	root := c.dir("freezer", rel)
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out
}

// kill ends every process in rel and below. It freezes the tree first so
// nothing can fork between reading the process list and the kills (a fork
// bomb would otherwise outrun it), sends SIGKILL to every process, thaws so
// the signals are delivered, and waits until the cgroups are empty.
func (c *cgroups) kill(rel string, wait time.Duration) error {
	if len(c.procs(rel)) == 0 {
		return nil
	}
	state := filepath.Join(c.dir("freezer", rel), "freezer.state")
	frozen := os.WriteFile(state, []byte("FROZEN"), 0) == nil
	if frozen {
		// A task in uninterruptible sleep can hold FREEZING for a while;
		// the kills below are sent regardless.
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
			if b, _ := os.ReadFile(state); strings.TrimSpace(string(b)) == "FROZEN" {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	for _, pid := range c.procs(rel) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	if frozen {
		_ = os.WriteFile(state, []byte("THAWED"), 0)
	}
	end := time.Now().Add(wait)
	for {
		left := c.procs(rel)
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

// remove deletes rel and everything below it from every hierarchy,
// including those where only the runtime made directories.
func (c *cgroups) remove(rel string) error {
	var errs []error
	for _, root := range c.roots {
		if err := rmdirTree(filepath.Join(root, rel)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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

// children lists the cgroup names directly below rel in any hierarchy.
func (c *cgroups) children(rel string) []string {
	seen := map[string]bool{}
	var out []string
	for _, root := range c.roots {
		ents, err := os.ReadDir(filepath.Join(root, rel))
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				out = append(out, e.Name())
			}
		}
	}
	return out
}
