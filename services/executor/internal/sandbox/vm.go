package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/services/executor/internal/vm/vmspec"
)

// The VM class (ClassVM) runs a job in a QEMU machine of its own, through
// airlock-vm (services/executor/cmd/airlock-vm): an OCI-runtime-like
// program this package drives exactly as it drives runsc (run, exec,
// kill, delete), given the same bundle. airlock-vm boots Debian's kernel
// with our guest agent as its init; the agent mounts the bundle's root and
// binds as virtio-9p shares (the host keeps /work's overlay, /out, /tmp
// and $HOME on the job's size-limited scratch, as for the other classes,
// so the export, the files API and the disk limit work unchanged), and
// runs the job's processes with no capabilities. QEMU itself runs in a
// user namespace as the sandbox's root (Config.UIDBase), in the job's
// network namespace (its only NIC is a tap redirected to the namespace's
// veth end, so every network policy applies unchanged), in the job's
// cgroup and under QEMU's own seccomp filter (-sandbox on).
//
// What differs from the other classes, and why:
//   - Memory: the guest's RAM is the job's memory limit; the host cgroup
//     holds QEMU to that plus vmMemoryOverhead (its own code, device
//     state and TCG's translation cache). The guest's own OOM killer ends a
//     job that outgrows its RAM (ReasonOOM, from vm-result.json).
//   - Pids: the job's limit is held inside the guest (a guest cgroup's
//     pids.max); the host cgroup bounds QEMU's and airlock-vm's threads
//     at vmHostPids.
//   - Neither memory nor pids changes while the job runs (the guest's RAM
//     and its cgroup are set at boot); CPU bandwidth and the deadline do.
//   - With Spec.Docker the guest also gets a block device: an ext4 image
//     in the job's scratch (vmDiskFile) of half the disk limit
//     (vmDiskBytes), so what dockerd writes counts against the job's disk
//     limit. The host never mounts it: an
//     ext4 image a hostile guest kernel wrote is not for the host kernel
//     to parse.

// vmMemoryOverhead is what the host cgroup allows QEMU beyond the guest's
// RAM: QEMU's own heap, its device and 9p state, and under emulation the
// TCG translation cache (airlock-vm caps it at 64 MiB).
const vmMemoryOverhead = 256 << 20

// vmHostPids bounds the host tasks of a VM job: QEMU's vCPU, I/O and 9p
// worker threads and airlock-vm's own. The job's own pids limit is held
// inside the guest.
const vmHostPids = 512

// vmDiskFile is the guest's disk image in the job's scratch, and
// vmResultFile what airlock-vm writes into the bundle when the job ends.
const (
	vmDiskFile   = "vm-disk.img"
	vmResultFile = vmspec.ResultFile
)

// VMConfig configures the VM class.
type VMConfig struct {
	// Path is the airlock-vm runtime; "" makes the class unavailable.
	Path string
	// Kernel is the guest kernel's directory (as `airlock-vm kernel
	// fetch` caches it); "" lets airlock-vm take the newest cached.
	Kernel string
	// QEMU is qemu-system-x86_64; "" lets airlock-vm find it in PATH.
	QEMU string
	// Emulation lets the class run under QEMU's software emulation (TCG)
	// where KVM is not usable: for development and CI only, since an
	// emulated machine runs code 5 to 10 times slower.
	Emulation bool
}

// vmAccel chooses the VM class's accelerator: KVM when /dev/kvm can make
// a VM, else TCG when emulation is allowed. Unavailable says why neither.
func vmAccel(cfg VMConfig) (accel string, emulated bool, unavailable string) {
	err := kvmUsable()
	switch {
	case err == nil:
		return "kvm", false, ""
	case cfg.Emulation:
		return "tcg", true, ""
	default:
		return "", false, fmt.Sprintf("KVM is not usable here (%v) and sandbox.vm.emulation is off (emulation is for development and CI only)", err)
	}
}

// kvmUsable checks that /dev/kvm opens, speaks the stable API (12) and
// makes a VM, and that QEMU will be able to open it: QEMU runs as the
// sandbox's unprivileged uid in a user namespace, with no supplementary
// group (the host's kvm group among them), so the device must be
// readable and writable by others.
func kvmUsable() error {
	var st unix.Stat_t
	if err := unix.Stat("/dev/kvm", &st); err != nil {
		return fmt.Errorf("stat /dev/kvm: %w", err)
	}
	if st.Mode&0o006 != 0o006 {
		return fmt.Errorf("/dev/kvm has mode %#o: QEMU runs as the sandbox's unprivileged uid with no kvm group, so it must be readable and writable by others (mode 0666, a udev rule: KERNEL==\"kvm\", MODE=\"0666\")", st.Mode&0o777)
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/kvm: %w", err)
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion, kvmCreateVM = 0xAE00, 0xAE01
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("KVM_GET_API_VERSION: %w", err)
	}
	if v != 12 {
		return fmt.Errorf("KVM API version %d, want 12", v)
	}
	vm, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		return fmt.Errorf("KVM_CREATE_VM: %w", err)
	}
	unix.Close(vm)
	return nil
}

// vmFlags are airlock-vm's global flags beyond --root and --log.
func vmFlags(cfg VMConfig, accel string) []string {
	var f []string
	if cfg.Kernel != "" {
		f = append(f, "--kernel", cfg.Kernel)
	}
	if cfg.QEMU != "" {
		f = append(f, "--qemu", cfg.QEMU)
	}
	if accel != "" {
		f = append(f, "--accel", accel)
	}
	return f
}

// vmAnnotations are what airlock-vm reads of a job beyond the OCI spec.
func (s *Sandbox) vmAnnotations() map[string]string {
	l := s.spec.Limits
	a := map[string]string{
		vmspec.AnnMemory:  strconv.FormatInt(l.MemoryBytes, 10),
		vmspec.AnnCPUs:    strconv.FormatInt(vmCPUs(l.CPUMillis), 10),
		vmspec.AnnPids:    strconv.FormatInt(l.Pids, 10),
		vmspec.AnnUIDBase: strconv.FormatUint(uint64(s.m.cfg.UIDBase), 10),
	}
	if s.spec.Docker {
		a[vmspec.AnnDocker] = "true"
		a[vmspec.AnnDisk] = filepath.Join(s.scr.point, vmDiskFile)
		a[vmspec.AnnDiskBytes] = strconv.FormatInt(vmDiskBytes(l.DiskBytes), 10)
	}
	return a
}

// vmDiskBytes is the size of the guest's disk for a job of disk limit d:
// half of it, allocated when the machine first boots, so dockerd's images
// and /work, /out, /tmp and $HOME share the limit in halves, and the
// guest's ext4 fills (ENOSPC inside) before the scratch it lies on does.
func vmDiskBytes(d int64) int64 { return d / 2 }

// vmCPUs is the guest's vCPU count for a CPU limit: enough whole CPUs to
// use it (the host cgroup holds QEMU to the limit itself), and never more
// than the host has.
func vmCPUs(millis int64) int64 {
	n := max(1, (millis+999)/1000)
	return min(n, int64(max(1, runtime.NumCPU())))
}

// vmGuestOOM reports whether the guest's OOM killer killed a process of
// the job, as airlock-vm recorded it in the bundle. A file the job could
// have shaped is never read: the bundle is the executor's and airlock-vm
// writes what the agent counted in the guest's /proc/vmstat.
func (s *Sandbox) vmGuestOOM() bool {
	if s.spec.Class != ClassVM {
		return false
	}
	data, err := os.ReadFile(filepath.Join(s.bundle, vmResultFile))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.m.log.Warn("sandbox: read the VM's result", "job_id", s.spec.ID, "error", err)
		}
		return false
	}
	var r vmspec.Result
	if len(data) > vmspec.MaxResultBytes || json.Unmarshal(data, &r) != nil {
		s.m.log.Warn("sandbox: the VM's result is not what airlock-vm writes", "job_id", s.spec.ID)
		return false
	}
	return r.OOMKills > 0
}

// vmRefuseLive says why l cannot be put in force on a running VM job, or "".
func vmRefuseLive(cur, l Limits) string {
	switch {
	case l.MemoryBytes != cur.MemoryBytes:
		return fmt.Sprintf("limits.memory_bytes %d: cannot change on a running vm job: it is the guest's RAM, set when the machine boots (it is %d)", l.MemoryBytes, cur.MemoryBytes)
	case l.Pids != cur.Pids:
		return fmt.Sprintf("limits.pids %d: cannot change on a running vm job: the guest holds the limit it booted with (it is %d)", l.Pids, cur.Pids)
	}
	return ""
}
