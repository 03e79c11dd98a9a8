package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// Defaults for Config's optional fields.
const (
	DefaultUIDBase      uint32 = 1000000
	DefaultCgroupParent        = "/airlock"
	DefaultRootfsDir           = "/run/airlock/rootfs"
	DefaultPath                = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// DefaultRunscPlatform is how gVisor's sentry runs the job's threads
	// unless Config.RunscPlatform says otherwise: see runscPlatforms.
	DefaultRunscPlatform = "ptrace"
)

// runscPlatforms are the gVisor platforms the executor may run runsc with,
// each with why it may be chosen. Issue 20: under systrap, gVisor's
// default, a thread interrupted by a signal on this project's AMD EPYC
// host (AVX-512) came back, a few times in 20,000 signals, with another
// thread's vector registers (tools/sandbox/runsc/fpcheck; the self-check
// finds it in seconds), which is how the Go compiler inside a job died
// with "unexpected return pc ... called from 0x87d8bacbfe281392"; XSAVE in
// place of XSAVEOPT and --systrap-disable-syscall-patching did not stop it.
// Under ptrace the host kernel saves and restores each thread's registers,
// and no run corrupted one. kvm needs /dev/kvm and is not offered.
var runscPlatforms = map[string]string{
	"ptrace":  "the host kernel switches the job's threads (PTRACE_SYSEMU); the default",
	"systrap": "gVisor's stub threads switch the job's threads themselves; it must pass the self-check, which it fails on the issue 20 host",
}

// Config configures a Manager.
type Config struct {
	// StateDir is the executor-owned directory for bundles, runtime state
	// and scratch. It is created (or tightened to) 0700. Every sandbox
	// mount lives below it.
	StateDir string
	// RuncPath and RunscPath are the runtime binaries; "" makes that class
	// unavailable.
	RuncPath  string
	RunscPath string
	// ExecdPath is the static airlock-execd binary, the exec helper of a
	// runc session's sandbox (execd.go); "" runs each exec through the
	// runtime (`runc exec`).
	ExecdPath string
	// UIDBase is the host uid and gid mapped to root inside every sandbox;
	// the 65536 ids from it up are mapped to 0..65535. Default 1000000.
	UIDBase uint32
	// CgroupParent is the cgroup path that holds one cgroup per job: on
	// cgroup v1 under each hierarchy's root, on v2 below the executor's
	// own cgroup (the subtree it was given). This executor owns it
	// exclusively: Recover removes every job cgroup below it. Default
	// "/airlock". It must not hold the executor itself.
	CgroupParent string
	// DiskReadBPS and DiskWriteBPS, if positive, bound each job's reads
	// from and writes to its scratch disk, in bytes per second (v2 io.max,
	// v1 blkio throttling, which binds direct I/O only).
	DiskReadBPS, DiskWriteBPS int64
	// MemoryLimit, if positive, is the memory limit of CgroupParent's
	// memory cgroup: every job together, probes included, never takes
	// more, whatever their own limits say.
	MemoryLimit int64
	// RootfsDir holds the root filesystem templates: directory skeletons,
	// symlinks and the synthesized /etc, nothing secret; and, in a
	// directory of this executor's own, the mount points of its image
	// jobs' roots (image.go). It must be
	// searchable by the sandbox's root down from /, because runc's init
	// resolves the root's path itself from inside the user namespace; so
	// it cannot live inside StateDir. Default "/run/airlock/rootfs".
	RootfsDir string
	// RunscPlatform is gVisor's platform for runsc jobs: "ptrace" (the
	// default) or "systrap". See runscPlatforms.
	RunscPlatform string
	// RunscSelfCheck is how long the runsc self-check job computes before
	// runsc is trusted with jobs (see selfCheckMain). Default
	// DefaultSelfCheck.
	RunscSelfCheck time.Duration
	// RunscSelfCheckCache is the directory where a passed self-check is
	// recorded (see Manager.selfCheck); "" is StateDir/probe. Executors
	// that share one (a developer's stacks) check once between them.
	RunscSelfCheckCache string
	// Path is every job's and exec's PATH unless its own environment sets
	// one (runspec.ValidPath); "" is DefaultPath. It names directories of
	// the host template: a job on an image gets the image's PATH, or
	// DefaultPath (jobEnv).
	Path string
	// CABundle is the PEM CA certificates every job trusts (ReadCAFile's,
	// one file's after another), written into the template at each path
	// tools look for them (catrust.go); nil reads DefaultCABundle.
	CABundle []byte
	// VM configures the VM class (vm.go).
	VM     VMConfig
	Logger *slog.Logger
}

// Manager creates sandboxes and cleans up after them.
type Manager struct {
	cfg Config
	log *slog.Logger
	cg  cgroupDriver
	// cgParent holds the job cgroups: CgroupParent where the driver puts it.
	cgParent string
	tmpl     *rootfsTemplate
	// cas is the jobs' trust store (trustedCAs), which a job's own bundle
	// (Spec.ExtraCAs) begins with.
	cas []byte
	// imageTop is Airlock's layer over every image (imageTopDef), and
	// rootsDir holds the mount points of image jobs' roots (image.go).
	imageTop *rootfsTemplate
	rootsDir string
	seccomp  *specs.LinuxSeccomp
	rlimits  []specs.POSIXRlimit
	pool     *scratchPool
	runtimes map[Class]*runtimeBin
	jobsDir  string
	// keptDir holds, from one executor process to the next, the scratch
	// images of the jobs whose files outlive a restart (Recover's keep).
	keptDir string
	// execdWhy says why runc sessions' execs go through `runc exec` and
	// not the exec helper (ExecdPath unset, or the kernel cannot report
	// a pidfd's exit status: checkExecd); "" when they use the helper.
	execdWhy string

	mu   sync.Mutex
	live map[string]*Sandbox

	probeMu sync.Mutex
	status  map[Class]RuntimeStatus

	// idmaps are the user namespaces of jobs' idmapped sources (user.go).
	idmaps idmapCache
}

// New checks the host, prepares StateDir and the root filesystem template,
// and returns a Manager. It runs nothing; call Recover and Probe next.
func New(cfg Config) (*Manager, error) {
	if cfg.UIDBase == 0 {
		cfg.UIDBase = DefaultUIDBase
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if cfg.RootfsDir == "" {
		cfg.RootfsDir = DefaultRootfsDir
	}
	if cfg.Path == "" {
		cfg.Path = DefaultPath
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RunscPlatform == "" {
		cfg.RunscPlatform = DefaultRunscPlatform
	}
	if cfg.RunscSelfCheckCache == "" && cfg.StateDir != "" {
		cfg.RunscSelfCheckCache = filepath.Join(cfg.StateDir, "probe")
	}
	if cfg.RunscSelfCheck == 0 {
		cfg.RunscSelfCheck = DefaultSelfCheck
	}
	switch {
	case cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) || filepath.Clean(cfg.StateDir) != cfg.StateDir:
		return nil, invalid("sandbox.state_dir %q: must be a clean absolute path", cfg.StateDir)
	case strings.ContainsAny(cfg.StateDir, ",:\\\n"):
		return nil, invalid("sandbox.state_dir %q: must not contain ',', ':', '\\' or a newline (it is named in overlay mount options)", cfg.StateDir)
	case runspec.ValidPath(cfg.Path) != nil:
		return nil, invalid("sandbox.path %q: %v", cfg.Path, runspec.ValidPath(cfg.Path))
	case uint64(cfg.UIDBase)+uidRange > 1<<32-1:
		return nil, invalid("sandbox.uid_base %d: the %d ids from it must fit below 2^32-1", cfg.UIDBase, uidRange)
	case !filepath.IsAbs(cfg.CgroupParent) || filepath.Clean(cfg.CgroupParent) != cfg.CgroupParent || cfg.CgroupParent == "/":
		return nil, invalid("sandbox.cgroup_parent %q: must be a clean absolute cgroup path other than /", cfg.CgroupParent)
	case cfg.DiskReadBPS < 0 || cfg.DiskWriteBPS < 0:
		return nil, invalid("sandbox.disk_read_bps %d, disk_write_bps %d: must not be negative (0 is no bound)", cfg.DiskReadBPS, cfg.DiskWriteBPS)
	case !filepath.IsAbs(cfg.RootfsDir) || filepath.Clean(cfg.RootfsDir) != cfg.RootfsDir:
		return nil, invalid("sandbox.rootfs_dir %q: must be a clean absolute path", cfg.RootfsDir)
	case isUnder(cfg.RootfsDir, cfg.StateDir) || cfg.RootfsDir == cfg.StateDir:
		return nil, invalid("sandbox.rootfs_dir %q: must be outside state_dir, which stays private (0700)", cfg.RootfsDir)
	case cfg.RunscSelfCheckCache != "" && (!filepath.IsAbs(cfg.RunscSelfCheckCache) || filepath.Clean(cfg.RunscSelfCheckCache) != cfg.RunscSelfCheckCache):
		return nil, invalid("sandbox.runsc_self_check_cache %q: must be a clean absolute path", cfg.RunscSelfCheckCache)
	case cfg.RunscSelfCheck < 0:
		return nil, invalid("sandbox.runsc_self_check %v: must not be negative", cfg.RunscSelfCheck)
	case runscPlatforms[cfg.RunscPlatform] == "":
		return nil, invalid("sandbox.runsc_platform %q: must be one of %s", cfg.RunscPlatform, strings.Join(slices.Sorted(maps.Keys(runscPlatforms)), ", "))
	}
	cas, err := trustedCAs(cfg.CABundle)
	if err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: sandbox: must run as root (uid 0) to create namespaces, mounts and cgroups", errdefs.ErrFailedPrecondition)
	}
	m := &Manager{
		cfg:     cfg,
		log:     cfg.Logger,
		jobsDir: filepath.Join(cfg.StateDir, "jobs"),
		keptDir: filepath.Join(cfg.StateDir, "kept"),
		live:    map[string]*Sandbox{},
		rlimits: rlimits(),
		cas:     cas,
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox.state_dir: %w", err)
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox.state_dir: %w", err)
	}
	for _, d := range []string{"jobs", "runc", "runsc", "vm", "images", "probe", "kept"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("sandbox.state_dir: %w", err)
		}
	}
	if err := makePrivate(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("sandbox.state_dir: %w", err)
	}
	if m.cg, err = discoverCgroups(); err != nil {
		return nil, fmt.Errorf("%w: sandbox: %v", errdefs.ErrFailedPrecondition, err)
	}
	m.cgParent = m.cg.parentPath(cfg.CgroupParent)
	if m.cg.mode() == "v2" && strings.Split(cfg.CgroupParent, "/")[1] == supervisorCgroup {
		return nil, invalid("sandbox.cgroup_parent %q: %s is the executor's own cgroup on cgroup v2", cfg.CgroupParent, supervisorCgroup)
	}
	if err := m.cg.checkOutside(m.cgParent); err != nil {
		return nil, fmt.Errorf("%w: sandbox.cgroup_parent %s: %v", errdefs.ErrFailedPrecondition, cfg.CgroupParent, err)
	}
	if err := m.cg.prepareParent(m.cgParent, cfg.MemoryLimit); err != nil {
		return nil, fmt.Errorf("%w: sandbox.cgroup_parent %s: %v", errdefs.ErrFailedPrecondition, cfg.CgroupParent, err)
	}
	if m.diskLimits().set() {
		io := map[string]string{"v1": "blkio", "v2": "io"}[m.cg.mode()]
		if !slices.Contains(m.cg.controllers(), io) {
			return nil, fmt.Errorf("%w: sandbox.disk_read_bps, disk_write_bps: bounding disk bandwidth needs the cgroup %s %s controller, which this host does not give the executor",
				errdefs.ErrFailedPrecondition, m.cg.mode(), io)
		}
	}
	def, err := buildTemplateDef(cas)
	if err != nil {
		return nil, fmt.Errorf("sandbox: rootfs template: %w", err)
	}
	if err := os.MkdirAll(cfg.RootfsDir, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox.rootfs_dir: %w", err)
	}
	if err := checkSearchable(cfg.RootfsDir, cfg.UIDBase); err != nil {
		return nil, fmt.Errorf("%w: sandbox.rootfs_dir %s: %v", errdefs.ErrFailedPrecondition, cfg.RootfsDir, err)
	}
	if m.tmpl, err = def.materialize(cfg.RootfsDir); err != nil {
		return nil, fmt.Errorf("sandbox.rootfs_dir: %w", err)
	}
	if m.imageTop, err = imageTopDef(cas).materialize(cfg.RootfsDir); err != nil {
		return nil, fmt.Errorf("sandbox.rootfs_dir: %w", err)
	}
	m.rootsDir = rootsDirFor(cfg.RootfsDir, cfg.StateDir)
	if err := os.MkdirAll(m.rootsDir, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox.rootfs_dir: %w", err)
	}
	if err := os.Chmod(m.rootsDir, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox.rootfs_dir: %w", err)
	}
	if err := makePrivate(m.rootsDir); err != nil {
		return nil, fmt.Errorf("sandbox.rootfs_dir: %w", err)
	}
	if m.seccomp, err = seccompProfile(); err != nil {
		return nil, err
	}
	m.pool = newScratchPool(filepath.Join(cfg.StateDir, "images"))
	if m.pool.kind != scratchExt4 {
		m.log.Warn("sandbox scratch falls back to tmpfs (no /dev/loop-control or mkfs.ext4): a job's written files count against its memory limit too")
		if m.diskLimits().set() {
			m.log.Warn("sandbox.disk_read_bps and disk_write_bps bound nothing: a tmpfs scratch has no disk")
		}
	}
	m.runtimes = map[Class]*runtimeBin{
		ClassRunc:  {class: ClassRunc, path: cfg.RuncPath, root: filepath.Join(cfg.StateDir, "runc")},
		ClassRunsc: {class: ClassRunsc, path: cfg.RunscPath, root: filepath.Join(cfg.StateDir, "runsc"), platform: cfg.RunscPlatform, fsFlags: runscFSFlags, batchFlags: runscBatchFlags},
	}
	vm := &runtimeBin{class: ClassVM, path: cfg.VM.Path, root: filepath.Join(cfg.StateDir, "vm")}
	if cfg.VM.Path != "" {
		var accel string
		accel, vm.emulated, vm.unavailable = vmAccel(cfg.VM)
		vm.vmFlags = vmFlags(cfg.VM, accel)
	}
	m.runtimes[ClassVM] = vm
	m.execdWhy = checkExecd(cfg.ExecdPath)
	if m.execdWhy == "" {
		m.log.Info("sandbox: runc sessions' execs start through the exec helper", "execd", cfg.ExecdPath)
	} else {
		m.log.Warn("sandbox: runc sessions' execs start with `runc exec` (slower), not the exec helper", "reason", m.execdWhy)
	}
	return m, nil
}

// ExecHelper reports whether runc sessions' execs start through the exec
// helper, and if not, why.
func (m *Manager) ExecHelper() (bool, string) { return m.execdWhy == "", m.execdWhy }

// UIDBase is the host uid (and gid) of root inside every sandbox.
func (m *Manager) UIDBase() uint32 { return m.cfg.UIDBase }

// TemplateVersion is the digest of the root filesystem template definition
// (of host-template jobs; a job on an image reports the image's digest).
func (m *Manager) TemplateVersion() string { return m.tmpl.version }

// makePrivate keeps mounts made below dir from propagating to other mount
// namespaces. Where dir's mount is shared (systemd makes / shared), every
// overlay and scratch mount would otherwise be copied into peer namespaces,
// where a copy keeps the file system busy after the sandbox unmounts it.
func makePrivate(dir string) error {
	m, ok, err := mountOf(dir)
	if err != nil || !ok {
		return err
	}
	shared := false
	for _, o := range m.optional {
		if strings.HasPrefix(o, "shared:") {
			shared = true
		}
	}
	if !shared {
		return nil
	}
	if m.point != dir {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

// Create prepares everything for spec's job: scratch, overlay, cgroup and
// bundle. Nothing runs until Run.
func (m *Manager) Create(ctx context.Context, spec Spec) (*Sandbox, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	if strings.HasPrefix(spec.ID, PoolPrefix) {
		return nil, invalid("spec.id %q: %q starts the names of pooled sandboxes (Warm), never a job's", spec.ID, PoolPrefix)
	}
	m.probeMu.Lock()
	st, probed := m.status[spec.Class]
	m.probeMu.Unlock()
	if probed && !st.Available {
		return nil, fmt.Errorf("%w: spec.class %s is not available on this executor: %s", errdefs.ErrFailedPrecondition, spec.Class, st.Reason)
	}
	return m.create(ctx, spec, false)
}

// create makes spec's sandbox; a pooled one (Warm) has no source yet: no
// /work, nothing of a job's.
func (m *Manager) create(ctx context.Context, spec Spec, pooled bool) (_ *Sandbox, err error) {
	rt := m.runtimes[spec.Class]
	version, verr := rt.getVersion(ctx)
	if verr != nil {
		return nil, fmt.Errorf("%w: spec.class %s: %v", errdefs.ErrFailedPrecondition, spec.Class, verr)
	}
	if fi, serr := os.Stat(spec.Source); !pooled && (serr != nil || !fi.IsDir()) {
		return nil, invalid("spec.source %q: not a directory", spec.Source)
	}
	if err := checkNetNS(spec.NetNS); err != nil {
		return nil, err
	}
	if spec.GitObjects != "" {
		if fi, err := os.Stat(spec.GitObjects); err != nil || !fi.IsDir() {
			return nil, invalid("spec.git_objects %q: not a directory", spec.GitObjects)
		}
	}
	if spec.Image != nil {
		im := *spec.Image
		im.Layers, im.Env = slices.Clone(im.Layers), slices.Clone(im.Env)
		if err := im.checkLayers(); err != nil {
			return nil, err
		}
		spec.Image = &im
	}
	spec.Command = append([]string(nil), spec.Command...)
	s := &Sandbox{
		m:              m,
		spec:           spec,
		rt:             rt,
		runtimeVersion: version,
		name:           spec.ID,
		dir:            filepath.Join(m.jobsDir, spec.ID),
		cgRel:          cgroupRel(m.cgParent, spec.ID),
		stop:           make(chan struct{}, 1),
		oomFD:          -1,
		firstStart:     spec.Started,
		pooled:         pooled,
	}
	s.bundle = filepath.Join(s.dir, "bundle")
	s.logPath = filepath.Join(s.dir, "runtime.log")
	s.pidFile = filepath.Join(s.dir, "pid")
	s.workDir = filepath.Join(s.dir, "work")

	m.mu.Lock()
	if _, dup := m.live[spec.ID]; dup {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: spec.id %s: a sandbox with this id exists", errdefs.ErrAlreadyExists, spec.ID)
	}
	m.live[spec.ID] = s
	m.mu.Unlock()

	if err := os.Mkdir(s.dir, 0o700); err != nil {
		m.forget(spec.ID)
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: spec.id %s: a previous executor left this job's sandbox behind; Recover removes it", errdefs.ErrAlreadyExists, spec.ID)
		}
		return nil, err
	}
	defer func() {
		if err != nil {
			// A kept scratch goes back where it was kept.
			if terr := s.teardown(spec.Kept); terr != nil {
				m.log.Error("sandbox: undo a failed create", "job_id", spec.ID, "error", terr)
			}
			m.forget(spec.ID)
		}
	}()
	if spec.Kept {
		s.scr, err = reuseScratch(m.keptDir, spec.ID, s.dir)
	} else {
		uid, gid := m.hostIDs(spec.User)
		s.scr, err = m.pool.makeScratch(s.dir, spec.Limits.DiskBytes, int(m.cfg.UIDBase), uid, gid)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: scratch: %w", spec.ID, err)
	}
	if err := os.Mkdir(s.workDir, 0o700); err != nil {
		return nil, err
	}
	if !pooled {
		if err := s.mountWork(); err != nil {
			return nil, err
		}
	}
	cacheBinds, err := s.mountCaches()
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: mount caches: %w", spec.ID, err)
	}
	var dev string
	if m.diskLimits().set() && s.scr.loop != "" {
		if dev, err = blockDevice(s.scr.loop); err != nil {
			return nil, fmt.Errorf("sandbox %s: scratch device: %w", spec.ID, err)
		}
	}
	if err := m.cg.create(s.cgRel, cgroupLimitsOf(spec.Class, spec.Limits), m.diskLimits(), dev); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if s.oomFD, err = m.cg.watchOOM(s.cgRel); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if err := os.Mkdir(s.bundle, 0o700); err != nil {
		return nil, err
	}
	var resolvConf string
	if len(spec.Nameservers) > 0 {
		resolvConf = filepath.Join(s.dir, "resolv.conf")
		var b strings.Builder
		for _, a := range spec.Nameservers {
			fmt.Fprintf(&b, "nameserver %s\n", a)
		}
		// No search domains, and names are looked up as given.
		b.WriteString("options ndots:0 timeout:2 attempts:2\n")
		if err := os.WriteFile(resolvConf, []byte(b.String()), 0o644); err != nil {
			return nil, err
		}
	}
	caBundle, err := s.writeCABundle()
	if err != nil {
		return nil, err
	}
	rootfs, binds := m.tmpl.dir, m.tmpl.def.Binds
	var userFiles map[string]string
	if spec.Image != nil {
		if err := s.mountImage(); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		rootfs, binds = s.rootDir, nil
	} else if userFiles, err = s.writeUserFiles(); err != nil {
		return nil, err
	}
	homes, err := s.makeHomes()
	if err != nil {
		return nil, err
	}
	path, imageEnv := s.envBase()
	s.bundleIn = bundleInputs{
		rootfs:       rootfs,
		binds:        binds,
		work:         s.workDir,
		tmp:          filepath.Join(s.scr.point, scratchTmp),
		out:          filepath.Join(s.scr.point, scratchOut),
		home:         filepath.Join(s.scr.point, scratchHome),
		uidBase:      m.cfg.UIDBase,
		user:         spec.User,
		userFiles:    userFiles,
		homes:        homes,
		cgroupsPath:  filepath.Join(s.cgRel, runtimeCgroup),
		blockIO:      m.cg.runtimeBlockIO(m.diskLimits(), dev),
		seccomp:      m.seccomp,
		rlimits:      m.rlimits,
		pids:         spec.Limits.Pids,
		command:      commandOf(spec),
		env:          s.spec.Env, // writeCABundle may have added to it
		path:         path,
		imageEnv:     imageEnv,
		shmSizeBytes: ShmSize(spec.Limits),
		netNS:        spec.NetNS,
		resolvConf:   resolvConf,
		caBundle:     caBundle,
		gitObjects:   spec.GitObjects,
		caches:       cacheBinds,
		class:        spec.Class,
	}
	if pooled {
		// The template's empty /work stays until a claim mounts the job's
		// there (warm.go).
		s.bundleIn.work = ""
	}
	if err := s.writeBundle(); err != nil {
		return nil, err
	}
	return s, nil
}

// mountWork mounts the job's /work overlay at workDir: the source (or its
// id-mapped view) below, the scratch's upper layer above.
func (s *Sandbox) mountWork() error {
	lower, err := s.workLower()
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", s.spec.ID, err)
	}
	if err := mountWork(s.dir, lower, s.scr.point, s.workDir, ""); err != nil {
		return fmt.Errorf("sandbox %s: mount /work overlay: %w", s.spec.ID, err)
	}
	return nil
}

// writeBundle writes the runtime's config.json from bundleIn.
func (s *Sandbox) writeBundle() error {
	cfg := ociSpec(s.bundleIn)
	if s.spec.Class == ClassVM {
		cfg.Annotations = s.vmAnnotations()
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.bundle, "config.json"), data, 0o600)
}

// commandOf is the process the sandbox runs: the spec's command, but a
// session on an image idles in the image's /bin/sh.
func commandOf(spec Spec) []string {
	if spec.Image != nil && spec.isSession() {
		return imageIdleCommand
	}
	return spec.Command
}

// checkNetNS checks that p, if set, is a network namespace: the runtime
// would otherwise fail late, or, given some other file, not join anything.
func checkNetNS(p string) error {
	if p == "" {
		return nil
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return invalid("spec.net_ns %q: must be a clean absolute path", p)
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return invalid("spec.net_ns %q: %v", p, err)
	}
	defer unix.Close(fd)
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return invalid("spec.net_ns %q: %v", p, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		return invalid("spec.net_ns %q: not a namespace (bind-mounted nsfs file)", p)
	}
	return nil
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.live, id)
	m.mu.Unlock()
}

// Probe reports, per class, whether it works here: the binary's version,
// then a tiny real job. The first call does the work; later calls return
// its answer.
func (m *Manager) Probe(ctx context.Context) []RuntimeStatus {
	m.probeMu.Lock()
	defer m.probeMu.Unlock()
	if m.status == nil {
		status := map[Class]RuntimeStatus{}
		for _, c := range classes {
			status[c] = m.probe(ctx, c)
			st := status[c]
			if st.Available {
				m.log.Info("sandbox runtime available", "class", c, "version", st.Version)
			} else {
				m.log.Warn("sandbox runtime unavailable", "class", c, "reason", st.Reason)
			}
		}
		m.status = status
	}
	out := make([]RuntimeStatus, 0, len(classes))
	for _, c := range classes {
		out = append(out, m.status[c])
	}
	return out
}

// Available reports whether class c can run jobs, probing first if nothing
// has yet.
func (m *Manager) Available(c Class) (RuntimeStatus, bool) {
	m.probeMu.Lock()
	st, ok := m.status[c]
	probed := m.status != nil
	m.probeMu.Unlock()
	if !probed {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		m.Probe(ctx)
		m.probeMu.Lock()
		st, ok = m.status[c]
		m.probeMu.Unlock()
	}
	if !ok {
		return RuntimeStatus{Class: c, Reason: fmt.Sprintf("unknown runtime class %q", c)}, false
	}
	return st, st.Available
}

// probeLimits are generous enough for runsc's own start-up.
var probeLimits = Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, Pids: 256, DiskBytes: 16 << 20, Deadline: time.Minute}

const probeOutput = "airlock-probe"

// runscErrnoMark is in the version of a runsc built by tools/sandbox/build.sh,
// whose OCI seccomp filter returns each rule's own errno as runc's does. An
// upstream runsc returns EPERM for every errno rule, which breaks clone3's
// fallback and so every threaded program: Probe refuses it.
const runscErrnoMark = "+airlock.errnoret"

func (m *Manager) probe(ctx context.Context, c Class) RuntimeStatus {
	st := RuntimeStatus{Class: c}
	if c == ClassRunsc {
		st.Platform = m.cfg.RunscPlatform
	}
	rt := m.runtimes[c]
	if rt.path == "" {
		st.Reason = fmt.Sprintf("no %s binary is configured", c)
		return st
	}
	if rt.unavailable != "" {
		st.Reason = rt.unavailable
		return st
	}
	var err error
	if st.Version, err = rt.getVersion(ctx); err != nil {
		st.Reason = err.Error()
		return st
	}
	if c == ClassVM {
		// No test job: a boot under emulation takes seconds of both
		// cores, at every executor start. airlock-vm --version has found
		// QEMU, the kernel and the agent; a guest that cannot boot fails
		// the first job as a sandbox error naming why.
		st.Emulated, st.Available = rt.emulated, true
		return st
	}
	if c == ClassRunsc && !strings.Contains(st.Version, runscErrnoMark) {
		st.Reason = "this runsc answers seccomp rules that return ENOSYS (clone3) with EPERM, so no glibc program could start a thread " +
			"or posix_spawn a child under it; use the runsc tools/sandbox/build.sh builds (its version ends in " + runscErrnoMark + ")"
		return st
	}
	src := filepath.Join(m.cfg.StateDir, "probe", "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		st.Reason = err.Error()
		return st
	}
	if err := os.Chown(src, int(m.cfg.UIDBase), int(m.cfg.UIDBase)); err != nil {
		st.Reason = err.Error()
		return st
	}
	// '.' is outside the job id alphabet: a probe never meets a job.
	if why := m.probeJob(ctx, c, Spec{ID: "probe." + string(c), Source: src, Command: []string{"/bin/sh", "-c", "echo " + probeOutput}, Limits: probeLimits}, func(stdout string) string {
		if strings.TrimSpace(stdout) != probeOutput {
			return fmt.Sprintf("a test job printed %q, want %q", stdout, probeOutput)
		}
		return ""
	}); why != "" {
		st.Reason = why
		return st
	}
	if c == ClassRunsc {
		why, cached := m.selfCheck(ctx, src, st.Version)
		if why != "" {
			st.SelfCheck = SelfCheckFailed
			st.Reason = fmt.Sprintf("runsc (platform %s) failed the self-check, so it is not trusted with jobs: %s", m.cfg.RunscPlatform, why)
			return st
		}
		st.SelfCheck, st.SelfCheckCached = SelfCheckPassed, cached
	}
	st.Available = true
	return st
}

// probeJob runs spec (its class c) as a test job and says what was wrong
// with it: "" when it exited 0 and verdict found nothing wrong with its
// stdout.
func (m *Manager) probeJob(ctx context.Context, c Class, spec Spec, verdict func(stdout string) string) string {
	if err := m.removeLeftover(spec.ID); err != nil {
		return fmt.Sprintf("remove a previous probe's sandbox: %v", err)
	}
	var stdout, stderr bytes.Buffer
	spec.Class = c
	spec.Stdout = &limitedBuffer{b: &stdout, max: 4096}
	spec.Stderr = &limitedBuffer{b: &stderr, max: 4096}
	sb, err := m.create(ctx, spec, false)
	if err != nil {
		return fmt.Sprintf("create a test sandbox: %v", err)
	}
	res, runErr := sb.Run(ctx)
	if err := sb.Destroy(); err != nil {
		m.log.Error("sandbox: destroy the probe sandbox", "class", c, "error", err)
	}
	var why string
	switch {
	case runErr != nil:
		why = fmt.Sprintf("a test job could not run: %v", runErr)
	case res.Reason != ReasonExited || res.ExitCode != 0:
		why = fmt.Sprintf("a test job ended %s (exit %d): %s", res.Reason, res.ExitCode, res.Message)
	case verdict(stdout.String()) != "":
		why = verdict(stdout.String())
	default:
		return ""
	}
	if e := strings.TrimSpace(stderr.String()); e != "" {
		why += "; stderr: " + e
	}
	return why
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Recover removes everything a previous executor process left behind:
// runtime processes and containers, every process in a job cgroup, mounts
// and loop devices under StateDir, runtime state, job cgroups and scratch
// directories. It returns the job ids it cleaned up. Call it at start,
// before the first Create.
//
// For the ids keep says yes to, the scratch is kept (Kept says so) for
// a Create with Spec.Kept: an ext4 scratch still mounted (the previous
// process died; the host did not, so the file system is whole once it is
// unmounted here), or one already kept by DestroyKeeping. Nothing else of
// such a job survives: no process, no mount, no cgroup. Kept scratches no
// one keeps again are removed.
//
// ctx ending stops it, with ctx's error, until it starts unmounting (a
// stop asked for while processes die slowly on a host busy with IO); the
// next start recovers what is left. From the first unmount on it runs to
// its end: the scratches it decided to keep would not be kept again.
func (m *Manager) Recover(ctx context.Context, keep func(id string) bool) ([]string, error) {
	if keep == nil {
		keep = func(string) bool { return false }
	}
	m.mu.Lock()
	busy := len(m.live)
	m.mu.Unlock()
	if busy > 0 {
		return nil, fmt.Errorf("%w: sandbox: Recover must run before any sandbox is created (%d live)", errdefs.ErrFailedPrecondition, busy)
	}
	ids := map[string]bool{}
	var errs []error

	// Runtime processes first (a "runc run" still waiting on its
	// container, runsc's sandbox and gofer): each names StateDir on its
	// command line. Left alive, they would race the cleanup below.
	if err := killProcsNaming(ctx, m.cfg.StateDir, 5*time.Second); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs = append(errs, err)
	}
	for _, id := range m.cg.children(m.cgParent) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ids[id] = true
		if err := m.cg.kill(cgroupRel(m.cgParent, id), 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	// Which scratches to keep is decided before anything is unmounted:
	// only one still mounted was never torn down half-way.
	// A pooled sandbox's directory is named for the pool, not a job: the
	// job that claimed it, if one did, is in its claim file (jobOf). One
	// no job claimed is removed and not reported.
	keepMounted := map[string]bool{}
	jobOf := map[string]string{}
	if ents, err := os.ReadDir(m.jobsDir); err == nil {
		for _, e := range ents {
			id := e.Name()
			ids[id] = true
			dir := filepath.Join(m.jobsDir, id)
			job := id
			if strings.HasPrefix(id, PoolPrefix) {
				job = claimedJob(dir)
				jobOf[id] = job
			}
			if job == "" || !keep(job) {
				continue
			}
			points, _ := mountsUnder(dir)
			_, imgErr := os.Stat(filepath.Join(dir, scratchImage))
			_, metaErr := os.Stat(filepath.Join(dir, scratchMetaFile))
			if slices.Contains(points, filepath.Join(dir, "scratch")) && imgErr == nil && metaErr == nil {
				keepMounted[id] = true
			}
		}
	}
	// The last point to stop at: a scratch to keep is kept because it is
	// still mounted, so from its unmount on, Recover runs to its end.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, rt := range m.runtimes {
		ents, _ := os.ReadDir(rt.root)
		for _, e := range ents {
			if id := runtimeStateID(e.Name()); id != "" {
				ids[id] = true
			}
			if err := os.RemoveAll(filepath.Join(rt.root, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := unmountAll(m.cfg.StateDir); err != nil {
		errs = append(errs, err)
	}
	if ents, err := os.ReadDir(m.rootsDir); err == nil {
		for _, e := range ents {
			ids[e.Name()] = true
			if err := removeRoot(filepath.Join(m.rootsDir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	detachLoopsUnder(m.cfg.StateDir)
	for id := range keepMounted {
		// Only an image nothing uses any more: a mount a host process
		// held was only detached lazily, and its file system may still be
		// live on the old loop device, where a second mount would
		// corrupt it. Not kept, the session ends saying so.
		dir := filepath.Join(m.jobsDir, id)
		img := filepath.Join(dir, scratchImage)
		// Autoclear detaches a loop device asynchronously after its
		// unmount, once the killed sandbox's mount namespace is gone and
		// its file system flushed, which on a host busy with IO has taken
		// more than ten seconds: give it thirty (the executor starts
		// serving after; a session not kept is lost to its client).
		for end := time.Now().Add(30 * time.Second); len(loopsBacking(img)) > 0 && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		job := id
		if j, ok := jobOf[id]; ok {
			job = j
		}
		if points, _ := mountsUnder(dir); len(points) > 0 || len(loopsBacking(img)) > 0 {
			m.log.Warn("a session's scratch is still in use after Recover; not kept", "job_id", job, "mounts", points)
			continue
		}
		if err := keepScratch(dir, m.keptDir, job); err != nil {
			m.log.Warn("a session's scratch could not be kept", "job_id", job, "error", err)
		}
	}
	if ents, err := os.ReadDir(m.keptDir); err == nil {
		for _, e := range ents {
			id := strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".ext4"), ".json")
			if keep(id) {
				continue
			}
			ids[id] = true
			if err := os.Remove(filepath.Join(m.keptDir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	var out []string
	for id := range ids {
		if err := m.cg.remove(cgroupRel(m.cgParent, id)); err != nil {
			errs = append(errs, err)
		}
		if err := removeJobDir(filepath.Join(m.jobsDir, id)); err != nil {
			errs = append(errs, err)
		}
		switch job, pooled := jobOf[id]; {
		case strings.HasPrefix(id, "probe."):
		case pooled && job != "":
			out = append(out, job)
		case !pooled && !strings.HasPrefix(id, PoolPrefix):
			out = append(out, id)
		}
	}
	sort.Strings(out)
	out = slices.Compact(out)
	return out, errors.Join(errs...)
}

// Kept reports whether a scratch is kept for id (Recover, DestroyKeeping),
// for a Create with Spec.Kept.
func (m *Manager) Kept(id string) bool {
	img, meta := keptPaths(m.keptDir, id)
	_, err1 := os.Stat(img)
	_, err2 := os.Stat(meta)
	return err1 == nil && err2 == nil
}

// DiscardKept removes the scratch kept for id, if any.
func (m *Manager) DiscardKept(id string) error {
	img, meta := keptPaths(m.keptDir, id)
	return errors.Join(ignoreNotExist(os.Remove(img)), ignoreNotExist(os.Remove(meta)))
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Close removes this executor's cgroup parent from every hierarchy. Call
// it at shutdown, once every sandbox is destroyed; a job cgroup still below
// the parent (one that could not be removed) keeps it for the next start's
// Recover.
func (m *Manager) Close() error {
	m.mu.Lock()
	busy := len(m.live)
	m.mu.Unlock()
	if busy > 0 {
		return fmt.Errorf("%w: sandbox: Close with %d sandbox(es) not destroyed", errdefs.ErrFailedPrecondition, busy)
	}
	m.idmaps.close()
	if len(m.cg.children(m.cgParent)) > 0 {
		// Left for the next start's Recover (one stopped early, say).
		return m.removeRootsDir()
	}
	return errors.Join(m.removeRootsDir(), m.cg.removeParent(m.cgParent))
}

func (m *Manager) diskLimits() ioLimits {
	return ioLimits{ReadBPS: m.cfg.DiskReadBPS, WriteBPS: m.cfg.DiskWriteBPS}
}

// removeLeftover removes one sandbox a previous process left behind, by id.
func (m *Manager) removeLeftover(id string) error {
	var errs []error
	rel := cgroupRel(m.cgParent, id)
	if err := m.cg.kill(rel, 5*time.Second); err != nil {
		errs = append(errs, err)
	}
	for _, rt := range m.runtimes {
		if rt.hasState(id) {
			_ = rt.forceDelete(id)
			matches, _ := filepath.Glob(filepath.Join(rt.root, id+"_sandbox:*"))
			matches = append(matches, filepath.Join(rt.root, id), filepath.Join(rt.root, "runsc-"+id+".sock"))
			for _, p := range matches {
				if err := os.RemoveAll(p); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if err := removeRoot(filepath.Join(m.rootsDir, id)); err != nil {
		errs = append(errs, err)
	}
	dir := filepath.Join(m.jobsDir, id)
	if err := unmountAll(dir); err != nil {
		errs = append(errs, err)
	}
	if err := m.cg.remove(rel); err != nil {
		errs = append(errs, err)
	}
	if err := removeJobDir(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// runtimeStateID maps a name in a runtime's state root to its container id:
// runc keeps a directory per container, runsc
// "<container>_sandbox:<sandbox>.state" and ".lock" files and a control
// socket "runsc-<sandbox>.sock".
func runtimeStateID(name string) string {
	if i := strings.Index(name, "_sandbox:"); i >= 0 {
		return name[:i]
	}
	if strings.HasPrefix(name, "runsc-") && strings.HasSuffix(name, ".sock") {
		return strings.TrimSuffix(strings.TrimPrefix(name, "runsc-"), ".sock")
	}
	if strings.HasPrefix(name, ".") {
		return ""
	}
	return name
}

// unmountAll unmounts every mount strictly below dir, deepest first.
func unmountAll(dir string) error {
	points, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range points {
		if err := unmount(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unmount unmounts p, retrying while a just-killed process still holds it,
// and detaching it lazily as the last resort.
func unmount(p string) error {
	var err error
	for try := 0; try < 50; try++ {
		err = unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if derr := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); derr != nil {
		return fmt.Errorf("unmount %s: %v (lazy: %v)", p, err, derr)
	}
	return nil
}

// removeJobDir removes a job's directory, but only once nothing is mounted
// below it: removing through a mount would delete the mounted files
// instead.
func removeJobDir(dir string) error {
	points, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(points) > 0 {
		return fmt.Errorf("remove %s: still mounted: %s", dir, strings.Join(points, ", "))
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// killProcsNaming SIGKILLs every process with an argument naming dir or a
// path below it, until none is left, wait passes or ctx ends.
func killProcsNaming(ctx context.Context, dir string, wait time.Duration) error {
	self := os.Getpid()
	end := time.Now().Add(wait)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var found []int
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return err
		}
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil {
				continue
			}
			for _, arg := range strings.Split(string(b), "\x00") {
				if arg == dir || strings.Contains(arg, dir+"/") || strings.HasSuffix(arg, "="+dir) {
					found = append(found, pid)
					break
				}
			}
		}
		if len(found) == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("processes %v naming %s survive SIGKILL", found, dir)
		}
		for _, pid := range found {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mountWork mounts /work's overlay at target: source under the upper and
// work directories of the scratch at point. The job can read the mount's
// options in /proc/mounts, so they name no host directory: the layers are
// given as links in dir (lower, upper, ovlwork), relative to it, by a
// thread whose working directory is its own (the executor's is not
// changed). volatile: the upper layer is thrown away with the job (or
// read once it ended), so overlayfs need not sync it. extra, if set, is
// more options.
func mountWork(dir, source, point, target, extra string) error {
	for name, to := range map[string]string{"lower": source, "upper": filepath.Join(point, scratchUpper), "ovlwork": filepath.Join(point, scratchOvl)} {
		if err := os.Symlink(to, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	opts := "lowerdir=lower,upperdir=upper,workdir=ovlwork,volatile"
	if extra != "" {
		opts += "," + extra
	}
	return mountOverlayIn(dir, target, unix.MS_NOSUID|unix.MS_NODEV, opts)
}

// mountOverlayIn mounts an overlay at target whose options name layers
// relative to dir, from a thread whose working directory is dir (the
// executor's is not changed).
func mountOverlayIn(dir, target string, flags uintptr, opts string) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, with its own working directory,
		// ends with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- fmt.Errorf("unshare the working directory: %w", err)
			return
		}
		if err := unix.Chdir(dir); err != nil {
			done <- err
			return
		}
		done <- unix.Mount("overlay", target, "overlay", flags, opts)
	}()
	return <-done
}
