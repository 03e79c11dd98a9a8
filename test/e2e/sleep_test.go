//go:build linux

package e2e

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestSessionSleepEndToEnd: through the whole stack and the CLI, a session
// created with --on-idle sleep and a short idle timeout falls asleep
// rather than ending; session get and list say asleep, and since when;
// session exec (the streaming RunExec) wakes it transparently and sees
// the file it wrote in /work before; a file call wakes it once it sleeps
// again; the ended session's result splits its time into awake and
// asleep.
func TestSessionSleepEndToEnd(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)

	if r := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--on-idle", "nap"); r.code == 0 || !strings.Contains(r.stderr, "--on-idle") {
		t.Fatalf("session create --on-idle nap: exit %d\n%s", r.code, r.stderr)
	}
	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--idle-timeout", "2s", "--on-idle", "sleep", "-o", "json")
	if res.code != 0 {
		t.Fatalf("session create: exit %d\n%s", res.code, res.stderr)
	}
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); err != nil {
		t.Fatalf("session create -o json: %v\n%s", err, res.stdout)
	}
	id := sess.GetJobId()
	if sess.GetSession().GetOnIdle() != typesv1.IdleAction_IDLE_ACTION_SLEEP {
		t.Fatalf("the session's settings in force: %v", sess.GetSession())
	}
	exec := func(execID string, argv ...string) result {
		t.Helper()
		return s.airlock(t, append([]string{"session", "exec", id, "--exec-id", execID, "--"}, argv...)...)
	}
	if r := exec("write", "sh", "-c", "echo before-sleep > /work/slept.txt; echo t > /tmp/t"); r.code != 0 {
		t.Fatalf("write: exit %d\n%s", r.code, r.stderr)
	}
	waitAsleep := func(what string) *authorityv1.GetSessionResponse {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			r := s.airlock(t, "session", "get", id, "-o", "json")
			got := &authorityv1.GetSessionResponse{}
			if err := protojson.Unmarshal([]byte(r.stdout), got); r.code != 0 || err != nil {
				t.Fatalf("session get: exit %d, %v\n%s", r.code, err, r.stderr)
			}
			if got.GetSuspended() && got.GetSuspendReason() == typesv1.TerminationReason_TERMINATION_REASON_IDLE_TIMEOUT {
				if got.GetSession().GetState() != authorityv1.JobState_JOB_STATE_RUNNING || got.GetSuspendedAt() == nil {
					t.Fatalf("an asleep session: %s, suspended at %v", got.GetSession().GetState(), got.GetSuspendedAt())
				}
				return got
			}
			if got.GetSession().GetState() != authorityv1.JobState_JOB_STATE_RUNNING || time.Now().After(deadline) {
				t.Fatalf("session %s did not fall asleep %s: %s, suspended %v (%s)", id, what, got.GetSession().GetState(), got.GetSuspended(), got.GetSuspendReason())
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	asleep := waitAsleep("after its idle timeout")
	since := asleep.GetSuspendedAt().AsTime()
	// What get and list print, once they have it (list reads each
	// session's state as the executor last reported it).
	says := func(want string, args ...string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := s.airlock(t, args...)
			if r.code == 0 && strings.Contains(r.stdout, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: exit %d, not %q\n%s\n%s", strings.Join(args, " "), r.code, want, r.stdout, r.stderr)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	says("running, asleep since ", "session", "get", id)
	says("running, asleep since ", "session", "list")
	time.Sleep(3 * time.Second)

	// The streaming exec wakes it, waits for it, and runs on its files.
	woke := time.Now()
	if r := exec("after", "sh", "-c", "cat /work/slept.txt; ls -A /tmp"); r.code != 0 || r.stdout != "before-sleep\n" {
		t.Fatalf("session exec in an asleep session: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}
	sleptFor := woke.Sub(since)
	t.Logf("asleep %s; the exec that woke it took %s", sleptFor, time.Since(woke))

	// Asleep again, a file call wakes it.
	waitAsleep("again")
	if r := s.airlock(t, "session", "cp", id+":/work/slept.txt", "-"); r.code != 0 || r.stdout != "before-sleep\n" {
		t.Fatalf("session cp from an asleep session: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}

	res = s.airlock(t, "session", "finish", id, "-o", "json")
	final := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), final); res.code != 0 || err != nil {
		t.Fatalf("session finish: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	u := final.GetResult().GetUsage()
	awake, slept, wall := u.GetAwakeTime().AsDuration(), u.GetAsleepTime().AsDuration(), u.GetWallTime().AsDuration()
	if final.GetResult().GetReason() != typesv1.TerminationReason_TERMINATION_REASON_FINISHED || slept < sleptFor || awake >= wall-sleptFor || awake+slept != wall {
		t.Fatalf("the ended session: %s, awake %s, asleep %s, wall %s; want asleep at least %s and awake the rest",
			final.GetResult().GetReason(), awake, slept, wall, sleptFor)
	}
	if r := s.airlock(t, "session", "get", id); r.code != 0 || !strings.Contains(r.stdout, "asleep or suspended") {
		t.Fatalf("session get of the ended session: exit %d\n%s", r.code, r.stdout)
	}

	// Metered, the session's compute and memory count its awake minutes
	// alone, its disk its awake and asleep ones.
	res = s.airlock(t, "usage", "--by", "job", "-o", "json")
	got := &authorityv1.GetUsageResponse{}
	if err := protojson.Unmarshal([]byte(res.stdout), got); res.code != 0 || err != nil {
		t.Fatalf("usage: exit %d, %v\n%s%s", res.code, err, res.stdout, res.stderr)
	}
	var row *authorityv1.Usage
	for _, r := range got.GetRows() {
		if r.GetJobId() == id {
			row = r
		}
	}
	lim := final.GetLimits()
	const gib = float64(1 << 30)
	switch {
	case row == nil:
		t.Fatalf("usage has no row for session %s:\n%s", id, res.stdout)
	case row.GetAsleepMinutes() < 1 || row.GetAwakeMinutes() < 1:
		t.Fatalf("usage row: awake %d min, asleep %d min; want both at least one", row.GetAwakeMinutes(), row.GetAsleepMinutes())
	case !near(row.GetVcpuMinutes(), float64(lim.GetCpuMillis())/1000*float64(row.GetAwakeMinutes())):
		t.Fatalf("usage row: %v vCPU-minutes for %d millicores awake %d min (asleep %d): compute billed while asleep?", row.GetVcpuMinutes(), lim.GetCpuMillis(), row.GetAwakeMinutes(), row.GetAsleepMinutes())
	case !near(row.GetMemoryGbMinutes(), float64(lim.GetMemoryBytes())/gib*float64(row.GetAwakeMinutes())):
		t.Fatalf("usage row: %v memory GB-minutes for %d bytes awake %d min: memory billed while asleep?", row.GetMemoryGbMinutes(), lim.GetMemoryBytes(), row.GetAwakeMinutes())
	case !near(row.GetDiskGbMinutes(), float64(lim.GetDiskBytes())/gib*float64(row.GetAwakeMinutes()+row.GetAsleepMinutes())):
		t.Fatalf("usage row: %v disk GB-minutes for %d bytes over %d+%d min: disk must count awake and asleep", row.GetDiskGbMinutes(), lim.GetDiskBytes(), row.GetAwakeMinutes(), row.GetAsleepMinutes())
	}
}

// near says whether two metered quantities agree to a millionth.
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }
