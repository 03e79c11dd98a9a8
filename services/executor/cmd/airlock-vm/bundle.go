package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
	"github.com/airlockhq/airlock/services/executor/internal/vm/qemu"
	"github.com/airlockhq/airlock/services/executor/internal/vm/vmspec"
)

// The bundle's annotations the VM reads (the sandbox package writes them).
const (
	annMemory    = vmspec.AnnMemory
	annCPUs      = vmspec.AnnCPUs
	annPids      = vmspec.AnnPids
	annDisk      = vmspec.AnnDisk
	annDiskBytes = vmspec.AnnDiskBytes
	annDocker    = vmspec.AnnDocker
	annUIDBase   = vmspec.AnnUIDBase
)

// Bounds on what a bundle may ask for.
const (
	maxConfigJSON   = 4 << 20
	defaultMemory   = 512 << 20
	minMemory       = 128 << 20
	maxMemory       = 1 << 40
	maxCPUs         = 64
	maxDiskBytes    = 16 << 40
	maxUIDBase      = 1<<32 - qemu.IDRange
	sharePrefix     = "s"
	hostFileMaxSize = proto.MaxFileSize
)

// plan is a bundle translated: what QEMU exports and what the guest is told.
type plan struct {
	shares      []qemu.Share
	config      proto.Config
	process     proto.Process
	netns       string
	cgroupsPath string
	memoryBytes int64
	cpus        int
	uidBase     uint32
	disk        string
	diskBytes   int64
}

// readBundle reads and translates dir/config.json.
func readBundle(dir string) (plan, error) {
	f, err := os.Open(filepath.Join(dir, "config.json"))
	if err != nil {
		return plan{}, fmt.Errorf("bundle: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigJSON+1))
	if err != nil {
		return plan{}, fmt.Errorf("bundle: %w", err)
	}
	if len(data) > maxConfigJSON {
		return plan{}, fmt.Errorf("bundle: config.json is larger than %d bytes", maxConfigJSON)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return plan{}, fmt.Errorf("bundle: config.json: %w", err)
	}
	return translate(&spec, dir)
}

// translate turns an OCI spec into a plan. Every value is checked: the
// bundle decides nothing the runtime has not bounded.
func translate(spec *specs.Spec, bundle string) (plan, error) {
	var p plan
	if spec.Root == nil || spec.Root.Path == "" {
		return p, fmt.Errorf("bundle: root.path: missing")
	}
	root := spec.Root.Path
	if !filepath.IsAbs(root) {
		root = filepath.Join(bundle, root)
	}
	if err := isDir("root.path", root); err != nil {
		return p, err
	}
	p.shares = []qemu.Share{{Tag: proto.RootTag, Path: root, ReadOnly: true}}
	p.config.Shares = []proto.Share{{Tag: proto.RootTag, Path: "/", RO: true}}
	for i, m := range spec.Mounts {
		if err := p.addMount(i, m); err != nil {
			return p, err
		}
	}
	if spec.Process == nil {
		return p, fmt.Errorf("bundle: process: missing")
	}
	proc, err := processOf(spec.Process)
	if err != nil {
		return p, err
	}
	p.process = proc
	p.config.Hostname = spec.Hostname
	if spec.Linux != nil {
		p.cgroupsPath = spec.Linux.CgroupsPath
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace && ns.Path != "" {
				if !filepath.IsAbs(ns.Path) || filepath.Clean(ns.Path) != ns.Path {
					return p, fmt.Errorf("bundle: network namespace path %q: not a clean absolute path", ns.Path)
				}
				p.netns = ns.Path
			}
		}
	}
	if err := p.annotations(spec.Annotations); err != nil {
		return p, err
	}
	if err := p.config.Validate(); err != nil {
		return p, fmt.Errorf("bundle: %w", err)
	}
	return p, nil
}

// processOf is the job's process for the guest (capabilities are always
// none there and no_new_privs always set, whatever the spec says).
func processOf(sp *specs.Process) (proto.Process, error) {
	p := proto.Process{
		Args: sp.Args, Env: sp.Env, Cwd: sp.Cwd,
		UID: sp.User.UID, GID: sp.User.GID, AdditionalGIDs: sp.User.AdditionalGids,
	}
	if p.Cwd == "" {
		p.Cwd = "/"
	}
	for _, r := range sp.Rlimits {
		p.Rlimits = append(p.Rlimits, proto.Rlimit{Type: r.Type, Hard: r.Hard, Soft: r.Soft})
	}
	if err := p.Validate(); err != nil {
		return proto.Process{}, fmt.Errorf("bundle: %w", err)
	}
	return p, nil
}

// guestOwnMounts are mounts the agent makes itself inside the guest.
var guestOwnMounts = []string{"proc", "sysfs", "tmpfs", "devpts", "mqueue", "shm", "cgroup", "cgroup2"}

func (p *plan) addMount(i int, m specs.Mount) error {
	dst := m.Destination
	if !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" || strings.ContainsAny(dst, "\x00\n") {
		return fmt.Errorf("bundle: mounts[%d] destination %q: want a clean absolute path below /", i, dst)
	}
	bind := m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
	if !bind {
		if slices.Contains(guestOwnMounts, m.Type) {
			return nil
		}
		return fmt.Errorf("bundle: mounts[%d] at %s: type %q is not supported in a VM", i, dst, m.Type)
	}
	if !filepath.IsAbs(m.Source) {
		return fmt.Errorf("bundle: mounts[%d] at %s: source %q is not absolute", i, dst, m.Source)
	}
	st, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("bundle: mounts[%d] at %s: %w", i, dst, err)
	}
	ro := slices.Contains(m.Options, "ro")
	switch {
	case st.IsDir():
		tag := sharePrefix + strconv.Itoa(len(p.shares))
		p.shares = append(p.shares, qemu.Share{Tag: tag, Path: m.Source, ReadOnly: ro})
		p.config.Shares = append(p.config.Shares, proto.Share{
			Tag: tag, Path: dst, RO: ro,
			NoSuid: slices.Contains(m.Options, "nosuid"),
			NoDev:  slices.Contains(m.Options, "nodev"),
			NoExec: slices.Contains(m.Options, "noexec"),
		})
	case st.Mode().IsRegular():
		content, err := readSmall(m.Source, hostFileMaxSize)
		if err != nil {
			return fmt.Errorf("bundle: mounts[%d] at %s: %w", i, dst, err)
		}
		p.config.Files = append(p.config.Files, proto.File{Path: dst, Mode: uint32(st.Mode().Perm()), Content: content, Size: len(content)})
	default:
		return fmt.Errorf("bundle: mounts[%d] at %s: source %s is neither a directory nor a regular file", i, dst, m.Source)
	}
	return nil
}

// readSmall reads a regular file of at most max bytes.
func readSmall(name string, max int) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, max)
	}
	return b, nil
}

func isDir(field, p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("bundle: %s: %w", field, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("bundle: %s %s: not a directory", field, p)
	}
	return nil
}

// annInt parses annotation key as an integer in [lo, hi], def when absent.
func annInt(a map[string]string, key string, lo, hi, def int64) (int64, error) {
	v, ok := a[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("bundle: annotation %s %q: want an integer in [%d, %d]", key, v, lo, hi)
	}
	return n, nil
}

func (p *plan) annotations(a map[string]string) error {
	var err error
	if p.memoryBytes, err = annInt(a, annMemory, minMemory, maxMemory, defaultMemory); err != nil {
		return err
	}
	cpus, err := annInt(a, annCPUs, 1, maxCPUs, 1)
	if err != nil {
		return err
	}
	p.cpus = int(cpus)
	if p.config.PidsLimit, err = annInt(a, annPids, 0, 1<<22, 0); err != nil {
		return err
	}
	if _, ok := a[annUIDBase]; !ok {
		return fmt.Errorf("bundle: annotation %s: missing (QEMU never runs as the host's root)", annUIDBase)
	}
	base, err := annInt(a, annUIDBase, 1, maxUIDBase, 0)
	if err != nil {
		return err
	}
	p.uidBase = uint32(base)
	if d, ok := a[annDisk]; ok {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d {
			return fmt.Errorf("bundle: annotation %s %q: not a clean absolute path", annDisk, d)
		}
		p.disk = d
		if p.diskBytes, err = annInt(a, annDiskBytes, 16<<20, maxDiskBytes, -1); err != nil {
			return err
		}
		if p.diskBytes < 0 {
			return fmt.Errorf("bundle: annotation %s: missing beside %s", annDiskBytes, annDisk)
		}
		p.config.Disk = true
	}
	switch a[annDocker] {
	case "", "false":
	case "true":
		if p.disk == "" {
			return fmt.Errorf("bundle: annotation %s: needs %s", annDocker, annDisk)
		}
		p.config.Docker = true
		p.config.DockerUID, p.config.DockerGID = p.process.UID, p.process.GID
	default:
		return fmt.Errorf("bundle: annotation %s %q: want true or false", annDocker, a[annDocker])
	}
	return nil
}
