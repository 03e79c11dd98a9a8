//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestCgroupLimitsEndToEnd runs, through the CLI against a dev stack, one
// job per limit the executor enforces with cgroups, on whichever cgroup
// mode the host has (v1 on our CI host, v2 in `make test-cgroup2`'s VM):
// each ends typed as it should, the usage it reports is what it did, the
// executor's disk bandwidth bound holds, and afterwards no job process or
// job cgroup is left.
func TestCgroupLimitsEndToEnd(t *testing.T) {
	t.Parallel()
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	const bound = 4 << 20
	s.editConfig(t, "executor", func(_ string, cfg map[string]any) {
		sb, _ := cfg["sandbox"].(map[string]any)
		if sb == nil {
			sb = map[string]any{}
			cfg["sandbox"] = sb
		}
		sb["disk_read_bps"], sb["disk_write_bps"] = "4MiB", "4MiB"
	})
	s.restartService(t, "executor")

	run := func(t *testing.T, args ...string) *authorityv1.Job {
		t.Helper()
		res := s.airlock(t, append([]string{"job", "submit", "--repo", "sample", "--rev", "main", "--wait", "-o", "json"}, args...)...)
		job := &authorityv1.Job{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(res.stdout), job); err != nil || job.GetJobId() == "" {
			t.Fatalf("job submit %v: exit %d, %v\nstdout:\n%s\nstderr:\n%s", args, res.code, err, res.stdout, res.stderr)
		}
		t.Logf("job %s: %s exit %d (%s), usage %v", job.GetJobId(), job.GetResult().GetReason(), job.GetResult().GetExitCode(), job.GetMessage(), job.GetResult().GetUsage())
		return job
	}
	wantReason := func(t *testing.T, job *authorityv1.Job, want typesv1.TerminationReason) {
		t.Helper()
		if got := job.GetResult().GetReason(); got != want {
			t.Fatalf("job %s ended %s (%s), want %s", job.GetJobId(), got, job.GetMessage(), want)
		}
	}

	t.Run("a job", func(t *testing.T) {
		job := run(t, "--", "sh", "-c", "echo ok")
		wantReason(t, job, typesv1.TerminationReason_TERMINATION_REASON_EXITED)
	})
	t.Run("memory", func(t *testing.T) {
		// tail holds its whole newline-free input in memory.
		job := run(t, "--memory", "64MiB", "--", "sh", "-c", "head -c 400m /dev/zero | tail")
		wantReason(t, job, typesv1.TerminationReason_TERMINATION_REASON_OOM)
		if peak := job.GetResult().GetUsage().GetPeakMemoryBytes(); peak < 32<<20 || peak > 65<<20 {
			t.Errorf("peak memory %d, want near the 64 MiB limit", peak)
		}
	})
	t.Run("pids", func(t *testing.T) {
		job := run(t, "--pids", "32", "--timeout", "4s", "--", "sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 60")
		if r := job.GetResult().GetReason(); r != typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT && r != typesv1.TerminationReason_TERMINATION_REASON_EXITED {
			t.Fatalf("fork bomb ended %s", r)
		}
		if peak := job.GetResult().GetUsage().GetPeakPids(); peak > 32 || peak < 16 {
			t.Errorf("peak tasks %d, want near and at most 32", peak)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		job := run(t, "--timeout", "2s", "--", "sh", "-c", "(setsid sleep 300 &); nohup sleep 300 >/dev/null 2>&1 & exec sleep 300")
		wantReason(t, job, typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT)
	})
	t.Run("cpu", func(t *testing.T) {
		job := run(t, "--cpu", "0.5", "--", "sh", "-c", "timeout 4 sh -c 'while :; do :; done' & timeout 4 sh -c 'while :; do :; done'; wait")
		wantReason(t, job, typesv1.TerminationReason_TERMINATION_REASON_EXITED)
		u := job.GetResult().GetUsage()
		cpu := u.GetCpuTime().AsDuration().Seconds()
		if cores := cpu / u.GetWallTime().AsDuration().Seconds(); cores > 0.6 {
			t.Errorf("two busy loops at a 0.5-core quota used %.2f cores over the job", cores)
		}
		if cores := cpu / 4; cores < 0.3 {
			t.Errorf("two busy loops at a 0.5-core quota had %.2f cores over their 4 s", cores)
		}
	})
	t.Run("disk bandwidth", func(t *testing.T) {
		// 32 MiB at 4 MiB/s is 8 s; the kernel lets a short burst through.
		start := time.Now()
		job := run(t, "--", "dd", "if=/dev/zero", "of=/tmp/f", "bs=1M", "count=32", "oflag=direct")
		wantReason(t, job, typesv1.TerminationReason_TERMINATION_REASON_EXITED)
		if wall := job.GetResult().GetUsage().GetWallTime().AsDuration(); wall < time.Duration(float64(32<<20)/(1.25*bound)*float64(time.Second)) {
			t.Errorf("32 MiB written in %s (%s in all); the executor bounds writes to %d MiB/s", wall, time.Since(start), bound>>20)
		}
	})

	// Nothing of any job is left: no process, no job cgroup.
	parent := s.executorCgroupParent()
	var left []string
	var procs int
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if left, procs = jobCgroups(parent), sandboxProcs(parent); len(left) == 0 && procs == 0 {
			break
		}
	}
	if len(left) != 0 || procs != 0 {
		t.Errorf("after the jobs: cgroups %v and %d sandbox processes left", left, procs)
	}
	// The check above looks where the executor keeps its job cgroups.
	dir := filepath.Join("/sys/fs/cgroup", parent)
	if !cgroupV2() {
		dir = filepath.Join("/sys/fs/cgroup/memory", parent)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the executor's job parent: %v", err)
	}
	if out := s.airlock(t, "status"); !strings.Contains(out.stdout, "executor cgroup "+hostCgroupMode(t)) {
		t.Errorf("airlock status does not say the cgroup mode:\n%s", out.stdout)
	}
}
