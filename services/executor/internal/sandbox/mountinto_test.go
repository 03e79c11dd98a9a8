package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountInto: a host directory mounted into a running runc sandbox is
// there for its next exec, read-only, nosuid and nodev, and the
// executor's own mount table does not change. From the job's side: a
// symlink it plants at the target (or on the way to it) is refused, not
// followed, and a missing target is an error naming it. Once the sandbox
// has stopped, nothing is mounted anywhere. (Only a claim mounts into a
// running sandbox: on a kernel that pools nothing, the test checks that
// Warm refuses.)
func TestMountInto(t *testing.T) {
	e := newEnv(t)
	if !pooling(t, e) {
		return
	}
	sb, stop := e.session(t, ClassRunc, e.source(t, nil))
	ctx := context.Background()
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "marker"), []byte("claimed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(host, 0o755); err != nil {
		t.Fatal(err)
	}
	// The source a shared mount, as / is on a systemd host: its clone
	// must still come in private, not as a peer of the host's.
	if err := unix.Mount(host, host, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(host, unix.MNT_DETACH) })
	if err := unix.Mount("", host, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	prep := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "mkdir -p /tmp/target /tmp/real && ln -s /etc /tmp/evil && ln -s /tmp /tmp/up"}})
	if prep.err != nil || prep.res.ExitCode != 0 {
		t.Fatalf("the job's preparation: %+v", prep)
	}

	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.MountInto(host, "/tmp/target", true); err != nil {
		t.Fatalf("MountInto: %v", err)
	}
	if after, _ := os.ReadFile("/proc/self/mountinfo"); string(after) != string(before) {
		t.Errorf("the executor's mount table changed:\n%s", after)
	}
	// No thread of the executor stays in the sandbox's mount namespace
	// (it would keep the namespace and its mounts alive after the
	// sandbox ends).
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", readPid(sb.pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/mnt")
	for _, task := range tasks {
		if ns, _ := os.Readlink(task); ns == theirs {
			t.Errorf("executor thread %s is in the sandbox's mount namespace %s", task, ns)
		}
	}
	r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "cat /tmp/target/marker; grep ' /tmp/target ' /proc/self/mountinfo; touch /tmp/target/x 2>&1"}})
	if !strings.HasPrefix(r.stdout, "claimed\n") {
		t.Errorf("the mounted file from inside: %q", r.stdout)
	}
	if !strings.Contains(r.stdout, "Read-only file system") {
		t.Errorf("inside, a write to the read-only mount: %q", r.stdout)
	}
	// The mountinfo line: id parent dev root point options [optional...] - ...
	var line []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(l); len(f) > 6 && f[4] == "/tmp/target" {
			line = f
		}
	}
	if line == nil {
		t.Fatalf("inside, no mountinfo line for /tmp/target: %q", r.stdout)
	}
	for _, opt := range []string{"ro", "nosuid", "nodev"} {
		if !slices.Contains(strings.Split(line[5], ","), opt) {
			t.Errorf("inside, the mount's options %s, want %s", line[5], opt)
		}
	}
	if line[6] != "-" {
		t.Errorf("inside, the mount propagates: %v", line[6:])
	}
	// The job (root in its user namespace) cannot take it off or make it
	// writable.
	r = runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "umount /tmp/target; umount -l /tmp/target; mount -o remount,bind,rw /tmp/target; touch /tmp/target/y || echo still-ro; cat /tmp/target/marker"}})
	if !strings.Contains(r.stdout, "still-ro\nclaimed\n") {
		t.Errorf("the job's umount and remount: %q %q", r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(host, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write through the read-only mount reached the host: %v", err)
	}

	// The job's symlinks: at the target, and on the way to it.
	for _, dst := range []string{"/tmp/evil", "/tmp/up/real"} {
		if err := sb.MountInto(host, dst, true); err == nil || !strings.Contains(err.Error(), dst) {
			t.Errorf("MountInto through the job's symlink %s: %v, want a refusal naming it", dst, err)
		}
	}
	if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "test ! -e /etc/marker && test ! -e /tmp/real/marker && echo clean"}}); r.stdout != "clean\n" {
		t.Errorf("after the refused mounts: %q %q", r.stdout, r.stderr)
	}
	if err := sb.MountInto(host, "/tmp/missing", true); err == nil || !strings.Contains(err.Error(), "/tmp/missing") {
		t.Errorf("MountInto a missing target: %v", err)
	}

	stop()
	if err := sb.MountInto(host, "/tmp/target", true); !errors.Is(err, errNotRunning) {
		t.Errorf("MountInto a stopped sandbox: %v, want %v", err, errNotRunning)
	}
	if after, _ := os.ReadFile("/proc/self/mountinfo"); strings.Count(string(after), host) != strings.Count(string(before), host) {
		t.Errorf("the host directory's mounts on the host changed after the sandbox stopped:\n%s", after)
	}

	// gVisor's sandbox does not see its host mount namespace: refused
	// before anything is looked at.
	runsc := &Sandbox{spec: Spec{ID: "runsc-job", Class: ClassRunsc}}
	if err := runsc.MountInto(host, "/tmp/target", true); err == nil || !strings.Contains(err.Error(), string(ClassRunc)) {
		t.Errorf("MountInto a runsc sandbox: %v, want a refusal naming runc", err)
	}
}

// TestMountIntoNotOwnNamespace: where the sandbox's init was, a process
// of the executor's own (its mount namespace the host's) gets no mount:
// the move refuses once it finds itself in the executor's namespace.
func TestMountIntoNotOwnNamespace(t *testing.T) {
	if !pooling(t, newEnv(t)) {
		return
	}
	host, dst := t.TempDir(), t.TempDir()
	tree, err := unix.OpenTree(unix.AT_FDCWD, host, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tree)
	self, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(self)
	own, err := pidfdNamespace(self, pidfdGetMntNamespace)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(own)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // as MountInto: the thread is thrown away
		done <- moveMountIn(own, tree, dst)
	}()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "executor's own") {
		t.Fatalf("a move into the executor's own mount namespace: %v, want a refusal", err)
	}
	if data, _ := os.ReadFile("/proc/thread-self/mountinfo"); strings.Contains(string(data), " "+dst+" ") {
		t.Fatalf("%s was mounted on the host", dst)
	}
}
