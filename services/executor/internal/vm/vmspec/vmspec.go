// Package vmspec is what the executor's sandbox package and airlock-vm say
// to each other beyond the OCI bundle: the bundle annotations the VM reads
// and the result file it writes when the job ends. Both import it, so the
// two never disagree on a key or a type.
package vmspec

// The bundle annotations airlock-vm reads (the sandbox package writes them).
const (
	// AnnMemory is the guest's RAM in bytes: the job's memory limit.
	AnnMemory = "dev.airlock.vm.memory-bytes"
	// AnnCPUs is the guest's vCPU count.
	AnnCPUs = "dev.airlock.vm.cpus"
	// AnnPids is the job's pids limit, held inside the guest.
	AnnPids = "dev.airlock.vm.pids"
	// AnnDisk is the host path of the guest's disk image (in the job's
	// scratch), made by airlock-vm when missing; AnnDiskBytes its size.
	AnnDisk      = "dev.airlock.vm.disk"
	AnnDiskBytes = "dev.airlock.vm.disk-bytes"
	// AnnDocker "true" starts dockerd in the guest.
	AnnDocker = "dev.airlock.vm.docker"
	// AnnUIDBase is the host uid and gid that is uid 0 inside: QEMU's.
	AnnUIDBase = "dev.airlock.vm.uid-base"
)

// ResultFile is the file in the bundle airlock-vm writes when the job ends.
const ResultFile = "vm-result.json"

// MaxResultBytes bounds ResultFile as the sandbox reads it.
const MaxResultBytes = 4096

// Result is ResultFile's content. OOMKills is what the guest reported
// counting: the sandbox turns more than zero into the job's oom ending.
type Result struct {
	ExitCode    int    `json:"exit_code"`
	OOMKills    uint64 `json:"oom_kills"`
	GuestKernel string `json:"guest_kernel"`
}
