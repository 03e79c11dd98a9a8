package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKeepAcrossRestart stops a sandbox as an executor that shuts down
// with a session in it does (DestroyKeeping), then makes it again on the
// kept scratch as the next executor process does: the job's /work changes
// and /out are there, /tmp and $HOME are empty, nothing else of the first
// sandbox is left, and the deadline counts from the first start.
func TestKeepAcrossRestart(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) { testKeep(t, newEnv(t), c) })
	}
}

func testKeep(t *testing.T, e *env, class Class) {
	src := e.source(t, map[string]string{"base.txt": "base\n"})
	id := "kept-" + string(class)
	spec := Spec{ID: id, Class: class, Source: src, Limits: defaultLimits,
		Command: []string{"sh", "-c", "echo changed > /work/base.txt; echo new > /work/new.txt; echo result > /out/r.txt; echo t > /tmp/t; echo h > $HOME/h"}}
	sb, err := e.m.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Run(context.Background())
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("first run: %+v, %v", res, err)
	}
	if err := sb.DestroyKeeping(); err != nil {
		t.Fatalf("DestroyKeeping: %v", err)
	}
	if !e.m.Kept(id) {
		t.Fatal("no scratch kept")
	}
	if points, _ := mountsUnder(e.cfg.StateDir); len(points) > 0 {
		t.Fatalf("mounts left after DestroyKeeping: %v", points)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.cfg.StateDir, "jobs")); len(ents) > 0 {
		t.Fatalf("job directory left after DestroyKeeping: %v", ents)
	}

	// A new process: Recover keeps what it is told to keep.
	m2, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Recover(context.Background(), func(got string) bool { return got == id }); err != nil {
		t.Fatal(err)
	}
	if !m2.Kept(id) {
		t.Fatal("Recover removed a scratch it was told to keep")
	}

	var out, errb syncBuffer
	spec.Kept, spec.Stdout, spec.Stderr = true, &out, &errb
	spec.Command = []string{"sh", "-c", "cat /work/base.txt /work/new.txt /out/r.txt; ls -A /tmp $HOME | tr '\\n' ' '"}
	sb2, err := m2.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create on the kept scratch: %v", err)
	}
	if m2.Kept(id) {
		t.Fatal("the kept scratch is still kept once a sandbox took it")
	}
	res, err = sb2.Run(context.Background())
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("second run: %+v, %v; stderr %s", res, err, errb.String())
	}
	// ls names the two directories and nothing in them.
	if got, want := out.String(), "changed\nnew\nresult\n"; !strings.HasPrefix(got, want) || strings.Contains(got, " t ") || strings.Contains(got, " h ") {
		t.Fatalf("the kept sandbox sees %q, want %q and empty /tmp and $HOME", got, want)
	}
	if _, err := os.Stat(filepath.Join(sb2.UpperDir(), "new.txt")); err != nil {
		t.Fatalf("the upper layer lost the job's change: %v", err)
	}
	if err := sb2.Destroy(); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)

	// The deadline counts from the first start, not from this Create.
	spec.Kept = false
	spec.Command = []string{"true"}
	sb3, err := m2.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb3.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sb3.DestroyKeeping(); err != nil {
		t.Fatal(err)
	}
	spec.Kept, spec.Started = true, time.Now().Add(-defaultLimits.Deadline+time.Second)
	spec.Command = []string{"sleep", "60"}
	sb4, err := m2.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, _ = sb4.Run(context.Background())
	if res.Reason != ReasonTimeout || time.Since(start) > 15*time.Second {
		t.Fatalf("a kept sandbox's deadline: %s after %s, want timeout within seconds", res.Reason, time.Since(start))
	}
	if err := sb4.Destroy(); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)
}

// TestRecoverKeeps kills an executor mid-run as TestRecover does, and
// keeps the job's scratch: what the job wrote to /work before the kill is
// there for the next sandbox, /tmp is not, and nothing else survives.
// A kept scratch nobody claims at the next Recover is removed. A Recover
// stopped before it unmounts anything loses no scratch it would keep.
func TestRecoverKeeps(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, nil)
	id := "crashed-" + string(ClassRunc)
	crashHelper(t, e, ClassRunc, src, id)

	m, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Asked to stop while it decides what to keep: Recover stops before
	// it unmounts anything, and the next Recover still keeps the scratch.
	stopped, stop := context.WithCancel(context.Background())
	defer stop()
	if _, err := m.Recover(stopped, func(got string) bool { stop(); return got == id }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Recover stopped while deciding what to keep: %v, want context.Canceled", err)
	}
	if _, err := m.Recover(context.Background(), func(got string) bool { return got == id }); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if !m.Kept(id) {
		t.Fatal("the crashed job's mounted scratch was not kept")
	}
	if pids := procsInUIDRange(e.cfg.UIDBase); len(pids) > 0 {
		t.Fatalf("the crashed job's processes survived: %v", pids)
	}
	var out syncBuffer
	sb, err := m.Create(context.Background(), Spec{ID: id, Class: ClassRunc, Source: src, Limits: defaultLimits, Kept: true,
		Command: []string{"sh", "-c", "cat /work/x; ls -A /tmp"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Run(context.Background()); err != nil || res.ExitCode != 0 {
		t.Fatalf("run on the kept scratch: %+v, %v", res, err)
	}
	if got := out.String(); got != "data\n" {
		t.Fatalf("the kept sandbox sees %q, want the job's /work/x and an empty /tmp", got)
	}
	if err := sb.DestroyKeeping(); err != nil {
		t.Fatal(err)
	}
	// Nobody claims it now: it goes.
	m2, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Recover(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if m2.Kept(id) {
		t.Fatal("a kept scratch nobody claimed survived Recover")
	}
	e.assertClean(t)
}
