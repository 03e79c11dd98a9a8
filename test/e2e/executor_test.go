//go:build linux

package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/grant"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// testGrant is a complete grant for job id on commit, as the authority would
// sign it.
func testGrant(id, commit string, ttl time.Duration) *typesv1.Grant {
	issued, expires := grant.Timestamps(time.Now(), ttl)
	return &typesv1.Grant{
		Executor: "spiffe://airlock.local/service/executor",
		JobId:    id, Tenant: "dev", Requester: "spiffe://airlock.local/client/dev", Repository: "sample", Commit: commit,
		Command: []string{"true"},
		Limits: &typesv1.ResourceLimits{CpuMillis: 500, MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 64 << 20,
			Deadline: durationpb.New(time.Minute)},
		NetworkPolicy:           &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}},
		NetworkPolicyGeneration: 1,
		RuntimeClass:            typesv1.RuntimeClass_RUNTIME_CLASS_RUNC,
		IssuedAt:                issued, ExpiresAt: expires,
	}
}

// TestExecutorRunsOnlyValidGrants speaks to the real executor as the real
// authority identity: only a grant signed with the authority's key, not
// expired and not altered, starts a run, and a job id runs at most once.
func TestExecutorRunsOnlyValidGrants(t *testing.T) {
	repo, commit := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	signer, err := grant.LoadOrCreateSigner(filepath.Join(s.dir, "authority", "grant.key"))
	if err != nil {
		t.Fatal(err)
	}
	exec := executorv1.NewExecutorServiceClient(s.dial(t, "service/authority", "executor"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	good, err := signer.Sign(testGrant("grant-ok", commit, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	first, err := exec.StartJob(ctx, &executorv1.StartJobRequest{Grant: good})
	if err != nil || !first.GetCreated() {
		t.Fatalf("valid grant: created=%v err=%v", first.GetCreated(), err)
	}
	again, err := exec.StartJob(ctx, &executorv1.StartJobRequest{Grant: good})
	if err != nil || again.GetCreated() || again.GetRun().GetJobId() != "grant-ok" {
		t.Fatalf("same job id again: created=%v err=%v, want the existing run", again.GetCreated(), err)
	}

	// A wider limit in the body without a new signature.
	widened := proto.Clone(good).(*typesv1.SignedGrant)
	g := testGrant("grant-widened", commit, time.Minute)
	g.Limits.MemoryBytes = 64 << 30
	widened.Body, _ = proto.MarshalOptions{Deterministic: true}.Marshal(g)
	// Signed by a key the executor does not trust.
	_, otherKey, _ := ed25519Key()
	foreign, _ := grant.NewSigner(otherKey).Sign(testGrant("grant-foreign", commit, time.Minute))
	// Expired: issued two minutes ago for one.
	old := testGrant("grant-expired", commit, time.Minute)
	old.IssuedAt, old.ExpiresAt = grant.Timestamps(time.Now().Add(-2*time.Minute), time.Minute)
	expired, _ := signer.Sign(old)
	// Bad signature bytes.
	badSig := proto.Clone(good).(*typesv1.SignedGrant)
	badSig.Signature[0] ^= 0xff

	for _, tc := range []struct {
		name string
		sg   *typesv1.SignedGrant
		code codes.Code
		msg  string
	}{
		{"changed limit", widened, codes.PermissionDenied, "bad signature"},
		{"unknown key", foreign, codes.PermissionDenied, "unknown key"},
		{"bad signature", badSig, codes.PermissionDenied, "bad signature"},
		{"expired", expired, codes.FailedPrecondition, "expired"},
	} {
		_, err := exec.StartJob(ctx, &executorv1.StartJobRequest{Grant: tc.sg})
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: got %v, want %v mentioning %q", tc.name, err, tc.code, tc.msg)
		}
	}
	for _, id := range []string{"grant-widened", "grant-foreign", "grant-expired"} {
		if _, err := exec.GetRun(ctx, &executorv1.GetRunRequest{JobId: id}); status.Code(err) != codes.NotFound {
			t.Errorf("a refused grant left a run %s: %v", id, err)
		}
	}
	// Only the authority may start jobs at all: a client with a validly
	// signed grant is refused by the table.
	if _, err := executorv1.NewExecutorServiceClient(s.dial(t, "client/dev", "executor")).StartJob(ctx, &executorv1.StartJobRequest{Grant: good}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("client/dev StartJob: %v, want PermissionDenied", err)
	}
}

// TestExecutorKilledMidRunLeavesNothing kills the executor with SIGKILL
// while a job sleeps in its sandbox, starts it again, and checks that the
// job reads failed (executor restarted) and nothing of the sandbox is left:
// no process in the sandbox's uid range, no mount under the executor's
// data directory, no job cgroup.
func TestExecutorKilledMidRunLeavesNothing(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	resp, err := client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: "kill-9",
		Spec: &authorityv1.JobSpec{Repository: "sample", Revision: "main", Command: []string{"sh", "-c", "echo started; sleep 300"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetJobId()
	ex := s.services["executor"]
	sum := sha256.Sum256([]byte(ex.DataDir))
	cgroupParent := "/airlock/" + hex.EncodeToString(sum[:6])
	waitJob(ctx, t, client, id, func(j *authorityv1.Job) bool { return j.GetState() == authorityv1.JobState_JOB_STATE_RUNNING })
	for start := time.Now(); sandboxProcs(cgroupParent) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the job is RUNNING but no process runs in its cgroup in the sandbox uid range: the check below would prove nothing")
		}
	}

	s.killExecutor(t)

	job := waitJob(ctx, t, client, id, func(j *authorityv1.Job) bool { return j.GetState() == authorityv1.JobState_JOB_STATE_FAILED })
	if r := job.GetResult().GetReason(); r != typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_RESTARTED {
		t.Errorf("reason %v, want EXECUTOR_RESTARTED", r)
	}
	if n := sandboxProcs(cgroupParent); n != 0 {
		t.Errorf("%d processes of the killed job survive", n)
	}
	if m := mountsUnder(ex.DataDir); len(m) != 0 {
		t.Errorf("mounts left under the executor's data dir: %v", m)
	}
	for _, h := range []string{"memory", "pids", "cpu", "freezer"} {
		dir := filepath.Join("/sys/fs/cgroup", h, cgroupParent)
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup left behind: %s/%s", dir, e.Name())
			}
		}
	}
	// The restarted executor still runs jobs.
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "--", "true")
	if res.code != 0 {
		t.Fatalf("a job after the restart: exit %d\n%s", res.code, res.stderr)
	}
}

// killExecutor SIGKILLs the executor (alone, not its process group) and
// starts it again, as an operator would, with the same config; the new
// process is stopped in t.Cleanup.
func (s *stack) killExecutor(t *testing.T) {
	t.Helper()
	killService(t, s, s.proc("executor"), false)
	startService(t, s, "executor", 0, nil)
}

// TestSessionSurvivesExecutorKill kills the executor with SIGKILL under a
// session with an exec running, starts it again, and drives the session
// through the CLI as its client would: it reads suspended because the
// executor restarted, its running exec ended EXECUTOR_RESTARTED, no
// process of it survived, and once resumed it has its /work changes and
// /out and finishes with them in its patch.
func TestSessionSurvivesExecutorKill(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "-o", "json")
	if res.code != 0 {
		t.Fatalf("session create: exit %d\n%s", res.code, res.stderr)
	}
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); err != nil {
		t.Fatal(err)
	}
	id := sess.GetJobId()
	if r := s.airlock(t, "session", "exec", id, "--exec-id", "write", "--", "sh", "-c", "echo kept > /work/kept.txt && echo out > /out/o.txt"); r.code != 0 {
		t.Fatalf("write: exit %d\n%s", r.code, r.stderr)
	}
	long := s.startAirlock(t, "session", "exec", id, "--exec-id", "long", "--", "sh", "-c", "echo started; sleep 300")
	for start := time.Now(); !strings.Contains(long.stdout.String(), "started"); time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("the long exec never started:\n%s", long.stderr.String())
		}
	}
	ex := s.services["executor"]
	sum := sha256.Sum256([]byte(ex.DataDir))
	cgroupParent := "/airlock/" + hex.EncodeToString(sum[:6])

	s.killExecutor(t)

	var got result
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		got = s.airlock(t, "session", "get", id)
		if got.code == 0 && strings.Contains(got.stdout, "executor restarted") {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("session get after the executor's restart: exit %d\n%s\n%s", got.code, got.stdout, got.stderr)
		}
	}
	if !strings.Contains(got.stdout, "running, suspended") {
		t.Errorf("session get after the restart:\n%s", got.stdout)
	}
	// Killed processes may take a moment to finish exiting. The killed
	// executor's exec'd processes were orphaned to this test process (the
	// subreaper) and the session's init waits, exiting, until they are
	// reaped: reap them, as init does on a host.
	for start := time.Now(); sandboxProcs(cgroupParent) != 0; time.Sleep(50 * time.Millisecond) {
		reapSandboxOrphans()
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%d processes of the session survive the restart", sandboxProcs(cgroupParent))
		}
	}
	if r := s.airlock(t, "session", "exec", id, "--exec-id", "early", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "suspended") {
		t.Errorf("an exec before resuming: exit %d, want a refusal naming the suspension\n%s", r.code, r.stderr)
	}
	if code := long.exitCode(30 * time.Second); code == 0 {
		t.Errorf("the CLI following the killed exec exited 0")
	}
	if r := s.airlock(t, "session", "resume", id); r.code != 0 {
		t.Fatalf("session resume: exit %d\n%s", r.code, r.stderr)
	}
	if r := s.airlock(t, "session", "exec", id, "--exec-id", "read", "--", "sh", "-c", "cat /work/kept.txt /out/o.txt"); r.code != 0 || r.stdout != "kept\nout\n" {
		t.Fatalf("after resuming: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}
	// The resumed session's execs start through an exec helper of the new
	// executor where the kernel reads a pidfd's exit status (Linux 6.15:
	// docs/exec.md), else with runc exec: one process with the helper's
	// capabilities (CAP_SETUID, CAP_SETGID), or none.
	helpers := "0\n"
	if kernelAtLeast(t, 6, 15) {
		helpers = "1\n"
	}
	if r := s.airlock(t, "session", "exec", id, "--exec-id", "helper", "--", "sh", "-c",
		`n=0; for s in /proc/[0-9]*/status; do grep -q '^CapPrm:[[:space:]]*00000000000000c0$' $s 2>/dev/null && n=$((n+1)); done; echo $n`); r.code != 0 || r.stdout != helpers {
		t.Fatalf("exec helpers in the resumed session: exit %d %q, want %q\n%s", r.code, r.stdout, helpers, r.stderr)
	}
	r := s.airlock(t, "session", "get", id, "-o", "json")
	view := &authorityv1.GetSessionResponse{}
	if err := protojson.Unmarshal([]byte(r.stdout), view); err != nil {
		t.Fatalf("session get -o json: %v\n%s", err, r.stdout)
	}
	reasons := map[string]typesv1.TerminationReason{}
	for _, x := range view.GetExecs() {
		reasons[x.GetSpec().GetExecId()] = x.GetReason()
	}
	if reasons["long"] != typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_RESTARTED || reasons["write"] != typesv1.TerminationReason_TERMINATION_REASON_EXITED {
		t.Errorf("exec reasons after the restart: %v", reasons)
	}
	res = s.airlock(t, "session", "finish", id, "-o", "json")
	final := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), final); res.code != 0 || err != nil {
		t.Fatalf("session finish: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	if final.GetState() != authorityv1.JobState_JOB_STATE_FINISHED {
		t.Fatalf("finished session: %s %v", final.GetState(), final.GetResult())
	}
	bundleBytes, _ := fetchArtifact(t, s, id, final.GetResult().GetBundleDigest())
	if patch := string(tarEntry(t, bundleBytes, "patch.diff")); !strings.Contains(patch, "+kept") {
		t.Errorf("the bundle's patch lacks the change made before the restart:\n%s", patch)
	}
}

// reapSandboxOrphans reaps the zombies in the sandbox uid range whose
// parent is this process: orphans it adopted as the subreaper, never a
// child it started itself (those run as root).
func reapSandboxOrphans() {
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || procState(pid) != "Z" {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var ppid, uid int
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "PPid:" {
				fmt.Sscan(f[1], &ppid)
			} else if len(f) > 1 && f[0] == "Uid:" {
				fmt.Sscan(f[1], &uid)
			}
		}
		if ppid == self && uid >= 1000000 && uid < 1000000+65536 {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
	}
}

func waitJob(ctx context.Context, t testing.TB, client authorityv1.AuthorityServiceClient, id string, done func(*authorityv1.Job) bool) *authorityv1.Job {
	t.Helper()
	for {
		resp, err := client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
		if err == nil && done(resp.GetJob()) {
			return resp.GetJob()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %s: condition not reached (last %v, %v)", id, resp.GetJob().GetState(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sandboxProcs counts processes in the sandbox uid range that sit in a
// cgroup under the executor's cgroup parent (other executors on this
// machine, such as other tests', use the same uid range).
var debugProcs = os.Getenv("AIRLOCK_E2E_DEBUG") != ""

func sandboxProcs(cgroupParent string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), cgroupParent+"/") {
			continue
		}
		var pid int
		fmt.Sscan(e.Name(), &pid)
		if procState(pid) == "Z" {
			continue // dead; this test process is the subreaper that has yet to reap it
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				var uid int
				fmt.Sscan(f[1], &uid)
				if uid >= 1000000 && uid < 1000000+65536 {
					n++
					if debugProcs {
						cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
						stack, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stack"))
						fmt.Fprintf(os.Stderr, "sandbox process %s uid %d: %q\n%s\n%s\n%s\n", e.Name(), uid, cmdline, cg, data, stack)
					}
				}
			}
		}
	}
	return n
}

// mountsUnder lists mount points under dir.
func mountsUnder(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestJobSeesNoExecutorSecretsAndKeepsTheSourceWhole: a secret in the
// executor's own environment does not reach the job, and a job that wipes
// /work leaves the retained source whole for the next job.
func TestJobSeesNoExecutorSecretsAndKeepsTheSourceWhole(t *testing.T) {
	const secret = "AIRLOCK_E2E_EXECUTOR_SECRET=do-not-leak-7f3a"
	t.Setenv("AIRLOCK_E2E_EXECUTOR_SECRET", "do-not-leak-7f3a") // inherited by dev up's services
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	if env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", s.services["executor"].PID)); !strings.Contains(string(env), secret) {
		t.Fatal("the executor does not hold the secret; the test would prove nothing")
	}
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "--", "sh", "-c",
		"env; cat /proc/self/environ /proc/1/environ | tr '\\0' '\\n'; rm -rf /work/* /work/.[!.]*; ls -A /work | wc -l")
	if res.code != 0 {
		t.Fatalf("exit %d\n%s", res.code, res.stderr)
	}
	if strings.Contains(res.stdout+res.stderr, "do-not-leak-7f3a") {
		t.Errorf("the executor's secret reached the job:\n%s", res.stdout)
	}
	if !strings.HasSuffix(strings.TrimSpace(res.stdout), "0") {
		t.Errorf("rm -rf did not empty /work inside the job:\n%s", res.stdout)
	}
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "--", "sh", "-c", "ls -A /work; cat lib/greet.txt")
	if res.code != 0 || !strings.Contains(res.stdout, "test.sh") || !strings.Contains(res.stdout, "hello") {
		t.Errorf("the next job does not see the source whole: exit %d\n%s", res.code, res.stdout)
	}
}

func ed25519Key() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	return ed25519.GenerateKey(rand.Reader)
}

// kernelAtLeast reports whether the running kernel is major.minor or newer.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(string(data), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", data, err)
	}
	return ma > major || ma == major && mi >= minor
}
