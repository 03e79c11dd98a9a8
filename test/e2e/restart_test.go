//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// restartService stops the named service of s with SIGTERM, checks that it
// stopped cleanly, and starts it again with the same config, its log
// appended, in its own session, as an operator would. The new pid goes to
// the stack's pid file, so `dev down` would stop it, and the new process
// is stopped and reaped in t.Cleanup, before the stack's own cleanup runs.
// It returns once `airlock status` reports every service SERVING.
//
// The service must still be the process `dev up` started: only those are
// reaped here by pid.
func (s *stack) restartService(t testing.TB, name string) {
	t.Helper()
	s.restartServiceAfter(t, name, func() {})
}

// restartServiceAfter stops service name, runs meanwhile while it is down,
// and starts it again, returning once `airlock status` passes.
func (s *stack) restartServiceAfter(t testing.TB, name string, meanwhile func()) {
	t.Helper()
	svc, ok := s.services[name]
	if !ok {
		t.Fatalf("no service %q in the stack", name)
	}
	pidFile := filepath.Join(s.dir, name, name+".pid")
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid != svc.PID {
		t.Fatalf("%s: pid file says %q, dev up said %d", pidFile, data, svc.PID)
	}
	p := s.proc(name)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s (pid %d): %v", name, pid, err)
	}
	if p.cmd != nil {
		// Started by an earlier restart: its Wait is ours already.
		select {
		case err := <-p.exited:
			p.dead = true
			if err != nil {
				t.Fatalf("%s stopped for a restart: %v, want a clean exit 0", name, err)
			}
		case <-time.After(stopTimeout):
			t.Fatalf("%s (pid %d) still runs %v after SIGTERM", name, pid, stopTimeout)
		}
	} else {
		reapClean(t, pid, name+" stopped for a restart")
	}
	if st := procState(pid); st != "" {
		t.Fatalf("%s (pid %d) is still there (state %s) after SIGTERM", name, pid, st)
	}
	meanwhile()
	startService(t, s, name, 100*time.Millisecond, func() error {
		if res := s.airlock(t, "status"); res.code != 0 {
			return fmt.Errorf("airlock status fails:\n%s%s", res.stdout, res.stderr)
		}
		return nil
	})
}

// lastLines returns the last n lines of a file, for failure messages.
func lastLines(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// executorCgroupParent is the cgroup parent the executor of s uses by
// default: one per data directory, so other tests' executors do not count.
//
// On cgroup v2 the executor makes it below its own cgroup, the one this
// test process is in (dev up's processes inherit it), less the
// supervisor leaf the executor moves into.
func (s *stack) executorCgroupParent() string {
	sum := sha256.Sum256([]byte(s.services["executor"].DataDir))
	parent := "/airlock/" + hex.EncodeToString(sum[:6])
	if cgroupV2() {
		b, _ := os.ReadFile("/proc/self/cgroup")
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if base, ok := strings.CutPrefix(line, "0::"); ok {
				return filepath.Join(strings.TrimSuffix(base, "/supervisor"), parent)
			}
		}
	}
	return parent
}

// cgroupV2 reports whether /sys/fs/cgroup is the unified hierarchy.
func cgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// jobLimitFile is the file of a job's cgroup that holds its memory or
// pids limit, on v1 or v2.
func jobLimitFile(parent, id, limit string) string {
	if cgroupV2() {
		return filepath.Join("/sys/fs/cgroup", parent, id, map[string]string{"memory": "memory.max", "pids": "pids.max"}[limit])
	}
	return filepath.Join("/sys/fs/cgroup", limit, parent, id, map[string]string{"memory": "memory.limit_in_bytes", "pids": "pids.max"}[limit])
}

// jobMounts lists the mounts a job left under the executor's data
// directory. The sandbox state directory itself may be a mount (the
// executor binds it on itself to make it private where / is shared); only
// what lies below it belongs to jobs.
func jobMounts(dataDir string) []string {
	state := filepath.Join(dataDir, "sandbox")
	var out []string
	for _, m := range mountsUnder(dataDir) {
		if m != state {
			out = append(out, m)
		}
	}
	return out
}

// jobCgroups lists the job cgroups under the executor's cgroup parent.
func jobCgroups(parent string) []string {
	var out []string
	hierarchies := []string{"memory", "pids", "cpu", "freezer"}
	if cgroupV2() {
		hierarchies = []string{""}
	}
	for _, h := range hierarchies {
		dir := filepath.Join("/sys/fs/cgroup", h, parent)
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// artifact streams a bundle from the executor as identity as, returning
// the bytes, the header and the RPC's error.
func artifact(ctx context.Context, s *stack, t *testing.T, as, jobID, digest string) ([]byte, *executorv1.ArtifactHeader, error) {
	t.Helper()
	stream, err := executorv1.NewExecutorServiceClient(s.dial(t, as, "executor")).GetArtifact(ctx,
		&executorv1.GetArtifactRequest{JobId: jobID, BundleDigest: digest})
	if err != nil {
		return nil, nil, err
	}
	var header *executorv1.ArtifactHeader
	var buf bytes.Buffer
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), header, nil
		}
		if err != nil {
			return buf.Bytes(), header, err
		}
		if h := msg.GetHeader(); h != nil {
			header = h
		}
		buf.Write(msg.GetChunk())
	}
}

// TestBundlesSurviveExecutorRestart: a finished job's bundle is served
// byte for byte after the executor restarts, only under its own digest and
// only to the publisher; the retained source is still there and no scratch
// mount is.
func TestBundlesSurviveExecutorRestart(t *testing.T) {
	repo, commit := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", commit, "--wait", "-o", "json", "--",
		"sh", "-c", "echo kept > kept.txt && echo out > /out/report.txt && echo done")
	if res.code != 0 {
		t.Fatalf("job: exit %d\n%s", res.code, res.stderr)
	}
	job := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
		t.Fatalf("job JSON: %v\n%s", err, res.stdout)
	}
	digest := job.GetResult().GetBundleDigest()
	if job.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("job %s: state %v, bundle %q; want FINISHED with a bundle", job.GetJobId(), job.GetState(), digest)
	}
	before, headerBefore := fetchArtifact(t, s, job.GetJobId(), digest)
	if got := tarEntry(t, before, "out/report.txt"); string(got) != "out\n" {
		t.Fatalf("bundle's out/report.txt is %q", got)
	}
	sourceTree := filepath.Join(s.services["executor"].DataDir, "sources", "dev", "sample", "trees", commit)
	if _, err := os.Stat(sourceTree + ".ready"); err != nil {
		t.Fatalf("no retained source before the restart: %v", err)
	}

	s.restartService(t, "executor")

	after, headerAfter := fetchArtifact(t, s, job.GetJobId(), digest)
	if !bytes.Equal(before, after) {
		t.Errorf("the bundle changed across the restart: %d bytes before, %d after", len(before), len(after))
	}
	if headerAfter.GetBundleDigest() != digest || !bytes.Equal(headerAfter.GetProvenance(), headerBefore.GetProvenance()) {
		t.Errorf("after the restart: digest %s (want %s), provenance equal %v",
			headerAfter.GetBundleDigest(), digest, bytes.Equal(headerAfter.GetProvenance(), headerBefore.GetProvenance()))
	}
	sum := sha256.Sum256(after)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		t.Errorf("served bytes hash to %s, the recorded digest is %s", got, digest)
	}

	wrong := "sha256:" + strings.Repeat("0", 64)
	if _, _, err := artifact(ctx, s, t, "service/publisher", job.GetJobId(), wrong); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("GetArtifact with a wrong digest: %v, want FailedPrecondition", err)
	}
	if data, _, err := artifact(ctx, s, t, "client/dev", job.GetJobId(), digest); status.Code(err) != codes.PermissionDenied || len(data) != 0 {
		t.Errorf("GetArtifact as client/dev: %v with %d bytes, want PermissionDenied and nothing", err, len(data))
	}

	if _, err := os.Stat(sourceTree + ".ready"); err != nil {
		t.Errorf("the retained source is gone after the restart: %v", err)
	}
	if m := jobMounts(s.services["executor"].DataDir); len(m) != 0 {
		t.Errorf("scratch mounts after the restart: %v", m)
	}
	// And the restarted executor still runs jobs on the same commit.
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--rev", commit, "--wait", "--", "sh", "-c", "ls kept.txt 2>&1; cat lib/greet.txt")
	if res.code != 0 || !strings.Contains(res.stdout, "No such file") || !strings.Contains(res.stdout, "hello") {
		t.Errorf("a job after the restart: exit %d, want 0, no kept.txt and the source whole\n%s%s", res.code, res.stdout, res.stderr)
	}
}
