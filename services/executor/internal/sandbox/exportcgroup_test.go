package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitcmd"
)

// TestExportCgroup: once a job has ended (not once destroyed), its export cgroup
// holds what the executor runs over its files under the job's memory
// limit: a git diff that would take ~700 MB is OOM-killed there, counted,
// and never passes the limit; Close removes the cgroup from every
// hierarchy, and Destroy still removes the job's.
func TestExportCgroup(t *testing.T) {
	e := newEnv(t)
	lim := defaultLimits
	lim.MemoryBytes = 64 << 20
	sb, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("export-%d", testSeq.Add(1)), Class: ClassRunc,
		Source: e.source(t, nil), Command: []string{"true"}, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	if _, err := sb.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	cg, err := sb.ExportCgroup()
	if err != nil {
		t.Fatal(err)
	}
	if cg.MemoryBytes() != lim.MemoryBytes {
		t.Errorf("its memory limit is %d, want the job's %d", cg.MemoryBytes(), lim.MemoryBytes)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lines"), []byte(strings.Repeat("\n", 16<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	git := gitcmd.Cmd{Dir: dir, Env: gitcmd.Env(dir), Cgroups: cg.CgroupProcs()}
	_, err = git.Run(context.Background(), "diff", "--no-index", "--numstat", "/dev/null", "lines")
	if err == nil || cg.OOMKills() == 0 {
		t.Fatalf("a 700 MB diff in a 64 MiB cgroup: %v, %d OOM kills", err, cg.OOMKills())
	}
	if peak := cg.PeakMemory(); peak > lim.MemoryBytes || (peak == 0 && !e.m.cg.sampling()) {
		t.Errorf("the export cgroup peaked at %d bytes, over the job's limit of %d", peak, lim.MemoryBytes)
	}
	if err := cg.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range e.m.cg.dirs(cgroupRel(sb.cgRel, exportCgroup)) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after Close: %v", d, err)
		}
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.ExportCgroup(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("ExportCgroup of a destroyed sandbox: %v", err)
	}
}

// TestExportCgroupNotThrottled: a job of 10 millicores (1% of a core)
// does not stretch its export a hundredfold: hashing 64 MiB, ~0.1 s of a
// core, took over 10 s at the job's quota; in the export cgroup it
// finishes in well under that.
func TestExportCgroupNotThrottled(t *testing.T) {
	e := newEnv(t)
	lim := defaultLimits
	lim.CPUMillis = 10
	sb, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("export-cpu-%d", testSeq.Add(1)), Class: ClassRunc,
		Source: e.source(t, nil), Command: []string{"true"}, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	if _, err := sb.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 64<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	cg, err := sb.ExportCgroup()
	if err != nil {
		t.Fatal(err)
	}
	git := gitcmd.Cmd{Dir: dir, Env: gitcmd.Env(dir), Cgroups: cg.CgroupProcs()}
	start := time.Now()
	if _, err := git.Run(context.Background(), "hash-object", "big"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("hashing 64 MiB in the export cgroup of a 10-millicore job took %v", took)
	if took > 3*time.Second {
		t.Errorf("hashing 64 MiB took %v: the export runs at the job's 1%% of a core", took)
	}
	if err := cg.Close(); err != nil {
		t.Fatal(err)
	}
}
