package sandbox

import (
	"bytes"
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

// TestExportCgroupTmpfsScratchFreed: on a tmpfs scratch, what a job of
// 64 MiB leaves in /tmp (48 MiB) stayed charged to its cgroup, so its
// export was refused as oom with room for less than 16 MiB; /tmp and $HOME
// are never exported, and are emptied before the export now: a diff that
// holds 32 MiB runs.
func TestExportCgroupTmpfsScratchFreed(t *testing.T) {
	e := newEnv(t)
	e.m.pool = &scratchPool{kind: scratchTmpfs}
	lim := defaultLimits
	lim.MemoryBytes, lim.DiskBytes = 64<<20, 128<<20
	sb, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("export-tmp-%d", testSeq.Add(1)), Class: ClassRunc,
		Source: e.source(t, nil), Command: []string{"sh", "-c", "head -c 50331648 /dev/zero > /tmp/a && head -c 1024 /dev/zero > $HOME/b"}, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	if res, err := sb.Run(context.Background()); err != nil || res.Reason != ReasonExited || res.ExitCode != 0 {
		t.Fatalf("the job: %+v, %v", res, err)
	}
	dir := t.TempDir()
	for _, f := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, f), bytes.Repeat([]byte(f), 16<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cg, err := sb.ExportCgroup()
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	git := gitcmd.Cmd{Dir: dir, Env: gitcmd.Env(dir), Cgroups: cg.CgroupProcs()}
	// git diff --no-index exits 1 when the files differ.
	out, err := git.Run(context.Background(), "diff", "--no-index", "--numstat", "a", "b")
	if cg.OOMKills() > 0 || len(out) == 0 {
		t.Fatalf("a 32 MiB diff after the job left 48 MiB in a tmpfs /tmp: %q, %v, %d OOM kills", out, err, cg.OOMKills())
	}
	for _, d := range []string{scratchTmp, scratchHome} {
		if ents, _ := os.ReadDir(filepath.Join(sb.scr.point, d)); len(ents) != 0 {
			t.Errorf("the scratch's %s still holds %d entries", d, len(ents))
		}
	}
}
