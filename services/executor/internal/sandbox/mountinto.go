package sandbox

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// MountInto mounts the host directory src at dst, an existing directory
// inside the running sandbox reached without a symlink, nosuid and nodev,
// and read-only if readOnly: how a sandbox made ahead of its job gets the
// job's files (issue 29's warm pools). The mount is cloned on the host
// (open_tree: src alone, none of the mounts below it) and moved into the
// sandbox's mount namespace from an executor thread that joins that
// namespace and nothing else, so nothing in the sandbox takes part and no
// other part of the host's mount tree goes in with it. runc only: a
// gVisor sandbox does not see its host mount namespace's changes.
//
// src is the executor's own directory (its last component is not followed
// if a symlink); dst an absolute, clean path.
func (s *Sandbox) MountInto(src, dst string, readOnly bool) error {
	var attrs uint64
	if readOnly {
		attrs = unix.MOUNT_ATTR_RDONLY
	}
	return s.mountInto(src, dst, attrs)
}

// mountInto is MountInto with attrs (MOUNT_ATTR_*) set beside nosuid and
// nodev.
func (s *Sandbox) mountInto(src, dst string, attrs uint64) error {
	if s.spec.Class != ClassRunc {
		return fmt.Errorf("sandbox %s: a mount into a running sandbox needs class %s, not %s", s.spec.ID, ClassRunc, s.spec.Class)
	}
	if !path.IsAbs(dst) || path.Clean(dst) != dst {
		return fmt.Errorf("sandbox %s: mount target %q: want an absolute, clean path", s.spec.ID, dst)
	}
	s.mu.Lock()
	running := s.state == stateRunning && !s.ending
	s.mu.Unlock()
	if !running {
		return fmt.Errorf("sandbox %s: %w", s.spec.ID, errNotRunning)
	}
	pidfd, err := s.initPidfd()
	if err != nil {
		return err
	}
	mntns, err := pidfdNamespace(pidfd, pidfdGetMntNamespace)
	unix.Close(pidfd)
	if err != nil {
		return fmt.Errorf("sandbox %s: its mount namespace: %w", s.spec.ID, err)
	}
	defer unix.Close(mntns)
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	// Private: a clone of a shared mount would join its peer group, and
	// mounts made under either side would then show up in the other.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | attrs, Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		// The thread leaves the process's shared file system context and
		// joins the sandbox's mount namespace: it is never unlocked, so no
		// other goroutine runs on it, and it ends with this one, or, if
		// it is the process's main thread, which cannot end, is parked
		// for good. moveMountIn takes it back to the executor's mount
		// namespace either way: a thread left in the sandbox's would keep
		// that namespace, and every mount in it, alive.
		runtime.LockOSThread()
		done <- moveMountIn(mntns, tree, dst)
	}()
	if err := <-done; err != nil {
		return fmt.Errorf("sandbox %s: mount at %s: %w", s.spec.ID, dst, err)
	}
	return nil
}

// moveMountIn moves the detached mount tree onto dst in the mount
// namespace mntns (never the executor's own), and returns the calling
// thread (locked, and thrown away after) to the mount namespace it had.
func moveMountIn(mntns, tree int, dst string) (err error) {
	own, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the executor's mount namespace: %w", err)
	}
	defer unix.Close(own)
	// A process of the executor's own where the sandbox's init was
	// would put the mount on the host.
	var ownSt, theirSt unix.Stat_t
	if err := unix.Fstat(own, &ownSt); err != nil {
		return err
	}
	if err := unix.Fstat(mntns, &theirSt); err != nil {
		return err
	}
	if ownSt.Dev == theirSt.Dev && ownSt.Ino == theirSt.Ino {
		return fmt.Errorf("%w: the mount namespace is the executor's own, not a sandbox's: refused", errdefs.ErrFailedPrecondition)
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare(CLONE_FS): %w", err)
	}
	if err := unix.Setns(mntns, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	defer func() {
		if berr := unix.Setns(own, unix.CLONE_NEWNS); berr != nil {
			err = errors.Join(err, fmt.Errorf("back to the executor's mount namespace: %w", berr))
		}
	}()
	// From the namespace's root (setns put the thread there), with no
	// symlink on the way: the sandbox cannot point the mount elsewhere.
	target, err := unix.Openat2(unix.AT_FDCWD, dst, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("open %s: %w", dst, err)
	}
	defer unix.Close(target)
	if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// errNotRunning is a sandbox whose init is not (or no longer) running.
var errNotRunning = fmt.Errorf("%w: the sandbox is not running", errdefs.ErrFailedPrecondition)

// initPidfd is a pidfd of the sandbox's init, checked to be in the
// sandbox's cgroup while the pidfd still names a live process (so the pid
// was not reused by another after the sandbox ended).
func (s *Sandbox) initPidfd() (int, error) {
	pid := readPid(s.pidFile)
	if pid <= 0 {
		return -1, fmt.Errorf("sandbox %s: %w", s.spec.ID, errNotRunning)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("sandbox %s: %w (pidfd_open: %v)", s.spec.ID, errNotRunning, err)
	}
	// The runtime's cgroup alone: the executor's own processes (the
	// export's git) run in another below the sandbox's.
	if !slices.Contains(s.m.cg.procs(filepath.Join(s.cgRel, runtimeCgroup)), pid) || unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil {
		unix.Close(pidfd)
		return -1, fmt.Errorf("sandbox %s: %w (its init, pid %d, is gone)", s.spec.ID, errNotRunning, pid)
	}
	return pidfd, nil
}
