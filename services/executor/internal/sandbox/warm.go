package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// A pooled sandbox is made ahead of any job (Warm): its scratch, cgroup,
// bundle and network namespace, and its runtime started on the idle init
// with the exec helper up; nothing of a job is in it, and /work is the
// template's empty directory. A job claims it (Claim), which mounts the
// job's /work and git objects into the running sandbox (mountInto), puts
// the job's limits in force and makes the bundle the one Create would have
// written for the job; Run then takes over its runtime. A session is ready
// at once; a batch job's command runs as the sandbox's main exec, through
// the exec helper, and its end is the job's (the rest of the job is then
// killed, as when a container's init exits). The one difference a job can
// see: its command is not its PID namespace's init (the idle init is),
// so it can be signalled, by itself too, as any other process; `ps` shows
// the idle init, its sleep and the exec helper, and usage counts them. A
// claimed sandbox is the job's alone, and is destroyed after it like any
// other.

// PoolPrefix starts the name of every pooled sandbox, which is never a job
// id ('_' is not in a job id's alphabet), so Recover tells them apart.
const PoolPrefix = "pool_"

// claimFile, in a pooled sandbox's directory, holds the id of the job that
// claimed it, written before anything of the job goes in (Recover).
const claimFile = "claim"

// WarmSpec is what a pooled sandbox is made for: a job or session of this
// class, user, limits (the disk limit sizes its scratch, the memory limit
// its /dev/shm; a claim may change the others) and network namespace. Only ClassRunc sandboxes, on the host template, with the exec
// helper, are pooled.
type WarmSpec struct {
	// Name is PoolPrefix and then 1 to 59 of [a-zA-Z0-9-].
	Name   string
	Class  Class
	User   runspec.User
	Limits Limits
	NetNS  string
}

// Warm makes a pooled sandbox and starts it, returning once its exec
// helper is up (or ctx ends, or it fails: then nothing of it is left).
func (m *Manager) Warm(ctx context.Context, ws WarmSpec) (_ *Sandbox, err error) {
	name, ok := strings.CutPrefix(ws.Name, PoolPrefix)
	if !ok || name == "" || strings.Contains(name, "_") || !idFormat.MatchString(ws.Name) {
		return nil, invalid("warm.name %q: want %q and 1 to %d of [a-zA-Z0-9-]", ws.Name, PoolPrefix, 64-len(PoolPrefix))
	}
	if ws.Class != ClassRunc {
		return nil, invalid("warm.class %q: only %s sandboxes are pooled", ws.Class, ClassRunc)
	}
	if m.execdWhy != "" {
		return nil, fmt.Errorf("%w: no sandbox is pooled without the exec helper: %s", errdefs.ErrFailedPrecondition, m.execdWhy)
	}
	if err := runspec.CheckUser(ws.User); err != nil {
		return nil, invalid("warm.user %v", err)
	}
	if err := checkLimits("warm.limits", ws.Class, ws.Limits); err != nil {
		return nil, err
	}
	// (m.create checks the network namespace.)
	spec := Spec{ID: ws.Name, Class: ws.Class, Command: IdleCommand, Limits: ws.Limits, User: ws.User, NetNS: ws.NetNS}
	if st, ok := m.Available(ws.Class); !ok {
		return nil, fmt.Errorf("%w: warm.class %s is not available on this executor: %s", errdefs.ErrFailedPrecondition, ws.Class, st.Reason)
	}
	s, err := m.create(ctx, spec, true)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if derr := s.Destroy(); derr != nil {
				m.log.Error("sandbox: remove a pooled sandbox that did not come up", "name", ws.Name, "error", derr)
			}
		}
	}()
	// Its init prints nothing, and no job reads what it might.
	up, err := s.start(io.Discard, io.Discard)
	if err != nil {
		return nil, err
	}
	// Running, with no Run owning it until a claim's.
	s.mu.Lock()
	s.state, s.warm = stateRunning, up
	s.runDone = make(chan struct{})
	s.deadlineChanged = make(chan struct{}, 1)
	s.mu.Unlock()
	proc, err := s.waitUp(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := s.execdFor(proc); err != nil {
		return nil, fmt.Errorf("sandbox %s: start the exec helper: %w", ws.Name, err)
	}
	return s, nil
}

// Name is the sandbox's name on the host: its job's id, or, for a pooled
// sandbox, the name Warm gave it.
func (s *Sandbox) Name() string { return s.name }

// Claim makes the pooled sandbox spec's job's (a batch job's or a
// session's): spec must be of the class, user, disk limit, /dev/shm size
// (half the memory limit, at most 64 MiB) and network namespace the
// sandbox was made for, on the host template, with no caches, name
// servers or CAs of its own, and not kept. Its /work and git objects are
// mounted in, its limits put in force, and its bundle made Create's for
// spec (which a Restart runs). A sandbox whose runtime died while it
// waited is refused (errdefs.ErrFailedPrecondition). On any error the
// sandbox is of no more use: the caller destroys it.
func (s *Sandbox) Claim(spec Spec) (err error) {
	if err := spec.validate(); err != nil {
		return err
	}
	if strings.HasPrefix(spec.ID, PoolPrefix) {
		return invalid("spec.id %q: a job's id, not a pooled sandbox's", spec.ID)
	}
	if why := s.claimMismatch(spec); why != "" {
		return fmt.Errorf("%w: sandbox %s: not made for job %s: %s", errdefs.ErrFailedPrecondition, s.name, spec.ID, why)
	}
	if fi, serr := os.Stat(spec.Source); serr != nil || !fi.IsDir() {
		return invalid("spec.source %q: not a directory", spec.Source)
	}
	if spec.GitObjects != "" {
		if fi, err := os.Stat(spec.GitObjects); err != nil || !fi.IsDir() {
			return invalid("spec.git_objects %q: not a directory", spec.GitObjects)
		}
	}
	s.mu.Lock()
	switch {
	case !s.pooled || s.claimed || s.claiming:
		s.mu.Unlock()
		return fmt.Errorf("%w: sandbox %s: not a pooled sandbox waiting for a job", errdefs.ErrFailedPrecondition, s.name)
	case s.warm == nil || s.ending || s.state != stateRunning:
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s: %w", s.name, errNotRunning)
	}
	select {
	case <-s.warm.done:
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s: %w (its runtime exited while it waited)", s.name, errNotRunning)
	default:
	}
	s.claiming = true
	old := s.spec.Limits
	spec.Command = append([]string(nil), spec.Command...)
	s.spec = spec
	s.mu.Unlock()
	// Named before anything of the job goes in: a Recover after a crash
	// finds whose it was. A failed claim takes the name back (the job
	// makes a sandbox of its own, which Recover finds under its id).
	claim := filepath.Join(s.dir, claimFile)
	if err := os.WriteFile(claim, []byte(spec.ID), 0o600); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(claim)
		}
	}()
	if err := s.mountWork(); err != nil {
		return err
	}
	if err := s.mountInto(s.workDir, "/work", 0); err != nil {
		return err
	}
	if spec.GitObjects != "" {
		if err := s.mountInto(spec.GitObjects, "/.airlock/git-objects", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return err
		}
	}
	if err := s.m.cg.setLimits(s.cgRel, cgroupLimitsOf(spec.Class, old), cgroupLimitsOf(spec.Class, spec.Limits)); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%w: limits.memory_bytes %d: below what the pooled sandbox holds", errdefs.ErrFailedPrecondition, spec.Limits.MemoryBytes)
		}
		return fmt.Errorf("sandbox %s: limits: %w", s.name, err)
	}
	in := s.bundleIn
	in.work, in.gitObjects = s.workDir, spec.GitObjects
	in.env, in.command, in.pids = spec.Env, spec.Command, spec.Limits.Pids
	s.bundleIn = in
	if err := s.writeBundle(); err != nil {
		return err
	}
	// Execs take the job's process spec (env, cwd /work) from the bundle
	// now written, not the pooled one the helper started on.
	s.execOnce, s.execProc, s.execErr = sync.Once{}, nil, nil
	s.mu.Lock()
	s.claiming, s.claimed = false, true
	s.mu.Unlock()
	return nil
}

// claimMismatch says how spec differs from what the pooled sandbox was
// made for ("" when it does not).
func (s *Sandbox) claimMismatch(spec Spec) string {
	s.mu.Lock()
	made := s.spec
	s.mu.Unlock()
	switch {
	case spec.Class != made.Class:
		return fmt.Sprintf("class %s, not %s", spec.Class, made.Class)
	case spec.User != made.User:
		return fmt.Sprintf("user %d:%d, not %d:%d", spec.User.UID, spec.User.GID, made.User.UID, made.User.GID)
	case spec.Limits.DiskBytes != made.Limits.DiskBytes:
		return fmt.Sprintf("limits.disk_bytes %d, not %d", spec.Limits.DiskBytes, made.Limits.DiskBytes)
	case ShmSize(spec.Limits) != ShmSize(made.Limits):
		return fmt.Sprintf("a /dev/shm of %d bytes, not %d", ShmSize(spec.Limits), ShmSize(made.Limits))
	case spec.NetNS != made.NetNS:
		return "another network namespace"
	case spec.Image != nil:
		return "an image"
	case len(spec.Caches) > 0:
		return "caches"
	case len(spec.Nameservers) > 0 || len(spec.ExtraCAs) > 0:
		return "name servers or CAs of its own"
	case spec.Kept:
		return "a kept session"
	case spec.Docker:
		return "docker"
	}
	return ""
}

// ShmSize is the size of the /dev/shm of a job of limits l: half its
// memory, at most 64 MiB.
func ShmSize(l Limits) int64 { return min(64<<20, l.MemoryBytes/2) }

// claimedJob is the job a pooled sandbox's directory says claimed it, ""
// if none did.
func claimedJob(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, claimFile))
	if err != nil || !idFormat.Match(b) || strings.HasPrefix(string(b), PoolPrefix) {
		return ""
	}
	return string(b)
}
