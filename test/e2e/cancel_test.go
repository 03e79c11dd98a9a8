//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// syncBuffer is a bytes.Buffer a running command writes while the test
// reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// background is a CLI command running beside the test.
type background struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	err            error // set before done closes
}

// startAirlock starts the CLI with args in the background; t.Cleanup
// kills it if it is still running and waits for it.
func (s *stack) startAirlock(t *testing.T, args ...string) *background {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	cmd := exec.CommandContext(ctx, bin("airlock"), args...)
	cmd.Env = append(cmd.Environ(), s.env()...)
	cmd.WaitDelay = 5 * time.Second
	b := &background{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &b.stdout, &b.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		b.err = cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(func() { cancel(); <-b.done })
	return b
}

// exitCode waits up to d for the command and returns its exit code, or -1
// if it is still running.
func (b *background) exitCode(d time.Duration) int {
	select {
	case <-b.done:
	case <-time.After(d):
		return -1
	}
	var ee *exec.ExitError
	if errors.As(b.err, &ee) {
		return ee.ExitCode()
	}
	if b.err != nil {
		return -1
	}
	return 0
}

// TestCancelStopsTheSandbox: cancelling a running job ends it within
// seconds as CANCELLED, a watcher exits with the cancelled code, and
// nothing of its sandbox is left: no process, no mount, no cgroup.
// Cancelling a job that has ended changes nothing.
func TestCancelStopsTheSandbox(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	resp, err := client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: "cancel-me",
		Spec: &authorityv1.JobSpec{Repository: "sample", Revision: "main", Command: []string{"sh", "-c", "echo started; sleep 300"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetJobId()
	watch := s.startAirlock(t, "job", "watch", id)
	for start := time.Now(); !strings.Contains(watch.stdout.String(), "started"); time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 30*time.Second || watch.exitCode(0) != -1 {
			t.Fatalf("`airlock job watch` did not show \"started\" (exit %d)\nstdout:\n%s\nstderr:\n%s", watch.exitCode(0), watch.stdout.String(), watch.stderr.String())
		}
	}
	if st := s.job(t, id).GetState(); st != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("job printed \"started\" but is %v, want RUNNING", st)
	}
	// The checks after the cancel prove something only if the running job
	// is visible to them now.
	parent, dataDir := s.executorCgroupParent(), s.services["executor"].DataDir
	if n, m, c := sandboxProcs(parent), jobMounts(dataDir), jobCgroups(parent); n == 0 || len(m) == 0 || len(c) == 0 {
		t.Fatalf("while the job runs: %d sandbox processes, mounts %v, cgroups %v; want some of each", n, m, c)
	}

	cancelled := time.Now()
	res := s.airlock(t, "job", "cancel", id, "--reason", "e2e")
	if res.code != 0 || !strings.Contains(res.stdout, "cancel requested for "+id) {
		t.Fatalf("job cancel: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	job := waitJob(wctx, t, client, id, func(j *authorityv1.Job) bool { return terminalState(j.GetState()) })
	took := time.Since(cancelled)
	if job.GetState() != authorityv1.JobState_JOB_STATE_CANCELLED || job.GetResult().GetReason() != typesv1.TerminationReason_TERMINATION_REASON_CANCELLED {
		t.Fatalf("after cancel: %v, reason %v (%s); want CANCELLED, CANCELLED", job.GetState(), job.GetResult().GetReason(), job.GetMessage())
	}
	if took > 5*time.Second {
		t.Errorf("the cancel took %v to end the job, want a few seconds", took)
	}
	// The executor kills the whole tree before it reports.
	if n := sandboxProcs(parent); n != 0 {
		t.Errorf("%d processes of the cancelled job survive its CANCELLED report", n)
	}
	// Its mounts and cgroups go when the sandbox is destroyed, just after.
	var mounts, cgroups []string
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(50 * time.Millisecond) {
		if mounts, cgroups = jobMounts(dataDir), jobCgroups(parent); len(mounts) == 0 && len(cgroups) == 0 {
			break
		}
	}
	if len(mounts) != 0 || len(cgroups) != 0 {
		t.Errorf("5s after the cancel: mounts %v, cgroups %v; want none", mounts, cgroups)
	}
	if code := watch.exitCode(10 * time.Second); code != 130 || !strings.Contains(watch.stderr.String(), "[airlock] cancelled") {
		t.Errorf("`airlock job watch`: exit %d, want 130 with [airlock] cancelled on stderr\n%s", code, watch.stderr.String())
	}
	if n := sandboxProcs(parent); n != 0 {
		t.Errorf("%d processes of the cancelled job appeared after it ended", n)
	}

	// Cancelling again, and cancelling a finished job, change nothing.
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "-o", "json", "--", "true")
	if res.code != 0 {
		t.Fatalf("job true: exit %d\n%s", res.code, res.stderr)
	}
	finished := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), finished); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{id, finished.GetJobId()} {
		before := s.job(t, id)
		res := s.airlock(t, "job", "cancel", id)
		// Either accepted as a no-op or refused as already ended.
		if res.code != 0 && !strings.Contains(res.stderr, "already ended") {
			t.Errorf("cancel of %v job %s: exit %d, %s; want success or a refusal saying it already ended", before.GetState(), id, res.code, res.stderr)
		}
		if after := s.job(t, id); !proto.Equal(before, after) {
			t.Errorf("cancel of %v job %s changed it:\nbefore %v\nafter  %v", before.GetState(), id, before, after)
		}
	}
}
