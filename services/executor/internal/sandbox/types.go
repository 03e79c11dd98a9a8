package sandbox

import (
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// Class names an OCI runtime.
type Class string

// The runtime classes this package can drive.
const (
	ClassRunc  Class = "runc"
	ClassRunsc Class = "runsc"
	// ClassVM runs the job in a QEMU virtual machine of its own (vm.go):
	// its own kernel, reached from the host only through QEMU's devices.
	ClassVM Class = "vm"
)

var classes = []Class{ClassRunc, ClassRunsc, ClassVM}

// RuntimeStatus says whether a class can run jobs on this machine.
type RuntimeStatus struct {
	Class     Class
	Available bool
	// Version identifies the runtime binary: its own version lines and the
	// SHA-256 of the file, so provenance names exactly what ran the job.
	Version string
	// Reason says why the class is unavailable.
	Reason string
	// Platform is gVisor's platform (runsc only).
	Platform string
	// Emulated says the VM class (ClassVM) runs its machines under
	// QEMU's software emulation (TCG), not KVM: for development and CI
	// only, allowed by the executor's sandbox.vm.emulation.
	Emulated bool
	// SelfCheck is the runsc self-check's outcome: SelfCheckPassed,
	// SelfCheckFailed, or "" when it did not run (runc, or runsc failed
	// before it).
	SelfCheck string
	// SelfCheckCached says the pass is one an earlier start recorded for
	// the same runsc, platform, executor, kernel and CPU (see
	// Manager.selfCheck), so the check did not run again.
	SelfCheckCached bool
}

// The outcomes of RuntimeStatus.SelfCheck.
const (
	SelfCheckPassed = "passed"
	SelfCheckFailed = "failed"
)

// Limits bound one job. Every field must be positive.
type Limits struct {
	// CPUMillis is the CPU bandwidth in thousandths of a core.
	CPUMillis int64
	// MemoryBytes bounds the job's memory, page cache included.
	MemoryBytes int64
	// Pids bounds the job's tasks (processes and threads) alive at once:
	// under runc in the job's cgroup, under runsc inside gVisor.
	Pids int64
	// DiskBytes bounds everything the job writes: /work's upper layer,
	// /tmp, /out and $HOME together.
	DiskBytes int64
	// Deadline bounds the wall time of Run.
	Deadline time.Duration
}

// Spec describes one job.
type Spec struct {
	// ID is the job id: 1 to 64 of [a-zA-Z0-9_-].
	ID    string
	Class Class
	// Source is the host path of the retained, read-only source tree: the
	// lower layer of /work. It is never written. Its files are owned by
	// Config.UIDBase, the sandbox's root; a job running as another user
	// sees them as its own (user.go), so it can edit its copies.
	Source string
	// Command is the argv; argv[0] is resolved through PATH inside.
	Command []string
	// Env is the whole environment inside, on top of defaults for PATH,
	// HOME, USER, LOGNAME and TERM (which it may override) and, for a job
	// on an image, the image's Env (jobEnv).
	Env    map[string]string
	Limits Limits
	// NetNS, if set, is the path of a network namespace the caller made
	// (package netpolicy) for the job to join instead of a new, empty one.
	NetNS string
	// Nameservers, if any, are what the job's /etc/resolv.conf lists (the
	// executor's DNS server for the job, at most three); none leaves it
	// empty, as a job with no way to a resolver needs.
	Nameservers []netip.Addr
	// GitObjects, if set, is a host directory of git objects mounted
	// read-only at /.airlock/git-objects (the alternates of the job's .git).
	GitObjects string
	// Stdout and Stderr receive the job's output as it runs. Nil discards.
	Stdout, Stderr io.Writer
	// Caches are named caches mounted read-write at their paths, each an
	// overlay whose lower layer is the cache as it was (never written)
	// and whose upper layer lies in the scratch (CacheUpper), so the
	// job's writes count against its disk limit.
	Caches []CacheMount
	// User is who the job's processes run as (user.go): root (the zero
	// value) or another user of ids 0 to runspec.MaxUserID, with no
	// capabilities either way. Its home ($HOME) is its own.
	User runspec.User
	// Kept makes the sandbox on the scratch a previous executor process
	// kept for this id (Recover's keep, DestroyKeeping): the job's /work
	// changes and /out as they were, /tmp and $HOME empty. Started is
	// when that job first started: its deadline counts from then.
	Kept    bool
	Started time.Time
	// Image, if set, is the image the job runs on (image.go) in place of
	// the host template; nil runs it on the template.
	Image *ImageRoot
	// Docker asks the VM class (ClassVM) to start dockerd inside the
	// guest, on the guest's own kernel, before the command runs. Other
	// classes refuse it.
	Docker bool
	// ExtraCAs, if set, are PEM CA certificates (no key: caPEM) the job
	// trusts beyond the jobs' trust store, such as the interception CA of
	// its own egress proxy: the job gets a bundle of its own, the trust
	// store's with these after it, read-only over caBundlePath (whose
	// links and caEnv's variables all reach it), and GIT_SSL_CAINFO
	// naming it. runc and runsc only; the vm class refuses it.
	ExtraCAs []byte
	// Ready, if set, is called once per Run of a session's sandbox (one
	// running IdleCommand) when it is up and takes execs at full speed:
	// its process runs and its exec helper, where it has one, is started
	// (or failed to start, and execs go through the runtime). A sandbox
	// that never comes up never calls it.
	Ready func()
}

// CacheMount is one named cache of a job.
type CacheMount struct {
	// Path is where the job sees it (runspec.CheckCachePath: under /root,
	// /home or /tmp, where the runtime can make a mount point).
	Path string
	// Lower is the host directory of the cache as the job starts with it.
	Lower string
}

// Reason says why a run ended.
type Reason string

// The reasons a run ends.
const (
	ReasonExited       Reason = "exited"
	ReasonTimeout      Reason = "timeout"
	ReasonOOM          Reason = "oom"
	ReasonDiskFull     Reason = "disk_full"
	ReasonCancelled    Reason = "cancelled"
	ReasonSandboxError Reason = "sandbox_error"
)

// Usage is what a run consumed.
type Usage struct {
	CPUTime, WallTime time.Duration
	PeakMemoryBytes   int64
	// DiskBytes is what the job left on its scratch filesystem.
	DiskBytes int64
	// PeakPids is the most tasks the job's cgroup held: the job's own
	// under runc, gVisor's host tasks under runsc (see cgroupLimitsOf).
	PeakPids int64
}

// Result is how a run ended.
type Result struct {
	Reason Reason
	// ExitCode is the job's exit status when Reason is ReasonExited, else -1.
	// A job killed by signal N exits 128+N.
	ExitCode       int
	Usage          Usage
	Class          Class
	RuntimeVersion string
	// TemplateVersion is what the job's root filesystem was: the host
	// template's digest (Manager.TemplateVersion), or for a job on an
	// image (Spec.Image) the image's manifest digest.
	TemplateVersion string
	// Message explains the reason in a sentence.
	Message string
}

var idFormat = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errdefs.ErrInvalidArgument}, args...)...)
}

// CheckCommand checks an argv and environment as the kernel will take
// them: a non-empty argv[0], no NUL anywhere, env keys without '='. Errors
// name argvField and envField and wrap errdefs.ErrInvalidArgument.
func CheckCommand(argvField, envField string, argv []string, env map[string]string) error {
	if len(argv) == 0 || argv[0] == "" {
		return invalid("%s: need at least a non-empty argv[0]", argvField)
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid("%s[%d]: contains a NUL byte", argvField, i)
		}
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalid("%s key %q: must be non-empty without '=' or NUL", envField, k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return invalid("%s[%s]: value contains a NUL byte", envField, k)
		}
	}
	return nil
}

// validate checks everything about s that does not need the host.
func (s *Spec) validate() error {
	if !idFormat.MatchString(s.ID) {
		return invalid("spec.id %q: want 1 to 64 of [a-zA-Z0-9_-]", s.ID)
	}
	return s.validateBody()
}

// validateBody checks all but the id, which the manager's own probe jobs
// choose outside the job id alphabet so they can never collide with a job.
func (s *Spec) validateBody() error {
	switch s.Class {
	case ClassRunc, ClassRunsc, ClassVM:
	default:
		return invalid("spec.class %q: want %q, %q or %q", s.Class, ClassRunc, ClassRunsc, ClassVM)
	}
	if s.Source == "" || !strings.HasPrefix(s.Source, "/") {
		return invalid("spec.source %q: must be an absolute path", s.Source)
	}
	// The overlay's mount options are a comma-separated list in which ':'
	// separates lower layers; such a path cannot be named safely.
	if strings.ContainsAny(s.Source, ",:\\\n") {
		return invalid("spec.source %q: must not contain ',', ':', '\\' or a newline", s.Source)
	}
	if err := CheckCommand("spec.command", "spec.env", s.Command, s.Env); err != nil {
		return err
	}
	if len(s.ExtraCAs) > 0 {
		if s.Class == ClassVM {
			return invalid("spec.extra_cas: the %s class does not take a job's own CAs (runc and runsc do)", ClassVM)
		}
		if _, err := caPEM(s.ExtraCAs); err != nil {
			return invalid("spec.extra_cas: %v", err)
		}
	}
	if s.GitObjects != "" && (!strings.HasPrefix(s.GitObjects, "/") || strings.ContainsAny(s.GitObjects, ",:\\\n")) {
		return invalid("spec.git_objects %q: must be an absolute path without ',', ':', '\\' or a newline", s.GitObjects)
	}
	if err := runspec.CheckUser(s.User); err != nil {
		return invalid("spec.user %v", err)
	}
	if err := checkCaches(s.Caches); err != nil {
		return err
	}
	if s.Image != nil {
		if err := s.Image.validate(); err != nil {
			return err
		}
	}
	for i, c := range s.Caches {
		if err := runspec.CheckCacheUser(c.Path, s.User); err != nil {
			return invalid("spec.caches[%d].path %v", i, err)
		}
	}
	if len(s.Nameservers) > 3 {
		return invalid("spec.nameservers: %d given, at most 3 (the resolver reads no more)", len(s.Nameservers))
	}
	for i, a := range s.Nameservers {
		if !a.IsValid() || a.Zone() != "" {
			return invalid("spec.nameservers[%d]: want an IP address without a zone", i)
		}
	}
	// The minimums are the ones the authority checks every grant against
	// (pkg/runspec). Under runsc the memory limit covers gVisor's own
	// sandbox process too; the pids limit is the job's own tasks, which
	// gVisor holds (see cgroupLimitsOf).
	if err := checkLimits("spec.limits", s.Class, s.Limits); err != nil {
		return err
	}
	l := s.Limits
	if s.Docker {
		// The authority checks a grant's docker request the same way.
		if err := runspec.CheckWith(string(s.Class), []string{runspec.WithDocker}, runspec.Limits{CPUMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, Pids: l.Pids,
			DiskBytes: l.DiskBytes, Deadline: l.Deadline}); err != nil {
			return invalid("spec.docker: %v", err)
		}
	}
	return nil
}

// checkLimits checks a class's limits l, named field, against the
// minimums the authority checks every grant against.
func checkLimits(field string, class Class, l Limits) error {
	if err := runspec.CheckLimits(string(class), runspec.Limits{CPUMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, Pids: l.Pids,
		DiskBytes: l.DiskBytes, Deadline: l.Deadline}); err != nil {
		return invalid("%s.%v", field, err)
	}
	return nil
}

func checkCaches(cs []CacheMount) error {
	if len(cs) > runspec.MaxCaches {
		return invalid("spec.caches: %d given, at most %d", len(cs), runspec.MaxCaches)
	}
	for i, c := range cs {
		if err := runspec.CheckCachePath(c.Path); err != nil {
			return invalid("spec.caches[%d].path %v", i, err)
		}
		if !strings.HasPrefix(c.Lower, "/") || strings.ContainsAny(c.Lower, ",:\\\n") {
			return invalid("spec.caches[%d].lower %q: must be an absolute path without ',', ':', '\\' or a newline", i, c.Lower)
		}
		for j := range i {
			if runspec.CachePathsOverlap(cs[j].Path, c.Path) {
				return invalid("spec.caches[%d].path %q: overlaps spec.caches[%d].path %q", i, c.Path, j, cs[j].Path)
			}
		}
	}
	return nil
}
