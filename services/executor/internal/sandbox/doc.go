// Package sandbox owns the executor's sandboxes: it runs one untrusted job
// in a real OCI runtime (runc, or gVisor's runsc) as a child process, with
// root inside mapped to an unprivileged host uid range, no capabilities,
// Docker's default seccomp profile, Docker's masked and read-only /proc and
// /sys paths, its own PID, mount, IPC, UTS and cgroup namespaces, a network
// namespace (a new, loopback-only one, or one the executor's netpolicy
// package made and enforces from outside: Spec.NetNS), and cgroup limits
// on memory, pids and CPU that a running job's newer grant may change
// (Sandbox.UpdateLimits), and optionally on its disk bandwidth. Cgroup v1
// hierarchies and the v2 unified hierarchy both work; on v2 the package
// stays inside the cgroup the executor was started in (cgroupsV2).
//
// A job sees a versioned root filesystem template (the host's /usr read-only
// and a synthesized /etc holding nothing of the host's), /work as an overlay
// whose lower layer is the retained source tree, and /tmp, /out and $HOME.
// Everything the job can write lives on one size-limited scratch filesystem
// per job, so the disk limit covers all of it together. A job may instead
// run on an OCI image's unpacked layers (Spec.Image, image.go): a
// read-only overlay of them under Airlock's own mount points and /etc
// pieces, with nothing of the host's.
//
// The package kills the whole process tree whenever a job ends (exit,
// deadline, OOM, full disk, cancellation), removes every mount, cgroup and
// directory it made, and on start removes whatever a crashed executor left
// behind (Manager.Recover).
//
// Only the executor's run manager and its composition root import it. It
// needs root, cgroup v1 or v2 (memory, pids and cpu controllers; v1 also
// cpuacct and freezer), overlayfs, and loop devices with ext4 (it falls back
// to a size-limited tmpfs for scratch when those are missing).
package sandbox
