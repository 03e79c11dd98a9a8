//go:build linux

package e2e

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestExecutorOutageCostsSeconds is issue 9 §4 as an operator met it: the
// executor is down long enough for the authority's connection to back off,
// a job is submitted meanwhile, and the executor comes back. The waiting
// job must be dispatched within a few seconds of the executor serving
// again, not after gRPC's default reconnect back-off (up to two minutes).
func TestExecutorOutageCostsSeconds(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	var jobID string
	s.restartServiceAfter(t, "executor", func() {
		res := s.airlock(t, "job", "submit", "--repo", "sample", "-o", "json", "--", "sh", "-c", "echo back")
		if res.code != 0 {
			t.Fatalf("submit while the executor is down: exit %d\n%s", res.code, res.stderr)
		}
		j := &authorityv1.Job{}
		if err := protojson.Unmarshal([]byte(res.stdout), j); err != nil {
			t.Fatal(err)
		}
		jobID = j.GetJobId()
		// Long enough for several failed connection attempts.
		time.Sleep(25 * time.Second)
		if st := s.job(t, jobID).GetState(); st != authorityv1.JobState_JOB_STATE_QUEUED {
			t.Fatalf("with the executor down the job is %v, want QUEUED", st)
		}
	})
	back := time.Now()
	for {
		j := s.job(t, jobID)
		if j.GetState() == authorityv1.JobState_JOB_STATE_FINISHED {
			t.Logf("dispatched and finished %v after the executor served again", time.Since(back).Round(10*time.Millisecond))
			break
		}
		if j.GetState() == authorityv1.JobState_JOB_STATE_FAILED || time.Since(back) > 6*time.Second {
			t.Fatalf("%v after the executor came back the job is %v (%s), want FINISHED within a few seconds",
				time.Since(back).Round(time.Millisecond), j.GetState(), strings.TrimSpace(j.GetMessage()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
