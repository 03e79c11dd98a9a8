package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/config"
)

// Capacity is how much of this host the executor's jobs may hold at once:
// a job is started only while the limits of every job not yet ended, its
// own added, stay within each field. Each default is measured on the host
// at start and keeps a reserve for the executor and the OS. Executors
// sharing a host need to split it between them.
type Capacity struct {
	// Memory bounds the sum of the jobs' memory limits; it is also the
	// memory limit of the cgroup that holds every job's (sandbox
	// cgroup_parent), so the jobs together never take more. At most the
	// host's memory. Default the host's memory less a reserve of a tenth
	// of it, at least 1 GiB.
	Memory config.ByteSize `yaml:"memory"`
	// CPUMillis bounds the sum of the jobs' CPU limits, in thousandths of
	// a core as grants give them. CPU is shared in time: a job beyond its
	// share is slowed, never killed, and the jobs' cgroups together share
	// the CPUs with the executor as one group; so the default is four
	// times the CPUs the executor may run on (4000 each), and that is
	// also the most it may be.
	CPUMillis int64 `yaml:"cpu_millis"`
	// Disk bounds the sum of the jobs' disk limits. At most data_dir's
	// whole filesystem. Default what is free on it at start less a
	// reserve of a tenth of that, at least 2 GiB; with no more free than
	// the reserve the executor does not start unless disk is set.
	Disk config.ByteSize `yaml:"disk"`
	// Jobs bounds the jobs staging or running at once. Default 64, or the
	// number of /30s in network.pool4 if fewer (each job with an allow
	// policy takes one).
	Jobs int `yaml:"jobs"`

	// Byte counts, set by validation.
	MemoryBytes int64 `yaml:"-"`
	DiskBytes   int64 `yaml:"-"`
}

// The reserves the defaults keep back.
const (
	minMemoryReserve = 1 << 30
	minDiskReserve   = 2 << 30
	defaultJobs      = 64
	// cpuOvercommit is how many times the host's CPUs the jobs' CPU
	// limits may add up to.
	cpuOvercommit = 4
)

// host is what this machine has, as far as capacity goes.
type host struct {
	memory    int64 // MemTotal
	cpuMillis int64
	diskFree  int64 // on data_dir's filesystem, for unprivileged use
	diskSize  int64
}

// measureHost reads the host's memory and CPUs, and the space of the
// filesystem dataDir is (or will be) on.
func measureHost(dataDir string) (host, error) {
	h := host{cpuMillis: int64(runtime.NumCPU()) * 1000}
	var err error
	if h.memory, err = memTotal(); err != nil {
		return h, err
	}
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return h, err
	}
	// data_dir is made at start: measure the nearest directory that exists.
	var st unix.Statfs_t
	for {
		err = unix.Statfs(dir, &st)
		if err == nil || !errors.Is(err, unix.ENOENT) || dir == "/" {
			break
		}
		dir = filepath.Dir(dir)
	}
	if err != nil {
		return h, fmt.Errorf("statfs %s: %w", dir, err)
	}
	h.diskFree, h.diskSize = int64(st.Bavail)*st.Bsize, int64(st.Blocks)*st.Bsize
	return h, nil
}

// memTotal reads MemTotal from /proc/meminfo.
func memTotal() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemTotal %q: %w", f[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo has no MemTotal in kB")
}

// validate checks c against h and fills its defaults; pool4Bits is the
// size of network.pool4's prefix.
func (c *Capacity) validate(h host, pool4Bits int) error {
	var errs []error
	var err error
	c.MemoryBytes, err = capacitySize("capacity.memory", c.Memory,
		// Whole MiB: the kernel rounds a cgroup's limit to pages anyway.
		(h.memory-max(minMemoryReserve, h.memory/10))&^(1<<20-1),
		fmt.Sprintf("this host has %s of memory, no more than the %s kept for the executor and the OS",
			config.FormatByteSizeApprox(h.memory), config.FormatByteSizeApprox(minMemoryReserve)),
		h.memory, "this host's "+config.FormatByteSizeApprox(h.memory))
	errs = append(errs, err)
	c.DiskBytes, err = capacitySize("capacity.disk", c.Disk,
		h.diskFree-max(minDiskReserve, h.diskFree/10),
		fmt.Sprintf("data_dir's filesystem has %s free, no more than the %s kept for the executor's own files",
			config.FormatByteSizeApprox(h.diskFree), config.FormatByteSizeApprox(minDiskReserve)),
		h.diskSize, "data_dir's whole filesystem ("+config.FormatByteSizeApprox(h.diskSize)+")")
	errs = append(errs, err)
	switch most := cpuOvercommit * h.cpuMillis; {
	case c.CPUMillis == 0:
		c.CPUMillis = most
	case c.CPUMillis < 0:
		errs = append(errs, config.Field("capacity.cpu_millis", "%d: must be positive", c.CPUMillis))
	case c.CPUMillis > most:
		errs = append(errs, config.Field("capacity.cpu_millis", "%d is more than %d times this host's %d CPUs (%d)", c.CPUMillis, cpuOvercommit, h.cpuMillis/1000, most))
	}
	switch {
	case c.Jobs == 0:
		c.Jobs = defaultJobs
		if pool4Bits > 0 {
			c.Jobs = min(defaultJobs, 1<<(30-min(pool4Bits, 30)))
		}
	case c.Jobs < 0:
		errs = append(errs, config.Field("capacity.jobs", "%d: must be positive", c.Jobs))
	}
	return errors.Join(errs...)
}

// capacitySize is the byte count of the size b written for field: def when
// none is written, refused with noDefault's reason if def is not positive;
// else what is written, positive and at most most (which what names).
func capacitySize(field string, b config.ByteSize, def int64, noDefault string, most int64, what string) (int64, error) {
	switch {
	case b.Check(field) != nil:
		return 0, b.Check(field)
	case !b.IsSet() && def <= 0:
		return 0, config.Field(field, "%s; set %s", noDefault, field)
	case !b.IsSet():
		return def, nil
	case b.Bytes() == 0:
		return 0, config.Field(field, "0: must be positive")
	case b.Bytes() > most:
		return 0, config.Field(field, "%s is more than %s", config.FormatByteSize(b.Bytes()), what)
	}
	return b.Bytes(), nil
}
