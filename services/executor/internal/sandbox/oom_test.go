package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// When the host runs short of memory, the kernel's OOM killer takes a job
// first: under each runtime class every host process in the job's cgroup
// (under runsc the sentry, its stub processes and the gofer) has
// oom_score_adj 1000, and so does the job's own process under runc as it
// reads it itself. And the jobs together never take more than
// Config.MemoryLimit: the cgroup holding every job's has that limit.
func TestJobsAreOOMKilledFirst(t *testing.T) {
	const limit = 768 << 20
	e := newEnv(t, func(c *Config) { c.MemoryLimit = limit })
	wantLimit := func(want int64) {
		t.Helper()
		for file, limit := range parentMemoryLimits(t, e) {
			if limit != want {
				t.Errorf("%s of the cgroup parent = %d, want %d", file, limit, want)
			}
		}
	}
	wantLimit(limit)
	// A parent an earlier executor left with another limit takes the new
	// one, higher or lower (memsw must never be below the memory limit).
	for _, l := range []int64{2 << 30, 512 << 20, limit} {
		if err := e.m.cg.prepareParent(e.m.cgParent, l); err != nil {
			t.Fatalf("prepareParent(%d): %v", l, err)
		}
		wantLimit(l)
	}
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			var out syncBuffer
			sb, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("oom-%d", testSeq.Add(1)), Class: c, Source: e.source(t, nil),
				Command: []string{"sh", "-c", "echo adj=$(cat /proc/self/oom_score_adj); " + waitForSignal + "echo done"},
				Limits:  defaultLimits, Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := sb.Destroy(); err != nil {
					t.Errorf("Destroy: %v", err)
				}
			})
			done := make(chan ran, 1)
			go func() {
				res, err := sb.Run(context.Background())
				done <- ran{res: res, err: err, stdout: out.String()}
			}()
			waitFor(t, "the job to print ready", 20*time.Second, func() bool { return strings.Contains(out.String(), "ready") })
			// gVisor's /proc shows its own per-task score, which it never
			// takes from the spec and the host kernel never sees; the
			// host processes below are what the OOM killer weighs.
			if want := map[Class]string{ClassRunc: "adj=1000\n", ClassRunsc: "adj=0\n"}[c]; !strings.Contains(out.String(), want) {
				t.Errorf("inside the job: %q, want %s", out.String(), want)
			}
			pids := e.m.cg.procs(sb.cgRel)
			if len(pids) == 0 {
				t.Error("no process in the job's cgroup")
			}
			for _, pid := range pids {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
				if err != nil {
					continue // gone meanwhile
				}
				if adj := strings.TrimSpace(string(b)); adj != "1000" {
					comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
					t.Errorf("process %d (%s) of the job has oom_score_adj %s, want 1000", pid, strings.TrimSpace(string(comm)), adj)
				}
			}
			if err := sb.Signal(syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-done:
				wantExit(t, r, 0)
			case <-time.After(60 * time.Second):
				t.Fatal("the job did not end")
			}
		})
	}
}

// The executor itself must not be inside the cgroup parent: its limits
// would bound it and Recover would kill it as a job's leftover.
func TestCgroupParentOutsideExecutor(t *testing.T) {
	e := newEnv(t)
	// v1: the memory hierarchy's line; v2: the unified one's.
	ctl := map[string]string{"v1": "memory", "v2": ""}[e.m.cg.mode()]
	self := ""
	for _, line := range strings.Split(readFile(t, "/proc/self/cgroup"), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == ctl {
			self = f[2]
		}
	}
	if self == "" {
		t.Fatalf("this process has no %s cgroup", e.m.cg.mode())
	}
	if err := e.m.cg.checkOutside(self); err == nil || !strings.Contains(err.Error(), "the executor itself is in") {
		t.Errorf("checkOutside(%s), this process's own cgroup: %v", self, err)
	}
	if self != "/" {
		if err := e.m.cg.checkOutside(filepath.Dir(self)); err == nil {
			t.Errorf("checkOutside(%s), above this process's cgroup, passed", filepath.Dir(self))
		}
	}
	if err := e.m.cg.checkOutside(e.m.cgParent); err != nil {
		t.Errorf("checkOutside(%s): %v", e.m.cgParent, err)
	}
}

// parentMemoryLimits reads the memory limits of the cgroup holding every
// job's, by file: on v1 the memory limit and, where swap is accounted, the
// memory+swap one (the same: no swap); on v2 memory.max, and swap.max
// reported as the memory limit when it is 0 (no swap beyond it).
func parentMemoryLimits(t *testing.T, e *env) map[string]int64 {
	t.Helper()
	dir := e.m.cg.dirs(e.m.cgParent)[0]
	files := map[string][]string{
		"v1": {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"},
		"v2": {"memory.max", "memory.swap.max"},
	}[e.m.cg.mode()]
	out := map[string]int64{}
	if e.m.cg.mode() == "v1" {
		dir = e.m.cg.(*cgroupsV1).dir("memory", e.m.cgParent)
	}
	for i, file := range files {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if os.IsNotExist(err) && i > 0 {
			continue // no swap accounting on this host
		}
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if file == "memory.swap.max" {
			if n != 0 {
				t.Errorf("memory.swap.max of the cgroup parent = %d, want 0", n)
			}
			continue
		}
		out[file] = n
	}
	return out
}
