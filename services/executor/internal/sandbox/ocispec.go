package sandbox

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	seccompprofile "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/runspec"
)

// uidRange is the size of the uid and gid ranges mapped into every sandbox.
const uidRange = runspec.IDRange

// IDRange is how many host uids and gids, from Config.UIDBase up, every
// sandbox maps.
const IDRange = uidRange

const hostname = "airlock"

// jobOOMScoreAdj is the most the kernel allows: when the host runs short
// of memory, its OOM killer takes a job's processes before anything else,
// the executor (which lowers its own score) above all.
var jobOOMScoreAdj = 1000

// defaultEnv is what every job gets before Spec.Env, which may override it
// (with HOME, USER and LOGNAME of its user: userEnv). A job on an image
// starts from the image's Env instead: of these, its PATH replaces
// DefaultPath, and TERM stays Airlock's (jobEnv).
var defaultEnv = map[string]string{
	"PATH": DefaultPath,
	// Output goes to pipes, never a terminal.
	"TERM": "dumb",
}

// Docker's default masked and read-only paths: kernel interfaces that leak
// host information (kcore, keys, timer and scheduler state) or control the
// host (sysrq-trigger, /proc/sys) even from a user namespace.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/sched_debug", "/proc/scsi", "/proc/timer_list",
		"/proc/timer_stats", "/sys/devices/virtual/powercap", "/sys/firmware",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// deniedSyscalls are removed from Docker's default profile. Docker allows
// ptrace on kernels from 4.8 on because its users run debuggers in
// containers; a job is a build or a test run, and ptrace is kernel attack
// surface (and a way to tamper with the job's own supervision) it has no
// need for.
var deniedSyscalls = []string{"ptrace"}

// seccompProfile derives the sandbox's filter from Docker's default profile
// as the moby/profiles package ships it, for a process with no capabilities
// (so every rule Docker gates on a capability stays out). The first
// architecture of the profile's arch map is the native one.
func seccompProfile() (*specs.LinuxSeccomp, error) {
	probe := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	p, err := seccompprofile.GetDefaultProfile(probe)
	if err != nil {
		return nil, fmt.Errorf("seccomp: default profile: %w", err)
	}
	kept := p.Syscalls[:0]
	for _, sc := range p.Syscalls {
		if sc.Action == specs.ActAllow {
			sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return slices.Contains(deniedSyscalls, n) })
			if len(sc.Names) == 0 {
				continue
			}
		}
		kept = append(kept, sc)
	}
	p.Syscalls = kept
	// Native ABI only (Docker's amd64 profile also lists x86 and x32).
	// A syscall through a compat ABI then hits the filter's bad-arch
	// action and kills the thread: a job has no 32-bit binaries to run
	// (the template holds no 32-bit libraries), the compat entry points
	// have been a steady source of kernel bugs, and runc compiles each
	// extra ABI into the filter at every start, which was 17 ms of a 40 ms
	// `runc run` here.
	if len(p.Architectures) > 1 {
		p.Architectures = p.Architectures[:1]
	}
	return p, nil
}

// rlimits are the job's resource limits, each at most what the executor
// itself has: raising a hard limit needs CAP_SYS_RESOURCE on the host, which
// the runtime may not have either.
func rlimits() []specs.POSIXRlimit {
	want := []struct {
		name string
		res  int
		max  uint64
	}{
		{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, 1 << 16},
		// No core dumps: they would fill the scratch disk, and a core of
		// a test binary is not a result.
		{"RLIMIT_CORE", unix.RLIMIT_CORE, 0},
		{"RLIMIT_RTPRIO", unix.RLIMIT_RTPRIO, 0},
		{"RLIMIT_NICE", unix.RLIMIT_NICE, 0},
	}
	var out []specs.POSIXRlimit
	for _, w := range want {
		v := w.max
		var cur unix.Rlimit
		if err := unix.Getrlimit(w.res, &cur); err == nil && cur.Max < v {
			v = cur.Max
		}
		out = append(out, specs.POSIXRlimit{Type: w.name, Hard: v, Soft: v})
	}
	return out
}

// jobEnv is the job's whole environment, sorted for a stable bundle: the
// defaults, then the image's Env (image, for a job on an image), TERM
// again, the trust store's variables (caEnv), its user's, PATH as the
// operator set it (path, unless empty), then env. So a job on an image
// sees the image's variables, its PATH too (or DefaultPath when it sets
// none), under the ones Airlock's sandbox needs; the operator's PATH
// (Config.Path) names host-template directories and is passed only for
// host-template jobs.
func jobEnv(path string, image []string, user runspec.User, env map[string]string) []string {
	all := maps.Clone(defaultEnv)
	for _, kv := range image {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			all[k] = v
		}
	}
	all["TERM"] = defaultEnv["TERM"]
	maps.Copy(all, caEnv)
	maps.Copy(all, userEnv(user))
	if path != "" {
		all["PATH"] = path
	}
	for k, v := range env {
		all[k] = v
	}
	out := make([]string, 0, len(all))
	for k, v := range all {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// bundleInputs is what the OCI spec of one job depends on.
type bundleInputs struct {
	rootfs    string
	binds     []string
	work, tmp string
	out, home string
	uidBase   uint32
	// user is who the job runs as; userFiles, if any, are its
	// /etc/passwd and /etc/group (destination to host path).
	user      runspec.User
	userFiles map[string]string
	// homes, if set, is bound read-only at /home: root's, holding the
	// mount point of a non-root user's home.
	homes       string
	cgroupsPath string
	blockIO     *specs.LinuxBlockIO
	seccomp     *specs.LinuxSeccomp
	rlimits     []specs.POSIXRlimit
	// pids is the job's pids limit, which gVisor holds itself under
	// runsc (see cgroupLimitsOf).
	pids         int64
	command      []string
	env          map[string]string
	path         string   // the default PATH (Config.Path); "" for an image job
	imageEnv     []string // the image's Env, for a job on an image
	shmSizeBytes int64
	// netNS is the network namespace to join (package netpolicy made it,
	// owned by the host's user namespace); "" makes a new, empty one.
	netNS string
	// resolvConf, if set, is the host file bound read-only over the
	// template's empty /etc/resolv.conf.
	resolvConf string
	// caBundle, if set, is the job's own trust store (Spec.ExtraCAs),
	// bound read-only over caBundlePath.
	caBundle string
	// gitObjects, if set, is bound read-only at /.airlock/git-objects.
	gitObjects string
	// caches are the named caches' overlays, bound read-write.
	caches []cacheBind
	class  Class
}

func ociSpec(in bundleInputs) *specs.Spec {
	const (
		nosuid = "nosuid"
		nodev  = "nodev"
		noexec = "noexec"
	)
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{nosuid, noexec, nodev}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{nosuid, "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{nosuid, noexec, "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		// /dev/shm is memory: its pages are charged to the job's memory
		// cgroup, and the size bounds it below that.
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{nosuid, noexec, nodev, "mode=1777", fmt.Sprintf("size=%d", in.shmSizeBytes)}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{nosuid, noexec, nodev}},
		sysMount(in, nosuid, noexec, nodev),
	}
	for _, b := range in.binds {
		mounts = append(mounts, specs.Mount{Destination: b, Type: "bind", Source: b, Options: []string{"rbind", "ro", nosuid, nodev}})
	}
	if in.homes != "" {
		// Another user's home lies below /home, where the template's
		// read-only root has no mount point for it (and runsc's gofer
		// makes a missing one on the host, in the shared template).
		mounts = append(mounts, specs.Mount{Destination: "/home", Type: "bind", Source: in.homes, Options: []string{"bind", "ro", nosuid, nodev, noexec}})
	}
	cwd := "/work"
	if in.work == "" {
		// A pooled sandbox's, before its claim (warm.go).
		cwd = "/"
	}
	for _, b := range []struct{ dst, src string }{
		{"/work", in.work}, {"/tmp", in.tmp}, {"/out", in.out}, {in.user.Home(), in.home},
	} {
		if b.src == "" {
			continue
		}
		mounts = append(mounts, specs.Mount{Destination: b.dst, Type: "bind", Source: b.src, Options: []string{"bind", "rw", nosuid, nodev}})
	}
	for _, c := range in.caches {
		mounts = append(mounts, specs.Mount{Destination: c.dst, Type: "bind", Source: c.src, Options: []string{"bind", "rw", nosuid, nodev}})
	}
	if in.gitObjects != "" {
		mounts = append(mounts, specs.Mount{Destination: "/.airlock/git-objects", Type: "bind", Source: in.gitObjects, Options: []string{"rbind", "ro", nosuid, nodev, noexec}})
	}
	for _, dst := range slices.Sorted(maps.Keys(in.userFiles)) {
		mounts = append(mounts, specs.Mount{Destination: dst, Type: "bind", Source: in.userFiles[dst], Options: []string{"bind", "ro", nosuid, nodev, noexec}})
	}
	if in.resolvConf != "" {
		mounts = append(mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: in.resolvConf, Options: []string{"bind", "ro", nosuid, nodev, noexec}})
	}
	if in.caBundle != "" {
		mounts = append(mounts, specs.Mount{Destination: "/" + caBundlePath, Type: "bind", Source: in.caBundle, Options: []string{"bind", "ro", nosuid, nodev, noexec}})
	}
	idmap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: in.uidBase, Size: uidRange}}
	rlimits := in.rlimits
	if in.class == ClassRunsc {
		rlimits = append(slices.Clone(rlimits), nprocRlimit(in.pids))
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: in.user.UID, GID: in.user.GID},
			Args: in.command,
			Env:  jobEnv(in.path, in.imageEnv, in.user, in.env),
			Cwd:  cwd,
			// Present and empty: every set, bounding and ambient too, is
			// empty. (A missing capabilities object would leave the
			// runtime's defaults.)
			Capabilities:    &specs.LinuxCapabilities{},
			Rlimits:         rlimits,
			NoNewPrivileges: true,
			OOMScoreAdj:     &jobOOMScoreAdj,
		},
		Root:     &specs.Root{Path: in.rootfs, Readonly: true},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			UIDMappings: idmap,
			GIDMappings: idmap,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace, Path: in.netNS},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.UserNamespace},
				{Type: specs.CgroupNamespace},
			},
			CgroupsPath: in.cgroupsPath,
			// Limits live on the parent cgroup this package made; the
			// runtime's own cgroup has none but v1's disk bandwidth
			// bounds (cgroupsV1.runtimeBlockIO).
			Resources:         &specs.LinuxResources{BlockIO: in.blockIO},
			Seccomp:           in.seccomp,
			Sysctl:            sysctls(in),
			MaskedPaths:       maskedPaths,
			ReadonlyPaths:     readonlyPaths,
			RootfsPropagation: "rprivate",
		},
	}
}

// sysctls are the job's sysctls. A job may bind any port in its own
// network namespace, as under runsc, whose netstack has no privileged
// ports (and as Docker sets it): a port below 1024 guards nothing there,
// and the two runtimes then agree (TestUserPermissionParity). A namespace
// the job joins (package netpolicy's, owned by the host's user namespace)
// is set so when it is made; here runc sets its own new one.
func sysctls(in bundleInputs) map[string]string {
	if in.class != ClassRunc || in.netNS != "" {
		return nil
	}
	return map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"}
}

// sysMount is the job's /sys. In a network namespace of its own, a sysfs
// of that namespace: /sys/class/net shows only its loopback. The kernel
// lets a user namespace mount sysfs only for a network namespace it owns,
// and a joined one (package netpolicy's) belongs to the host. Binding the
// host's /sys instead would have to be recursive (a plain bind fails with
// EINVAL in a user namespace, its submounts being locked) and so would
// show the host's interfaces and every mount below /sys, its cgroup
// hierarchies among them. So under runc a job in a joined namespace gets
// an empty, read-only /sys; programs that count CPUs there fall back to
// sched_getaffinity or /proc. gVisor implements sysfs itself, inside the
// sandbox, whatever the namespace.
func sysMount(in bundleInputs, nosuid, noexec, nodev string) specs.Mount {
	if in.netNS != "" && in.class == ClassRunc {
		return specs.Mount{Destination: "/sys", Type: "tmpfs", Source: "tmpfs", Options: []string{nosuid, noexec, nodev, "ro", "mode=755", "size=4k"}}
	}
	return specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{nosuid, noexec, nodev, "ro"}}
}

// cgroupRel is the job's own cgroup, relative to each hierarchy's root.
func cgroupRel(parent, id string) string { return filepath.Join(parent, id) }
