// Package runspec owns what a job's grant may say and still run: the least
// resources each runtime class needs, the form of an allowed network
// prefix, and the form of a session's exec id. The authority checks every submission and change with it, so a
// job the executor would refuse is refused at once with the field named;
// the executor checks every grant it is handed with it too. It imports no
// grpc or proto; anything may import it.
package runspec

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
)

// Runtime classes.
const (
	ClassRunc  = "runc"
	ClassRunsc = "runsc"
	ClassVM    = "vm"
)

// The least a job may be given. Below the memory minimums the runtime
// itself cannot start (gVisor's sentry and gofer take memory of their
// own; a VM's memory is its guest's RAM, which must hold a guest kernel,
// the guest agent and the job's page cache before the job's own pages);
// the pids minimums leave a job room for a shell and its children
// (under runsc the job's pids are the tasks inside gVisor, which holds
// them to the limit itself, and its own host tasks are bounded apart:
// see the executor's sandbox.cgroupLimitsOf).
const (
	MinCPUMillis        = 10
	MinMemoryBytes      = 16 << 20
	MinRunscMemoryBytes = 64 << 20
	MinVMMemoryBytes    = 256 << 20
	MinPids             = 8
	MinRunscPids        = 64
	MinDiskBytes        = 4 << 20
)

// MinDockerMemoryBytes is the least memory of a job that asks for Docker:
// dockerd and containerd take a few hundred MiB inside the guest before
// the first container the job starts, so less boots a VM where docker
// builds are killed for memory.
const MinDockerMemoryBytes = 1 << 30

// What a job may ask to run beside it inside its sandbox (a job spec's
// "with").
const (
	// WithDocker starts a Docker daemon for the job. Only a VM has its own
	// kernel and cgroups for it: under runc or runsc it would need the
	// host's, which no job may have.
	WithDocker = "docker"
)

// MaxRunscPids is the most pids a runsc job may be given: its gVisor's
// host tasks are bounded at 64 per job task plus 1,024 but never above
// 8,192, and 2*3,584+1,024 is 8,192, so the bound leaves every job at
// least two host tasks per task of its own.
const MaxRunscPids = 3584

// Limits are a job's resource limits.
type Limits struct {
	CPUMillis, MemoryBytes, Pids, DiskBytes int64
	Deadline                                time.Duration
}

// FieldError names the field (relative: "memory_bytes", "allow[2]") that
// is wrong and why.
type FieldError struct {
	Field, Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// CheckLimits reports the first limit under what class needs, or above
// what it allows.
func CheckLimits(class string, l Limits) error {
	mem, pids := int64(MinMemoryBytes), int64(MinPids)
	switch class {
	case ClassRunc:
	case ClassRunsc:
		mem, pids = MinRunscMemoryBytes, MinRunscPids
	case ClassVM:
		mem = MinVMMemoryBytes
	default:
		return &FieldError{"runtime_class", fmt.Sprintf("%q is not runc, runsc or vm", class)}
	}
	switch {
	case l.CPUMillis < MinCPUMillis:
		return &FieldError{"cpu_millis", fmt.Sprintf("%d: must be at least %d", l.CPUMillis, MinCPUMillis)}
	case l.MemoryBytes < mem:
		return &FieldError{"memory_bytes", fmt.Sprintf("%d: must be at least %d under %s (the runtime's own start-up needs it)", l.MemoryBytes, mem, class)}
	case l.Pids < pids:
		return &FieldError{"pids", fmt.Sprintf("%d: must be at least %d under %s", l.Pids, pids, class)}
	case class == ClassRunsc && l.Pids > MaxRunscPids:
		return &FieldError{"pids", fmt.Sprintf("%d: must be at most %d under runsc (gVisor's own host tasks are bounded for it)", l.Pids, MaxRunscPids)}
	case l.DiskBytes < MinDiskBytes:
		return &FieldError{"disk_bytes", fmt.Sprintf("%d: must be at least %d", l.DiskBytes, MinDiskBytes)}
	case l.Deadline <= 0:
		return &FieldError{"deadline", fmt.Sprintf("%s: must be positive", l.Deadline)}
	}
	return nil
}

// FixedInterfaces reports whether class's sandbox reads its network
// interfaces once, when it starts: gVisor copies them into its own
// network stack, and a VM's guest configures its one NIC at boot. A job
// of such a class started without an interface can never gain one.
func FixedInterfaces(class string) bool { return class == ClassRunsc || class == ClassVM }

// CheckWith reports the first problem with what a job of class with
// limits l asks to run beside it (with): a name not known here, a name
// given twice, docker outside the vm class, or docker with less memory
// than MinDockerMemoryBytes. It checks what CheckLimits does not; a job
// passes both.
func CheckWith(class string, with []string, l Limits) error {
	for i, w := range with {
		switch {
		case w != WithDocker:
			return &FieldError{fmt.Sprintf("with[%d]", i), fmt.Sprintf("%q is not %q (the only thing a job may ask to run beside it)", w, WithDocker)}
		case slices.Contains(with[:i], w):
			return &FieldError{fmt.Sprintf("with[%d]", i), fmt.Sprintf("%q is asked for twice", w)}
		}
	}
	if !HasDocker(with) {
		return nil
	}
	switch {
	case class != ClassVM:
		return &FieldError{"with", "docker runs only in the vm runtime class: its own kernel and cgroups"}
	case l.MemoryBytes < MinDockerMemoryBytes:
		return &FieldError{"memory_bytes", fmt.Sprintf("%d: must be at least %d with docker (dockerd and containerd run in the guest beside the job)", l.MemoryBytes, int64(MinDockerMemoryBytes))}
	}
	return nil
}

// HasDocker reports whether with asks for Docker.
func HasDocker(with []string) bool { return slices.Contains(with, WithDocker) }

// CheckPrefix reports whether p may be named in an allow rule: a valid
// prefix in its canonical form (no host bits: 10.0.0.0/8, not 10.0.0.1/8),
// and IPv4 written as IPv4 (not ::ffff:a.b.c.d, which reads as one thing
// and matches another). (A netip.Prefix never holds a zone.) pkg/egress
// decides; the name stays for the executor's netpolicy.
func CheckPrefix(p netip.Prefix) error { return egress.CheckPrefix(p) }

// ValidExecID reports whether id is a well-formed exec id (a session exec's
// id as clients choose it: the key of the executor's and the authority's
// exec records): 1 to 128 of [A-Za-z0-9._:-]. A loop, not a regexp: the
// regexp's bounded repetition compiled to 128 states in every process's
// start, the CLI's included.
func ValidExecID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := range len(id) {
		switch c := id[i]; {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}
