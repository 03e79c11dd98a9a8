package sandbox

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The job's pids limit is a limit on the job's own tasks (processes and
// threads). Under runc those are host tasks and the job's pids cgroup holds
// them to the limit. Under runsc they live inside gVisor's sentry and are
// no host tasks at all: the host tasks in the job's cgroup are gVisor's own
// (the sentry's and the gofer's threads and, on the ptrace platform, a stub
// process per guest address space with a thread for each sentry thread that
// ever ran it). So under runsc the sentry holds the job to its limit itself,
// through RLIMIT_NPROC (it counts every task of the sandbox's one user,
// threads too, and exempts only CAP_SYS_ADMIN and CAP_SYS_RESOURCE, which a
// job never has), and the cgroup bounds gVisor's host tasks well above what
// the job's tasks need of them, so that the host stays bounded.
//
// Measured on ptrace: 181 host tasks for a session of 8 processes; a fork
// bomb held at 64 tasks makes 1,210 host tasks in 8 s and 1,834 in 25 s,
// and in the cgroup-v2 VM under emulation 1,515 host tasks for 31 of its
// tasks (a bound of 16 per task stopped it at half its limit).
// That growth is not linear in the job's tasks (a guest process gains a
// stub thread for every sentry thread that runs it), so no linear bound
// fits every job: at the bound the sentry cannot start a stub thread and
// dies (runsc exits 2), and the job ends as a sandbox error that names the
// bound (see sentryDiedAtHostPids).

// runscHostPidsPerTask and runscHostPidsBase size the host bound of a
// runsc job of n tasks: n*runscHostPidsPerTask + runscHostPidsBase, and
// never above runscHostPidsMax (a quarter of Linux's default pid_max,
// 32,768: a job with a large limit must not take the host's pids). 64
// per task lets a fork bomb reach its own limit before the bound even
// under emulation; runspec.MaxRunscPids keeps n low enough that the bound
// is at least 2n + runscHostPidsBase. A Go build with every package recompiled needs under
// 1,024. (Each job is bounded alone: jobs together may take more.)
const (
	runscHostPidsPerTask = 64
	runscHostPidsBase    = 1024
	runscHostPidsMax     = 8192
)

// cgroupLimitsOf are the limits the cgroup of a job of class c holds for
// the job's limits l: l itself but for runsc's pids (see above) and the
// VM class's memory and pids (vm.go).
func cgroupLimitsOf(c Class, l Limits) Limits {
	switch c {
	case ClassRunsc:
		// (The inner min keeps the product from overflowing.)
		l.Pids = min(min(l.Pids, runscHostPidsMax)*runscHostPidsPerTask+runscHostPidsBase, runscHostPidsMax)
	case ClassVM:
		// The guest holds the job's own limits (vm.go); the host bounds
		// QEMU.
		l.Pids = vmHostPids
		l.MemoryBytes += vmMemoryOverhead
	}
	return l
}

// HostLimits are what a job of class c with limits l holds of the host:
// its limits but for what the class runs beside the job (a VM's QEMU), as
// its cgroup bounds them. The executor's capacity counts these.
func HostLimits(c Class, l Limits) Limits {
	h := cgroupLimitsOf(c, l)
	h.Pids = l.Pids
	return h
}

// runscHostPidsHit says that a runsc job's host tasks met their bound.
// (Forks the sentry refused at the job's own limit are not counted: gVisor
// does not report them.)
func runscHostPidsHit(l Limits) string {
	return fmt.Sprintf("gVisor's host tasks reached their bound of %d (for a pids limit of %d)", cgroupLimitsOf(ClassRunsc, l).Pids, l.Pids)
}

// nprocRlimit holds a runsc job to n tasks inside the sentry, soft and hard
// alike so the job cannot raise it.
func nprocRlimit(n int64) specs.POSIXRlimit {
	return specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(n), Soft: uint64(n)}
}
