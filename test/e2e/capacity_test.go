//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// jobsWithLiveSleep counts the job cgroups under the executor's cgroup
// parent that hold a live `sleep` in the sandbox uid range: the jobs
// really running on the host.
func jobsWithLiveSleep(cgroupParent string) int { return liveJobs(cgroupParent, "sleep\x00") }

// liveJobs counts the job cgroups under cgroupParent that hold a live
// process whose command line starts with prefix ("" for any: under runsc
// the job's own processes are gVisor's, and the host sees its sandbox).
func liveJobs(cgroupParent, prefix string) int {
	jobs := map[string]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmdline), prefix) {
			continue
		}
		var pid int
		fmt.Sscan(e.Name(), &pid)
		if procState(pid) == "Z" {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(cg), "\n") {
			if _, rest, ok := strings.Cut(line, cgroupParent+"/"); ok {
				job, _, _ := strings.Cut(rest, "/")
				jobs[job] = true
			}
		}
	}
	return len(jobs)
}

// TestCapacityBoundsWhatRunsAtOnce is issue 9 §5 as it was found: forty
// jobs asking 1 GiB each, submitted at once, to an executor whose capacity
// is 3 GiB. At no moment do more than three run on the host, none fails,
// and all forty finish.
func TestCapacityBoundsWhatRunsAtOnce(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	exec := s.services["executor"]
	s.restartServiceAfter(t, "executor", func() {
		f, err := os.OpenFile(exec.Config, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteString("capacity: {memory: 3GiB}\n")
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	})
	// Submitted from several clients at once and long enough asleep that
	// jobs wait for each other whatever the machine's load (submitted one
	// by one, a loaded machine finished each before the next came; asleep
	// 1 s, a loaded CI host started each only after the last had ended).
	const n = 40
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			res := s.airlock(t, "job", "submit", "--repo", "sample", "--memory", "1GiB", "--idempotency-key", fmt.Sprintf("cap-%d", i), "-o", "json", "--", "sleep", "3")
			if res.code != 0 {
				t.Errorf("submit %d: exit %d\n%s", i, res.code, res.stderr)
				return
			}
			j := &authorityv1.Job{}
			if err := protojson.Unmarshal([]byte(res.stdout), j); err != nil {
				t.Error(err)
				return
			}
			ids[i] = j.GetJobId()
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	parent := s.executorCgroupParent()
	var (
		mu   sync.Mutex
		most int
	)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if k := jobsWithLiveSleep(parent); k > 0 {
				mu.Lock()
				most = max(most, k)
				mu.Unlock()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	client := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	for _, id := range ids {
		j := waitJob(ctx, t, client, id, func(j *authorityv1.Job) bool {
			return j.GetState() == authorityv1.JobState_JOB_STATE_FINISHED || j.GetState() == authorityv1.JobState_JOB_STATE_FAILED ||
				j.GetState() == authorityv1.JobState_JOB_STATE_CANCELLED
		})
		if j.GetState() != authorityv1.JobState_JOB_STATE_FINISHED {
			t.Errorf("job %s ended %v: %q", id, j.GetState(), j.GetMessage())
		}
	}
	close(stop)
	<-watched
	mu.Lock()
	defer mu.Unlock()
	if most > 3 {
		t.Errorf("%d jobs of 1 GiB ran at once on an executor with 3 GiB of capacity", most)
	}
	if most < 2 {
		t.Errorf("at most %d job ran at once: the watch saw nothing, or capacity was not used", most)
	}
	t.Logf("%d jobs, at most %d at once", n, most)
}
