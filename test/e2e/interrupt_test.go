//go:build linux

package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestCtrlCEndsTheCommandNotTheJob: Ctrl-C cancels the CLI's RPC (the
// command exits 130 at once, saying so) and leaves the job alone: watching
// is not owning.
func TestCtrlCEndsTheCommandNotTheJob(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	res := s.airlock(t, "job", "submit", "--repo", "sample", "-o", "json", "--", "sh", "-c", "echo started; sleep 30")
	if res.code != 0 {
		t.Fatalf("submit: exit %d\n%s", res.code, res.stderr)
	}
	j := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), j); err != nil {
		t.Fatal(err)
	}
	w := s.startAirlock(t, "job", "watch", j.GetJobId())
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(w.stdout.String(), "started") {
		if time.Now().After(deadline) {
			t.Fatalf("the watch never showed the job's output:\n%s%s", w.stdout.String(), w.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := w.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := w.exitCode(3 * time.Second); code != 130 || !strings.Contains(w.stderr.String(), "interrupted") {
		t.Fatalf("after Ctrl-C the watch exited %d (want 130, at once)\n%s", code, w.stderr.String())
	}
	if st := s.job(t, j.GetJobId()).GetState(); st != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Errorf("after Ctrl-C of a watch the job is %v, want still RUNNING", st)
	}
	s.airlock(t, "job", "cancel", j.GetJobId())
}
