package sandbox

import (
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

// unifiedMount is where runc and runsc look for the cgroup v2 hierarchy.
const unifiedMount = "/sys/fs/cgroup"

// supervisorCgroup is the leaf the executor moves itself into on v2, so
// that its own cgroup, the root of the subtree it was given, holds no
// process and can hand controllers down ("no internal processes").
const supervisorCgroup = "supervisor"

// v2Required are the controllers job cgroups need on v2; io is used where
// it is delegated too (disk bandwidth bounds need it).
var v2Required = []string{"memory", "pids", "cpu"}

// cgroupsV2 drives the unified hierarchy. It works only inside the subtree
// it is given, the executor's own cgroup when it starts (a systemd unit's
// with Delegate=yes, or a container's cgroup namespace): the job parent is
// made below it, and nothing above it is written.
type cgroupsV2 struct {
	// root is the mount point; base is the executor's own cgroup, the
	// delegated subtree, relative to it ("/" for the whole hierarchy).
	root string
	base string
	used []string
	// mountRoot is the cgroup the hierarchy is mounted from ("/" but in a
	// container without a cgroup namespace of its own): /proc/self/cgroup
	// names cgroups from the real root.
	mountRoot string
	// Whether the kernel keeps memory.peak (5.19) and pids.peak (newer),
	// without which the peaks are sampled, and has cgroup.kill (5.14);
	// prepareParent finds out.
	memPeak, pidsPeak, killFile bool
}

func newCgroupsV2(h cgroupHost, m mount) (*cgroupsV2, error) {
	if slices.Contains(strings.Split(m.superOptions, ","), "memory_localevents") {
		return nil, fmt.Errorf("cgroups: %s is mounted with memory_localevents, so a job cgroup's memory.events misses the OOM kills in the runtime's child, gone by the time they are read; remount it without that option", unifiedMount)
	}
	abs := unifiedPath(h.self)
	if !strings.HasPrefix(abs, "/") {
		return nil, fmt.Errorf("cgroups: %s is the cgroup v2 hierarchy, but /proc/self/cgroup names no v2 cgroup for this process", unifiedMount)
	}
	self, ok := belowMount(abs, m.root)
	if !ok {
		return nil, fmt.Errorf("cgroups: this process's cgroup %s is outside the cgroup v2 hierarchy mounted at %s (from %s)", abs, unifiedMount, m.root)
	}
	// A process started from the leaf of an earlier executor (a restart
	// from inside it) takes that executor's subtree.
	if filepath.Base(self) == supervisorCgroup {
		self = filepath.Dir(self)
	}
	c := &cgroupsV2{root: unifiedMount, base: self, mountRoot: m.root}
	b, err := h.readFile(filepath.Join(c.root, self, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("cgroups: read the controllers of this process's cgroup: %w", err)
	}
	have := strings.Fields(string(b))
	for _, ctl := range v2Required {
		if !slices.Contains(have, ctl) {
			return nil, fmt.Errorf("cgroups: the %s controller is not available in this process's cgroup %s (it has: %s); "+
				"delegate it: run the executor from a systemd unit with Delegate=yes (or start it with `systemd-run --scope -p Delegate=yes EXECUTOR...`), or, by hand, write +%s to cgroup.subtree_control of every cgroup above %s",
				ctl, self, orNone(have), ctl, self)
		}
	}
	c.used = slices.Clone(v2Required)
	if slices.Contains(have, "io") {
		c.used = append(c.used, "io")
	}
	return c, nil
}

// unifiedPath is the cgroup v2 path in a /proc/PID/cgroup ("0::PATH"), or
// "" if it names none.
func unifiedPath(procCgroup string) string {
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return rest
		}
	}
	return ""
}

// belowMount maps a cgroup path from /proc (from the real root) to one
// relative to a hierarchy mounted from mountRoot ("/" but in a container
// without a cgroup namespace of its own); false if it is outside.
func belowMount(path, mountRoot string) (string, bool) {
	if mountRoot == "/" {
		return path, true
	}
	if path != mountRoot && !strings.HasPrefix(path, mountRoot+"/") {
		return "", false
	}
	return "/" + strings.TrimPrefix(strings.TrimPrefix(path, mountRoot), "/"), true
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}

// moveSelf moves this whole process (every thread) into dir.
func moveSelf(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
}

func (c *cgroupsV2) mode() string          { return "v2" }
func (c *cgroupsV2) controllers() []string { return slices.Clone(c.used) }
func (c *cgroupsV2) sampling() bool        { return !c.memPeak || !c.pidsPeak }
func (c *cgroupsV2) fallBack()             { c.memPeak, c.pidsPeak, c.killFile = false, false, false }

// parentPath puts the configured parent below the delegated subtree.
func (c *cgroupsV2) parentPath(configured string) string { return filepath.Join(c.base, configured) }

func (c *cgroupsV2) dir(rel string) string    { return filepath.Join(c.root, rel) }
func (c *cgroupsV2) dirs(rel string) []string { return []string{c.dir(rel)} }

// enable hands the job controllers down from dir's cgroup to its children.
func (c *cgroupsV2) enable(dir, rel string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", rel, err)
	}
	on := strings.Fields(string(b))
	var add []string
	for _, ctl := range c.used {
		if !slices.Contains(on, ctl) {
			add = append(add, "+"+ctl)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return writeCgroupFile(dir, rel, "cgroup.subtree_control", strings.Join(add, " "))
}

// prepareParent makes rel below the delegated subtree with the job
// controllers handed down at every level. The subtree's own cgroup can
// hand them down only once no process is in it: the executor moves itself
// into the supervisor leaf first where it is not the hierarchy's root
// (which is exempt).
func (c *cgroupsV2) prepareParent(rel string, limit int64) error {
	if rel != c.base && !strings.HasPrefix(rel, strings.TrimSuffix(c.base, "/")+"/") {
		return fmt.Errorf("cgroup %s is outside this executor's subtree %s", rel, c.base)
	}
	if err := c.enable(c.dir(c.base), c.base); err != nil {
		if !errors.Is(err, unix.EBUSY) {
			return err
		}
		leaf := c.dir(filepath.Join(c.base, supervisorCgroup))
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", leaf, err)
		}
		if err := moveSelf(leaf); err != nil {
			return fmt.Errorf("move the executor into %s: %w", leaf, err)
		}
		if err := c.enable(c.dir(c.base), c.base); err != nil {
			if errors.Is(err, unix.EBUSY) {
				others := pidsIn(c.dir(c.base))
				return fmt.Errorf("cgroup %s holds other processes (%v) besides the executor; "+
					"the executor needs the cgroup it is started in to itself: run it from a systemd unit with Delegate=yes, "+
					"or start it with `systemd-run --scope -p Delegate=yes EXECUTOR...`: %w", c.base, others, err)
			}
			return err
		}
	}
	// Every level from the subtree down to the parent hands the
	// controllers down.
	cur := c.base
	for _, part := range strings.Split(strings.TrimPrefix(strings.TrimPrefix(rel, c.base), "/"), "/") {
		if part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(c.dir(cur), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", cur, err)
		}
		if err := c.enable(c.dir(cur), cur); err != nil {
			return err
		}
	}
	// What this kernel keeps shows in any cgroup but the root.
	has := func(file string) bool {
		_, err := os.Stat(filepath.Join(c.dir(rel), file))
		return err == nil
	}
	c.killFile, c.memPeak, c.pidsPeak = has("cgroup.kill"), has("memory.peak"), has("pids.peak")
	// A parent left by an earlier executor may hold another limit.
	memMax := "max"
	if limit > 0 {
		memMax = strconv.FormatInt(limit, 10)
	}
	if err := writeCgroupFile(c.dir(rel), rel, "memory.max", memMax); err != nil {
		return err
	}
	return c.noSwap(rel)
}

// noSwap bounds rel's swap to none: memory.swap.max counts swap alone, so
// 0 keeps the job within its memory limit. Without swap accounting there
// is no file and nothing to bound.
func (c *cgroupsV2) noSwap(rel string) error {
	err := writeCgroupFile(c.dir(rel), rel, "memory.swap.max", "0")
	if err != nil && errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// checkOutside fails if this process is in rel or below it.
func (c *cgroupsV2) checkOutside(rel string) error {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	self, ok := belowMount(unifiedPath(string(b)), c.mountRoot)
	if ok && (self == rel || strings.HasPrefix(self, strings.TrimSuffix(rel, "/")+"/")) {
		return fmt.Errorf("the executor itself is in cgroup %s; job cgroups must be made elsewhere", self)
	}
	return nil
}

func cpuMax(millis int64) string {
	return fmt.Sprintf("%d %d", millis*cfsPeriodMicros/1000, cfsPeriodMicros)
}

// create makes rel with its limits and hands the controllers down to the
// runtime's child. It fails if rel exists: a leftover Recover has not
// removed.
func (c *cgroupsV2) create(rel string, l Limits, io ioLimits, dev string) error {
	if err := c.makeCgroup(rel, l, io, dev); err != nil {
		return err
	}
	return c.enable(c.dir(rel), rel)
}

func (c *cgroupsV2) procsFiles(rel string) []string {
	return []string{filepath.Join(c.dir(rel), "cgroup.procs")}
}

// createLeaf is create without handing the controllers down: a cgroup
// that hands them down may hold no process ("no internal processes"). The
// disk bandwidth bounds of the job's cgroup above it bind it already.
func (c *cgroupsV2) createLeaf(rel string, l Limits) error {
	return c.makeCgroup(rel, l, ioLimits{}, "")
}

// makeCgroup makes rel with its limits.
func (c *cgroupsV2) makeCgroup(rel string, l Limits, io ioLimits, dev string) error {
	dir := c.dir(rel)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("cgroup %s: %w", rel, err)
	}
	writes := [][2]string{
		{"memory.max", strconv.FormatInt(l.MemoryBytes, 10)},
		{"pids.max", strconv.FormatInt(l.Pids, 10)},
		{"cpu.max", cpuMax(l.CPUMillis)},
	}
	if io.set() && dev != "" {
		if !slices.Contains(c.used, "io") {
			return fmt.Errorf("cgroup %s: disk bandwidth limits need the io controller, which is not delegated to the executor's cgroup %s", rel, c.base)
		}
		v := dev
		if io.ReadBPS > 0 {
			v += fmt.Sprintf(" rbps=%d", io.ReadBPS)
		}
		if io.WriteBPS > 0 {
			v += fmt.Sprintf(" wbps=%d", io.WriteBPS)
		}
		writes = append(writes, [2]string{"io.max", v})
	}
	for _, w := range writes {
		if err := writeCgroupFile(dir, rel, w[0], w[1]); err != nil {
			return err
		}
	}
	return c.noSwap(rel)
}

// setLimits changes rel's limits from cur to l, all or nothing. A lower
// memory limit goes first, through shrinkTo, since it is the one a live
// job can refuse.
func (c *cgroupsV2) setLimits(rel string, cur, l Limits) error {
	dir := c.dir(rel)
	type write struct {
		file     string
		old, new string
	}
	var done, ws []write
	memory := write{"memory.max", strconv.FormatInt(cur.MemoryBytes, 10), strconv.FormatInt(l.MemoryBytes, 10)}
	switch {
	case l.MemoryBytes < cur.MemoryBytes:
		if err := c.shrinkTo(rel, l.MemoryBytes); err != nil {
			return err
		}
		done = append(done, memory)
	case l.MemoryBytes > cur.MemoryBytes:
		ws = append(ws, memory)
	}
	if l.Pids != cur.Pids {
		ws = append(ws, write{"pids.max", strconv.FormatInt(cur.Pids, 10), strconv.FormatInt(l.Pids, 10)})
	}
	if l.CPUMillis != cur.CPUMillis {
		ws = append(ws, write{"cpu.max", cpuMax(cur.CPUMillis), cpuMax(l.CPUMillis)})
	}
	for _, w := range ws {
		if err := writeCgroupFile(dir, rel, w.file, w.new); err != nil {
			for j := len(done) - 1; j >= 0; j-- {
				_ = writeCgroupFile(dir, rel, done[j].file, done[j].old)
			}
			return err
		}
		done = append(done, w)
	}
	return nil
}

// shrinkWait bounds how long shrinkTo waits for a job's memory to come
// down to a lower limit.
const shrinkWait = time.Second

// shrinkTo lowers rel's memory.max to limit, or fails with EBUSY leaving
// it as it was. Lowered below the usage, memory.max makes the kernel
// reclaim and then OOM-kill, where v1 refuses; memory.high reclaims and
// throttles but never kills. So shrinkTo refuses at once when the job
// holds more than limit that no reclaim can free (with no swap: anonymous
// and shared memory, and the kernel's own for it); otherwise it sets
// memory.high to limit, waits up to shrinkWait for the usage to come
// down to it, and only then lowers memory.max, or puts memory.high back
// and refuses. (memory.reclaim is no way to wait: a job that keeps
// faulting its pages back in keeps it reclaiming while it runs.)
func (c *cgroupsV2) shrinkTo(rel string, limit int64) error {
	dir := c.dir(rel)
	lower := func() error { return writeCgroupFile(dir, rel, "memory.max", strconv.FormatInt(limit, 10)) }
	if readInt(filepath.Join(dir, "memory.current")) <= limit {
		return lower()
	}
	held, err := unreclaimable(dir)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", rel, err)
	}
	if held > limit {
		return fmt.Errorf("cgroup %s: memory.max=%d: the job holds %d bytes no reclaim can free: %w", rel, limit, held, unix.EBUSY)
	}
	if err := writeCgroupFile(dir, rel, "memory.high", strconv.FormatInt(limit, 10)); err != nil {
		return err
	}
	defer writeCgroupFile(dir, rel, "memory.high", "max")
	for end := time.Now().Add(shrinkWait); ; time.Sleep(10 * time.Millisecond) {
		usage := readInt(filepath.Join(dir, "memory.current"))
		if usage <= limit {
			return lower()
		}
		if time.Now().After(end) {
			return fmt.Errorf("cgroup %s: memory.max=%d: the job still holds %d bytes after %s of reclaim: %w", rel, limit, usage, shrinkWait, unix.EBUSY)
		}
	}
}

// unreclaimable sums what a cgroup holds that no reclaim can free, swap
// being off: anonymous and shared memory and the kernel's own.
func unreclaimable(dir string) (int64, error) {
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, err
	}
	var held int64
	for _, line := range strings.Split(string(stat), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && slices.Contains([]string{"anon", "shmem", "kernel_stack", "pagetables", "percpu", "sock", "slab_unreclaimable"}, f[0]) {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			held += n
		}
	}
	return held, nil
}

// readLimits reads rel's limits back.
func (c *cgroupsV2) readLimits(rel string) (cgroupLimits, error) {
	var l cgroupLimits
	dir := c.dir(rel)
	read := func(file string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		return strings.TrimSpace(string(b)), err
	}
	num := func(file string) (int64, error) {
		s, err := read(file)
		if err != nil {
			return 0, err
		}
		if s == "max" {
			return -1, nil
		}
		return strconv.ParseInt(s, 10, 64)
	}
	var err error
	if l.MemoryBytes, err = num("memory.max"); err != nil {
		return l, err
	}
	if l.SwapBytes, err = num("memory.swap.max"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return l, err
	}
	if l.Pids, err = num("pids.max"); err != nil {
		return l, err
	}
	cpu, err := read("cpu.max")
	if err != nil {
		return l, err
	}
	var quota, period int64
	if _, err := fmt.Sscanf(cpu, "%d %d", &quota, &period); err != nil || period <= 0 {
		return l, fmt.Errorf("cpu.max %q: not a quota and period", cpu)
	}
	l.CPUMillis = quota * 1000 / period
	if iomax, err := read("io.max"); err == nil {
		for _, f := range strings.Fields(iomax) {
			if v, ok := strings.CutPrefix(f, "rbps="); ok && v != "max" {
				l.ReadBPS, _ = strconv.ParseInt(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(f, "wbps="); ok && v != "max" {
				l.WriteBPS, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return l, nil
}

// runtimeBlockIO is nil: io.max on the job's cgroup binds its whole
// subtree.
func (c *cgroupsV2) runtimeBlockIO(ioLimits, string) *specs.LinuxBlockIO { return nil }

// watchOOM needs no eventfd on v2: memory.events counts the OOM kills of
// the whole subtree, and the counts stay after the runtime's child goes.
func (c *cgroupsV2) watchOOM(string) (int, error) { return -1, nil }

func (c *cgroupsV2) stats(rel string) cgroupStats {
	dir := c.dir(rel)
	s := cgroupStats{
		cpu:        c.cpuTime(rel),
		oomKills:   c.oomKills(rel),
		pidsMaxHit: readKey(filepath.Join(dir, "pids.events"), "max"),
	}
	if c.memPeak {
		s.peakMemory = readInt(filepath.Join(dir, "memory.peak"))
	}
	if c.pidsPeak {
		s.peakPids = readInt(filepath.Join(dir, "pids.peak"))
	}
	return s
}

func (c *cgroupsV2) cpuTime(rel string) time.Duration {
	return time.Duration(readKey(filepath.Join(c.dir(rel), "cpu.stat"), "usage_usec")) * time.Microsecond
}

func (c *cgroupsV2) oomKills(rel string) int64 {
	return readKey(filepath.Join(c.dir(rel), "memory.events"), "oom_kill")
}

func (c *cgroupsV2) current(rel string) (int64, int64) {
	return readInt(filepath.Join(c.dir(rel), "memory.current")), readInt(filepath.Join(c.dir(rel), "pids.current"))
}

func (c *cgroupsV2) procs(rel string) []int { return procsUnder(c.dir(rel)) }

// kill freezes rel's tree so nothing forks while it is killed, then kills
// it whole with cgroup.kill (5.14), or else process by process and thaws
// so the signals are delivered, and waits until it is empty.
func (c *cgroupsV2) kill(rel string, wait time.Duration) error {
	dir := c.dir(rel)
	if len(procsUnder(dir)) == 0 {
		return nil
	}
	freezeFile := filepath.Join(dir, "cgroup.freeze")
	frozen := os.WriteFile(freezeFile, []byte("1"), 0) == nil
	if frozen {
		awaitFrozen(func() (bool, bool) {
			b, _ := os.ReadFile(freezeFile)
			return readKey(filepath.Join(dir, "cgroup.events"), "frozen") == 1, strings.TrimSpace(string(b)) == "0"
		})
	}
	if !c.killFile || os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) != nil {
		for _, pid := range procsUnder(dir) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if frozen {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
	}
	return killLeft(rel, dir, wait)
}

func (c *cgroupsV2) remove(rel string) error { return rmdirTree(c.dir(rel)) }

func (c *cgroupsV2) children(rel string) []string { return childDirs(c.dirs(rel)) }

func (c *cgroupsV2) removeParent(rel string) error { return rmdirEach(c.dirs(rel)) }
