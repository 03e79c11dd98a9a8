package runs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// sparseJob runs script under limits lim and returns its end and its
// bundle's path and size.
func sparseJob(t *testing.T, h *harness, script string, lim func(*sandbox.Limits)) (Run, string, int64) {
	t.Helper()
	g := h.grantFor(script)
	if lim != nil {
		lim(&g.Limits)
	}
	h.start(t, g)
	run := h.waitEnd(t, g.JobID)
	path := filepath.Join(h.m.runDir(g.JobID), "bundle.tar")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("no bundle: %v (result %+v)", err, run.Result)
	}
	if run.Result.BundleSize != st.Size() {
		t.Errorf("the result says the bundle has %d bytes, it has %d", run.Result.BundleSize, st.Size())
	}
	return run, path, st.Size()
}

// wantOverDisk checks a run ended disk_full naming inside (a path as the
// job sees it) and its apparent size, never a host path, and that its
// bundle holds nothing of /work or /out.
func wantOverDisk(t *testing.T, h *harness, run Run, bundlePath string, size int64, inside string, apparent int64) {
	t.Helper()
	if run.State != Finished || run.Result.Reason != sandbox.ReasonDiskFull {
		t.Fatalf("the job ended %s/%s, want finished/disk_full: %+v", run.State, run.Result.Reason, run.Result)
	}
	msg := run.Result.Message
	if !strings.Contains(msg, inside) || !strings.Contains(msg, fmt.Sprint(apparent)) {
		t.Errorf("the message does not name %s and its apparent size %d: %q", inside, apparent, msg)
	}
	if strings.Contains(msg, h.base) {
		t.Errorf("the message names a host path: %q", msg)
	}
	wantNothingExported(t, run, bundlePath, size)
}

// wantNothingExported checks that a run's bundle (of size bytes) holds
// nothing of /work or /out: no /out file, an empty patch.
func wantNothingExported(t *testing.T, run Run, bundlePath string, size int64) {
	t.Helper()
	if size > 1<<20 {
		t.Errorf("the bundle has %d bytes: what the job left was copied into it", size)
	}
	names, err := bundle.Names(bundlePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, bundle.OutDir) {
			t.Errorf("the bundle of a job over its limits holds %s", n)
		}
	}
	patch, err := bundle.ReadEntry(bundlePath, bundle.PatchFile)
	if err != nil || len(patch) != 0 || run.Result.FilesChanged != 0 {
		t.Errorf("the bundle of a job over its limits has a patch of %d bytes (%d files, %v)", len(patch), run.Result.FilesChanged, err)
	}
}

// TestSparseOutIsNotCopiedWhole: a job with a 32 MiB disk leaves a 3 GiB
// sparse file in /out (it takes no blocks inside). The bundle used to
// copy it whole onto the executor's disk; now the apparent sizes of what
// leaves the sandbox count against the disk limit, and the job ends
// disk_full naming /out/big and its size, with nothing of /out copied.
func TestSparseOutIsNotCopiedWhole(t *testing.T) {
	h, _ := newHarness(t, false)
	run, path, size := sparseJob(t, h, "truncate -s 3G /out/big && echo left", nil)
	wantOverDisk(t, h, run, path, size, "/out/big", 3<<30)
}

// TestSparseWorkIsNotGivenToGit: a job with 64 MiB of memory leaves a
// 1900 MiB sparse file in /work. The executor's git (outside the job's
// cgroup) used to read it whole, at ~1.9 GB of RSS for a minute; now git
// never sees it: the job ends disk_full naming /work/big, and no process
// the executor ran grew anywhere near its size.
func TestSparseWorkIsNotGivenToGit(t *testing.T) {
	h, _ := newHarness(t, false)
	const bound = 512 << 20
	before := childPeakRSS(t)
	start := time.Now()
	run, path, size := sparseJob(t, h, "truncate -s 1900M /work/big && echo changed >> README", func(l *sandbox.Limits) { l.MemoryBytes = 64 << 20 })
	wantOverDisk(t, h, run, path, size, "/work/big", 1900<<20)
	if before < bound {
		if peak := childPeakRSS(t); peak >= bound {
			t.Errorf("a process the executor waited for peaked at %d MiB of RSS (the sparse file is 1900 MiB)", peak>>20)
		}
	} else {
		t.Logf("an earlier test's child already peaked at %d MiB: RSS not measurable here", before>>20)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the job took %s: the patch was computed over the sparse file", d)
	}
}

// childPeakRSS is the largest RSS any waited-for child of this process
// has had.
func childPeakRSS(t *testing.T) int64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Maxrss << 10
}

// TestSparseTmpDoesNotMatter: a sparse file in /tmp never leaves the
// sandbox, so it does not count: the job ends as it exited, with its
// /out file and patch in a small bundle.
func TestSparseTmpDoesNotMatter(t *testing.T) {
	h, _ := newHarness(t, false)
	run, path, size := sparseJob(t, h, "truncate -s 3G /tmp/big && echo small > /out/small && echo changed >> README", nil)
	if run.Result.Reason != sandbox.ReasonExited || run.Result.ExitCode != 0 {
		t.Fatalf("the job ended %s (exit %d): %q", run.Result.Reason, run.Result.ExitCode, run.Result.Message)
	}
	if size > 1<<20 {
		t.Errorf("the bundle has %d bytes", size)
	}
	data, err := bundle.ReadEntry(path, bundle.OutDir+"small")
	if err != nil || string(data) != "small\n" {
		t.Errorf("out/small: %q, %v", data, err)
	}
	if run.Result.FilesChanged != 1 {
		t.Errorf("the patch changes %d files, want README", run.Result.FilesChanged)
	}
}

// punchScript writes two files of real blocks into dir, freeing most of
// the first's blocks in between (fallocate --punch-hole keeps its size):
// 24 MiB + 20 MiB apparent, about 24 MiB used, on a 32 MiB disk.
func punchScript(dir string) string {
	return fmt.Sprintf(`set -e
head -c 24M /dev/zero > %[1]s/a
fallocate --punch-hole --offset 0 --length 20M %[1]s/a
head -c 20M /dev/zero > %[1]s/b
echo written`, dir)
}

// TestHolePunchedOut: blocks freed from a /out file let the job write
// more than its disk limit in apparent size; the job ends disk_full
// naming the largest file, and the bundle copies none of it.
func TestHolePunchedOut(t *testing.T) {
	h, _ := newHarness(t, false)
	run, path, size := sparseJob(t, h, punchScript("/out"), nil)
	wantOverDisk(t, h, run, path, size, "/out/a", 24<<20)
}

// TestHolePunchedWork is TestHolePunchedOut in /work: git is not run over
// the files, and the patch is empty.
func TestHolePunchedWork(t *testing.T) {
	h, _ := newHarness(t, false)
	run, path, size := sparseJob(t, h, punchScript("/work"), nil)
	wantOverDisk(t, h, run, path, size, "/work/a", 24<<20)
}

// TestSparseDownloadRefused: a session's 100 GB sparse /out file is
// refused before a byte of it is sent, naming its path in the sandbox and
// its apparent size; a file within the disk limit still reads.
func TestSparseDownloadRefused(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	h.execWait(t, sid, sh("sparse", "truncate -s 100G /out/s && echo ok > /out/ok"))
	var sent int64 = -1
	err := h.m.ReadFile(context.Background(), sid, "/out/s", func(size int64) error {
		sent = size
		return errors.New("the test stops a stream it should never have had")
	}, func([]byte) error { return nil })
	if sent >= 0 {
		t.Fatalf("the executor began sending a sparse file of %d bytes", sent)
	}
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "/out/s") ||
		!strings.Contains(err.Error(), fmt.Sprint(int64(100)<<30)) || strings.Contains(err.Error(), h.base) {
		t.Fatalf("ReadFile of a 100 GiB sparse file: %v", err)
	}
	var got []byte
	if err := h.m.ReadFile(context.Background(), sid, "/out/ok", func(int64) error { return nil }, func(b []byte) error { got = append(got, b...); return nil }); err != nil || string(got) != "ok\n" {
		t.Fatalf("ReadFile /out/ok: %q, %v", got, err)
	}
}

// TestSmallFileReadWhole: a small file read whole before ReadFile waits
// for its opening (the hook holds ReadFile back) is still sent, size and
// bytes, every time; select chose between the two ready channels at
// random and half the time sent nothing, with no error.
func TestSmallFileReadWhole(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	h.execWait(t, sid, sh("small", "echo ok > /out/ok"))
	testHookReadFileSelect = func() { time.Sleep(5 * time.Millisecond) }
	defer func() { testHookReadFileSelect = nil }()
	for i := range 30 {
		var got []byte
		size := int64(-1)
		err := h.m.ReadFile(context.Background(), sid, "/out/ok", func(n int64) error { size = n; return nil },
			func(b []byte) error { got = append(got, b...); return nil })
		if err != nil || size != 3 || string(got) != "ok\n" {
			t.Fatalf("read %d of /out/ok: size %d, %q, %v", i, size, got, err)
		}
	}
}
