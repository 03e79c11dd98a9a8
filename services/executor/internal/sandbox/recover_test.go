package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRecover kills an executor (a child process running a sandbox) with
// SIGKILL mid-run, then checks that a fresh Manager's Recover removes every
// leftover: runtime and job processes, mounts, loop devices, cgroups,
// runtime state and scratch; on a context already ended it stops at once.
func TestRecover(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) { testRecover(t, newEnv(t), c) })
	}
}

func testRecover(t *testing.T, e *env, class Class) {
	src := e.source(t, nil)
	id := "crashed-" + string(class)
	crashHelper(t, e, class, src, id)
	rel := cgroupRel(e.m.cgParent, id)

	// An executor asked to stop while it starts: Recover stops at once,
	// the executor's Close leaves the job's cgroup (and its parent)
	// without an error, and what was not done is the next Recover's.
	stopping, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	if got, err := stopping.Recover(stopped, nil); !errors.Is(err, context.Canceled) || got != nil {
		t.Fatalf("Recover on a stopped context = %v, %v; want no ids and context.Canceled", got, err)
	}
	if err := stopping.Close(); err != nil {
		t.Fatalf("Close after a stopped Recover: %v", err)
	}
	if len(e.m.cg.procs(rel)) == 0 {
		t.Fatal("Recover on a stopped context went on to kill the job")
	}
	m, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Recover(context.Background(), nil)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if !slices.Equal(got, []string{id}) {
		t.Fatalf("Recover cleaned %v, want [%s]", got, id)
	}
	e.assertClean(t)
	if hasProcNaming(e.cfg.StateDir) {
		t.Fatal("a runtime process survived Recover")
	}
	for _, dir := range e.m.cg.dirs(rel) {
		if _, err := os.Stat(dir); err == nil {
			t.Fatalf("cgroup %s survived Recover", dir)
		}
	}
	// The id is free again, and a second Recover finds nothing.
	r := e.run(t, context.Background(), job{class: class, src: src, cmd: []string{"echo", "again"}})
	wantExit(t, r, 0)
	if err := r.sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Recover(context.Background(), nil); err != nil || len(got) != 0 {
		t.Fatalf("second Recover = %v, %v", got, err)
	}
}

// crashHelper starts an executor (a child process) whose job id runs a
// long job in class, and kills it with SIGKILL once the job runs; the
// job's processes, mounts and runtime outlive it.
//
// With layers, the job runs on an image of them (imageOf), running the
// probe the image holds.
func crashHelper(t *testing.T, e *env, class Class, src, id string, layers ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		helperEnv+"=recover",
		"HELPER_STATE="+e.cfg.StateDir,
		"HELPER_CGROUP="+e.cfg.CgroupParent,
		"HELPER_UIDBASE="+strconv.FormatUint(uint64(e.cfg.UIDBase), 10),
		"HELPER_SOURCE="+src,
		"HELPER_ID="+id,
		"HELPER_RUNC="+runcPath,
		"HELPER_RUNSC="+runscPath,
		"HELPER_CLASS="+string(class),
		"HELPER_IMAGE_LAYERS="+strings.Join(layers, "\n"),
	)
	cmd.Stderr = testWriter{t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l := <-lines:
		if l != "running" {
			t.Fatalf("helper said %q", l)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the helper's job did not start")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// The executor is gone; its sandbox is not.
	rel := cgroupRel(e.m.cgParent, id)
	if len(e.m.cg.procs(rel)) == 0 {
		t.Fatal("no job processes survived the executor, so this test proves nothing")
	}
	if points, _ := mountsUnder(e.cfg.StateDir); len(points) == 0 {
		t.Fatal("no mounts survived the executor, so this test proves nothing")
	}
	if !hasProcNaming(e.cfg.StateDir) {
		t.Fatal("no runtime process survived the executor, so this test proves nothing")
	}
}

func hasProcNaming(dir string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == strconv.Itoa(os.Getpid()) {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(b), dir+"/") {
			return true
		}
	}
	return false
}

// runHelper is the child process of TestRecover: an executor that starts a
// long job, says so, and waits to be killed.
func runHelper() int {
	uid, _ := strconv.ParseUint(os.Getenv("HELPER_UIDBASE"), 10, 32)
	m, err := New(Config{
		StateDir:     os.Getenv("HELPER_STATE"),
		RuncPath:     os.Getenv("HELPER_RUNC"),
		RunscPath:    os.Getenv("HELPER_RUNSC"),
		UIDBase:      uint32(uid),
		CgroupParent: os.Getenv("HELPER_CGROUP"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	spec := Spec{
		ID: os.Getenv("HELPER_ID"), Class: Class(os.Getenv("HELPER_CLASS")), Source: os.Getenv("HELPER_SOURCE"),
		Command: []string{"sh", "-c", "echo data > /work/x; echo tmp > /tmp/y; sleep 1000 & echo running; wait"},
		Limits:  defaultLimits, Stdout: os.Stdout, Stderr: os.Stderr,
	}
	if l := os.Getenv("HELPER_IMAGE_LAYERS"); l != "" {
		spec.Image = &ImageRoot{Digest: testImageDigest, Layers: strings.Split(l, "\n")}
		spec.Command = []string{"/bin/probe", "idle"}
	}
	sb, err := m.Create(context.Background(), spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	res, err := sb.Run(context.Background())
	fmt.Fprintln(os.Stderr, "helper: the job ended before it was killed:", res, err)
	return 1
}
