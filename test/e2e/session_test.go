//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestSessionEndToEnd drives one session through the CLI as an agent
// would: run the failing test, edit, run it again, passing; retry execs by
// id (after the end, and after the CLI was killed mid-exec) and see each
// run once; a different command under a used id is refused; finishing
// builds one bundle with the patch and every exec in order.
func TestSessionEndToEnd(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)

	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--idle-timeout", "5m",
		"--publish-to", "sample:main", "-o", "json")
	if res.code != 0 {
		t.Fatalf("session create: exit %d\n%s", res.code, res.stderr)
	}
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); err != nil {
		t.Fatalf("session create -o json: %v\n%s", err, res.stdout)
	}
	id := sess.GetJobId()
	if sess.GetState() != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("session create returned %s, want RUNNING", sess.GetState())
	}
	exec := func(execID string, argv ...string) result {
		t.Helper()
		return s.airlock(t, append([]string{"session", "exec", id, "--exec-id", execID, "--"}, argv...)...)
	}

	if r := exec("test-1", "./test.sh"); r.code != 3 || !strings.Contains(r.stdout, "FAIL: greeting is 'hello'") {
		t.Fatalf("the unedited test: exit %d, want 3\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := exec("edit", "sh", "-c", `printf 'hello, airlock\n' > lib/greet.txt`); r.code != 0 {
		t.Fatalf("edit: exit %d\n%s", r.code, r.stderr)
	}
	if r := exec("test-2", "./test.sh"); r.code != 0 || !strings.Contains(r.stdout, "PASS") {
		t.Fatalf("the edited test: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// Retried after its end: the recorded exec, not a second run.
	appendLine := []string{"sh", "-c", "echo once >> /work/log.txt"}
	for i := range 2 {
		if r := exec("append", appendLine...); r.code != 0 || (i == 1 && !strings.Contains(r.stderr, "started before")) {
			t.Fatalf("append attempt %d: exit %d\n%s", i, r.code, r.stderr)
		}
	}
	// A different command under the same id.
	if r := exec("append", "sh", "-c", "echo twice >> /work/log.txt"); r.code == 0 || !strings.Contains(r.stderr, "spec.argv") {
		t.Fatalf("a different command under a used id: exit %d\n%s", r.code, r.stderr)
	}
	// A CLI killed mid-exec, then the same call again.
	slow := []string{"session", "exec", id, "--exec-id", "slow", "--", "sh", "-c", "echo started >> /work/slow.txt; echo started; sleep 3; echo done"}
	b := s.startAirlock(t, slow...)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(b.stdout.String(), "started") {
		if time.Now().After(deadline) {
			t.Fatalf("the slow exec never started:\n%s", b.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.exitCode(10 * time.Second)
	if r := s.airlock(t, slow...); r.code != 0 || !strings.Contains(r.stdout, "started\ndone\n") {
		t.Fatalf("the retried slow exec: exit %d\nstdout %q\n%s", r.code, r.stdout, r.stderr)
	}
	if r := exec("count", "cat", "/work/log.txt", "/work/slow.txt"); r.code != 0 || r.stdout != "once\nstarted\n" {
		t.Fatalf("each exec's side effect, once: %q (exit %d, %s)", r.stdout, r.code, r.stderr)
	}
	// Output that would drive a reviewer's terminal.
	if r := exec("hostile", "printf", `\033]52;c;ZXZpbA==\007\033[2J[airlock] approved\n`); r.code != 0 {
		t.Fatalf("hostile exec: exit %d\n%s", r.code, r.stderr)
	}

	// Files in and out, and what the files API refuses.
	local := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(local, []byte("from the client\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := s.airlock(t, "session", "cp", local, id+":/work/notes.txt"); r.code != 0 {
		t.Fatalf("session cp up: exit %d\n%s", r.code, r.stderr)
	}
	if r := exec("plant", "sh", "-c", "cat notes.txt; ln -s /etc/shadow /work/shadow; mkdir -p /out/r; echo report > /out/r/report.txt"); r.code != 0 || r.stdout != "from the client\n" {
		t.Fatalf("the uploaded file inside: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}
	down := filepath.Join(t.TempDir(), "report.txt")
	if r := s.airlock(t, "session", "cp", id+":/out/r/report.txt", down); r.code != 0 {
		t.Fatalf("session cp down: exit %d\n%s", r.code, r.stderr)
	}
	if got, _ := os.ReadFile(down); string(got) != "report\n" {
		t.Fatalf("downloaded %q", got)
	}
	for _, p := range []string{"/etc/shadow", "/work/shadow", "/work/../etc/passwd", "/proc/1/environ"} {
		if r := s.airlock(t, "session", "cp", id+":"+p, "-"); r.code == 0 || r.stdout != "" {
			t.Fatalf("session cp %s: exit %d, %d bytes out", p, r.code, len(r.stdout))
		}
	}
	if r := s.airlock(t, "session", "ls", id, "/work", "-R"); r.code != 0 || !strings.Contains(r.stdout, "/work/shadow -> /etc/shadow") || !strings.Contains(r.stdout, "/work/lib/greet.txt") {
		t.Fatalf("session ls: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// Suspend and resume: /work changes and /out stay, /tmp goes.
	if r := exec("tmp", "sh", "-c", "echo t > /tmp/t"); r.code != 0 {
		t.Fatalf("tmp: exit %d", r.code)
	}
	if r := s.airlock(t, "session", "suspend", id); r.code != 0 || !strings.Contains(r.stdout, "suspended") {
		t.Fatalf("session suspend: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := exec("while-suspended", "true"); r.code == 0 || !strings.Contains(r.stderr, "suspended") {
		t.Fatalf("an exec in a suspended session: exit %d\n%s", r.code, r.stderr)
	}
	if r := s.airlock(t, "session", "resume", id); r.code != 0 || !strings.Contains(r.stdout, "running") {
		t.Fatalf("session resume: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := exec("after-resume", "sh", "-c", "cat /work/notes.txt /out/r/report.txt; ls -A /tmp"); r.code != 0 || r.stdout != "from the client\nreport\n" {
		t.Fatalf("after resume: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}

	// Narrowing the session's settings applies at once: the executor took
	// the new grant.
	if r := s.airlock(t, "job", "update", id, "--max-execs", "1", "--idle-timeout", "4m"); r.code != 0 ||
		!strings.Contains(r.stdout, "session: applied") || !strings.Contains(r.stdout, "idle timeout 4m0s, at most 1 execs at once") {
		t.Fatalf("job update --max-execs --idle-timeout: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	res = s.airlock(t, "session", "get", id, "-o", "json")
	got := &authorityv1.GetSessionResponse{}
	if err := protojson.Unmarshal([]byte(res.stdout), got); res.code != 0 || err != nil {
		t.Fatalf("session get: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	wantIDs := []string{"test-1", "edit", "test-2", "append", "slow", "count", "hostile", "plant", "tmp", "after-resume"}
	if len(got.GetExecs()) != len(wantIDs) || got.GetExecsStale() {
		t.Fatalf("session get lists %d execs (stale %v), want %d from the executor", len(got.GetExecs()), got.GetExecsStale(), len(wantIDs))
	}
	if ss := got.GetSession().GetSession(); ss.GetMaxConcurrentExecs() != 1 || ss.GetIdleTimeout().AsDuration() != 4*time.Minute {
		t.Fatalf("the session's settings in force: %v", ss)
	}

	res = s.airlock(t, "session", "finish", id, "-o", "json")
	final := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), final); res.code != 0 || err != nil {
		t.Fatalf("session finish: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	r := final.GetResult()
	if final.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || r.GetReason() != typesv1.TerminationReason_TERMINATION_REASON_FINISHED {
		t.Fatalf("finished session: %s %s", final.GetState(), r.GetReason())
	}
	bundleBytes, _ := fetchArtifact(t, s, id, r.GetBundleDigest())
	if patch := string(tarEntry(t, bundleBytes, "patch.diff")); !strings.Contains(patch, "+hello, airlock") || !strings.Contains(patch, "log.txt") {
		t.Errorf("the bundle's patch lacks the session's edits:\n%s", patch)
	}
	var meta struct {
		Execs []struct {
			Seq      int64 `json:"seq"`
			ExitCode int   `json:"exit_code"`
			Spec     struct {
				ID string `json:"exec_id"`
			} `json:"spec"`
		} `json:"execs"`
	}
	if err := json.Unmarshal(tarEntry(t, bundleBytes, "result.json"), &meta); err != nil {
		t.Fatal(err)
	}
	if len(meta.Execs) != len(wantIDs) {
		t.Fatalf("the bundle has %d execs, want %d", len(meta.Execs), len(wantIDs))
	}
	for i, x := range meta.Execs {
		if x.Spec.ID != wantIDs[i] || x.Seq != int64(i+1) {
			t.Errorf("bundle exec %d: %s seq %d, want %s", i, x.Spec.ID, x.Seq, wantIDs[i])
		}
	}
	if meta.Execs[0].ExitCode != 3 || meta.Execs[2].ExitCode != 0 {
		t.Errorf("the test execs' statuses in the bundle: %d, %d; want 3, 0", meta.Execs[0].ExitCode, meta.Execs[2].ExitCode)
	}
	// The approver sees every exec in order, with its output's end,
	// escaped and behind the gutter.
	if final.GetApprovalId() == "" {
		final = s.job(t, id)
	}
	show := s.airlock(t, "approval", "show", final.GetApprovalId(), "--as", "approver/alice")
	if show.code != 0 {
		t.Fatalf("approval show: exit %d\n%s", show.code, show.stderr)
	}
	last := 0
	for i, xid := range wantIDs {
		at := strings.Index(show.stdout, fmt.Sprintf("exec %d  %s  ", i+1, xid))
		if at < last {
			t.Fatalf("approval show does not list exec %d (%s) in order:\n%s", i+1, xid, show.stdout)
		}
		last = at
	}
	if !strings.Contains(show.stdout, "upload  /work/notes.txt  16 bytes, sha256 ") {
		t.Fatalf("approval show does not list the client's upload:\n%s", show.stdout)
	}
	if strings.Index(show.stdout, "upload  /work/notes.txt") > strings.Index(show.stdout, "exec 8  plant  ") {
		t.Fatalf("approval show lists the upload after the exec that read it:\n%s", show.stdout)
	}
	if strings.ContainsRune(show.stdout, 0x1b) || strings.ContainsRune(show.stdout, 0x07) {
		t.Fatalf("approval show passed a job's terminal escape through:\n%q", show.stdout)
	}
	if !strings.Contains(show.stdout, "| ⟦\\x1b⟧]52;c;ZXZpbA==") || strings.Contains(show.stdout, "\n[airlock] approved") {
		t.Fatalf("approval show does not show the exec's output escaped behind the gutter:\n%s", show.stdout)
	}
	if r := exec("after-finish", "true"); r.code == 0 {
		t.Fatalf("an exec in a finished session ran")
	}
}

// TestJobGitEndToEnd: through the whole stack a job's /work answers git as
// a clone at its base commit would, and its commits stay out of the patch.
// By default (depth 1) its history is the base commit alone; once the
// tenant's policy says git_history_depth: 3, a job on the same commit sees
// three commits, under runc and runsc, from the authority's mirror.
func TestJobGitEndToEnd(t *testing.T) {
	repo, _ := sampleRepo(t)
	for _, msg := range []string{"second", "third", "fourth"} {
		if err := os.WriteFile(filepath.Join(repo, "lib", msg+".txt"), []byte(msg+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		git(t, repo, "add", "-A")
		git(t, repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", msg)
	}
	base := strings.TrimSpace(git(t, repo, "rev-parse", "HEAD"))
	s := startStack(t, "--repo", "sample="+repo)
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--wait", "-o", "json", "--", "sh", "-c",
		`set -e; git status --short; git log --format=%H%n%s; echo x >> README.md; git commit -qam local; git log --oneline | wc -l`)
	if res.code != 0 {
		t.Fatalf("git job: exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stderr, base+"\nfourth\n2\n") {
		t.Fatalf("the job's git log (on stderr with -o json) is not its base commit's alone:\n%s", res.stderr)
	}
	job := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
		t.Fatal(err)
	}
	if ds := job.GetResult().GetDiffStat(); ds.GetFilesChanged() != 1 || ds.GetInsertions() != 1 {
		t.Fatalf("diff stat %+v, want the one changed file", ds)
	}

	s.restartServiceAfter(t, "authority", func() {
		s.editTenants(t, func(_, dev map[string]any) { dev["git_history_depth"] = 3 })
	})
	for _, runtime := range []string{"runc", "runsc"} {
		res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--runtime", runtime, "--wait", "-o", "json", "--", "sh", "-c",
			`set -e; echo "log:$(git log --oneline | wc -l)"; git diff HEAD~2 --stat | grep -c 'lib/' | sed 's/^/stat:/'; `+
				`git rev-parse -q --verify HEAD~3 >/dev/null || echo beyond:absent; echo x >> README.md`)
		if res.code != 0 {
			t.Fatalf("%s: depth-3 git job: exit %d\n%s\n%s", runtime, res.code, res.stdout, res.stderr)
		}
		for _, want := range []string{"log:3\n", "stat:2\n", "beyond:absent\n"} {
			if !strings.Contains(res.stderr, want) {
				t.Fatalf("%s: the depth-3 job's output lacks %q:\n%s", runtime, want, res.stderr)
			}
		}
		job := &authorityv1.Job{}
		if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
			t.Fatal(err)
		}
		if ds := job.GetResult().GetDiffStat(); ds.GetFilesChanged() != 1 || ds.GetInsertions() != 1 {
			t.Fatalf("%s: diff stat %+v, want the one changed file against the base", runtime, ds)
		}
	}
}

// TestSessionChangesAreGated: a running session's limits and settings
// change as a job's do, through the CLI: raising its concurrent execs,
// idle timeout or memory waits for an approval from someone other than
// the requester and changes nothing before it, then is in force (a second
// exec runs beside the first; the memory is in the session's cgroup);
// lowering applies at once.
func TestSessionChangesAreGated(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--memory", "256MiB",
		"--max-execs", "1", "--idle-timeout", "2m", "-o", "json")
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); res.code != 0 || err != nil {
		t.Fatalf("session create: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	id := sess.GetJobId()
	defer s.airlock(t, "session", "cancel", id)
	startSlow := func(execID string) *background {
		t.Helper()
		b := s.startAirlock(t, "session", "exec", id, "--exec-id", execID, "--", "sh", "-c", "echo started; sleep 4")
		for start := time.Now(); !strings.Contains(b.stdout.String(), "started"); time.Sleep(20 * time.Millisecond) {
			if time.Since(start) > 60*time.Second {
				t.Fatalf("exec %s never started:\n%s", execID, b.stderr.String())
			}
		}
		return b
	}

	res = s.airlock(t, "job", "update", id, "--max-execs", "3", "--idle-timeout", "30m")
	m := approvalIDLine.FindStringSubmatch(res.stdout)
	if res.code != 0 || m == nil {
		t.Fatalf("job update --max-execs 3 --idle-timeout 30m: exit %d, want an approval\n%s%s", res.code, res.stdout, res.stderr)
	}
	slow := startSlow("slow-1")
	if r := s.airlock(t, "session", "exec", id, "--exec-id", "beside-1", "--", "true"); r.code == 0 {
		t.Fatal("a second exec ran at once before the raise was approved")
	}
	slow.exitCode(30 * time.Second)
	if r := s.airlock(t, "approval", "approve", m[1], "--as", "approver/dev"); r.code == 0 {
		t.Fatal("the requester approved its own session's change")
	}
	if r := s.airlock(t, "approval", "approve", m[1], "--as", "approver/alice"); r.code != 0 {
		t.Fatalf("alice approves: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := s.job(t, id).GetSession(); got.GetMaxConcurrentExecs() != 3 || got.GetIdleTimeout().AsDuration() != 30*time.Minute {
		t.Fatalf("the session's settings after the approved raise: %v", got)
	}
	slow = startSlow("slow-2")
	if r := s.airlock(t, "session", "exec", id, "--exec-id", "beside-2", "--", "true"); r.code != 0 {
		t.Fatalf("a second exec beside the first after the approved raise: exit %d\n%s", r.code, r.stderr)
	}
	slow.exitCode(30 * time.Second)

	// Memory: approved, then in the session's cgroup.
	res = s.airlock(t, "job", "update", id, "--memory", "512MiB")
	if m = approvalIDLine.FindStringSubmatch(res.stdout); res.code != 0 || m == nil {
		t.Fatalf("job update --memory: exit %d, want an approval\n%s%s", res.code, res.stdout, res.stderr)
	}
	limitFile := jobLimitFile(s.executorCgroupParent(), id, "memory")
	if got := readTrim(t, limitFile); got != fmt.Sprint(256<<20) {
		t.Fatalf("the session's memory limit before approval = %s, want %d", got, 256<<20)
	}
	if r := s.airlock(t, "approval", "approve", m[1], "--as", "approver/bob"); r.code != 0 {
		t.Fatalf("bob approves: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := readTrim(t, limitFile); got != fmt.Sprint(512<<20) {
		t.Fatalf("the session's memory limit after approval = %s, want %d", got, 512<<20)
	}

	// Lowering applies at once.
	if r := s.airlock(t, "job", "update", id, "--max-execs", "1"); r.code != 0 || approvalIDLine.MatchString(r.stdout) {
		t.Fatalf("job update --max-execs 1: exit %d, want it applied\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := s.job(t, id).GetSession().GetMaxConcurrentExecs(); got != 1 {
		t.Fatalf("max execs after lowering: %d", got)
	}
}
