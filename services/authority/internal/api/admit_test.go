package api_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

func (h *harness) submitOther(key string) *authorityv1.Job {
	h.t.Helper()
	s := spec()
	s.Repository = "tools"
	resp, err := h.client(otherID).SubmitJob(h.t.Context(), &authorityv1.SubmitJobRequest{Tenant: "other", Spec: s, IdempotencyKey: key})
	if err != nil {
		h.t.Fatalf("SubmitJob for other: %v", err)
	}
	return resp.GetJob()
}

func (h *harness) state(c authorityv1.AuthorityServiceClient, id string) *authorityv1.Job {
	h.t.Helper()
	resp, err := c.GetJob(h.t.Context(), &authorityv1.GetJobRequest{JobId: id})
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.GetJob()
}

// TestTenantAtItsQuotaWaitsWhileAnotherStarts is issue 9 §5: a tenant at
// its quota of running jobs waits, queued and saying why, while another
// tenant's job still starts; when one of its jobs ends the next goes.
func TestTenantAtItsQuotaWaitsWhileAnotherStarts(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{devQuota: policy.Quota{RunningJobs: 2}})
	dev := h.client(devID)
	var ids []string
	for i := range 3 {
		ids = append(ids, h.submit(dev, fmt.Sprintf("quota-%d", i), spec()).GetJob().GetJobId())
	}
	h.waitState(dev, ids[0], authorityv1.JobState_JOB_STATE_RUNNING)
	h.waitState(dev, ids[1], authorityv1.JobState_JOB_STATE_RUNNING)
	eventually(t, "the third job to say why it waits", func() bool {
		return strings.Contains(h.state(dev, ids[2]).GetMessage(), "quota.running_jobs (2 of 2 running)")
	})
	other := h.submitOther("quota-other")
	h.waitState(h.client(otherID), other.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	if j := h.state(dev, ids[2]); j.GetState() != authorityv1.JobState_JOB_STATE_QUEUED || h.fake.Attempts(ids[2]) != 0 {
		t.Fatalf("the job over quota is %v after %d start attempts, want queued and never sent", j.GetState(), h.fake.Attempts(ids[2]))
	}
	h.fake.End(ids[0], executorv1.RunState_RUN_STATE_FINISHED)
	j := h.waitState(dev, ids[2], authorityv1.JobState_JOB_STATE_RUNNING)
	if strings.Contains(j.GetMessage(), "waiting") {
		t.Errorf("a running job still says %q", j.GetMessage())
	}

	// A job that could never fit the quota is refused, naming it.
	h2 := newHarnessWith(t, harnessOptions{devQuota: policy.Quota{MemoryBytes: 1 << 30}})
	s := spec()
	s.Resources = &typesv1.ResourceLimits{MemoryBytes: 2 << 30}
	_, err := h2.client(devID).SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: s, IdempotencyKey: "too-big"})
	wantStatus(t, err, codes.InvalidArgument, "spec.resources.memory_bytes", "quota.memory")
}

// TestFullExecutorServesTenantsFairly: with an executor that has room for
// two runs, one tenant's six jobs do not starve another's one. Each time a
// run ends, the tenant holding fewer runs goes first; nothing is failed,
// nothing is sent while the executor is full, and all of them run.
func TestFullExecutorServesTenantsFairly(t *testing.T) {
	h := newHarness(t)
	h.fake.SetCapacity(2)
	dev := h.client(devID)
	var devJobs []string
	for i := range 6 {
		devJobs = append(devJobs, h.submit(dev, fmt.Sprintf("fair-%d", i), spec()).GetJob().GetJobId())
	}
	eventually(t, "two dev jobs running", func() bool { return h.fake.Unended() == 2 })
	other := h.submitOther("fair-other").GetJobId()
	time.Sleep(300 * time.Millisecond)
	if got := h.state(h.client(otherID), other); got.GetState() != authorityv1.JobState_JOB_STATE_QUEUED || !strings.Contains(got.GetMessage(), "waiting: ") {
		t.Fatalf("other's job with the executor full: %v %q", got.GetState(), got.GetMessage())
	}
	// One dev run ends: other's job, not a third dev job, takes its place.
	var running []string
	for _, id := range devJobs {
		if h.state(dev, id).GetState() == authorityv1.JobState_JOB_STATE_RUNNING {
			running = append(running, id)
		}
	}
	h.fake.End(running[0], executorv1.RunState_RUN_STATE_FINISHED)
	h.waitState(h.client(otherID), other, authorityv1.JobState_JOB_STATE_RUNNING)
	queued := 0
	for _, id := range devJobs {
		if h.state(dev, id).GetState() == authorityv1.JobState_JOB_STATE_QUEUED {
			queued++
		}
	}
	if queued != 4 {
		t.Fatalf("%d dev jobs still queued after other's started, want 4", queued)
	}
	// The rest all run, two at a time at most.
	otherClient := h.client(otherID)
	ended := map[string]bool{running[0]: true}
	for len(ended) < len(devJobs)+1 {
		if n := h.fake.Unended(); n > 2 {
			t.Fatalf("%d runs at once on an executor with room for 2", n)
		}
		for _, id := range append(devJobs, other) {
			c := dev
			if id == other {
				c = otherClient
			}
			if !ended[id] && h.fake.Attempts(id) > 0 && h.state(c, id).GetState() == authorityv1.JobState_JOB_STATE_RUNNING {
				h.fake.End(id, executorv1.RunState_RUN_STATE_FINISHED)
				ended[id] = true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range devJobs {
		if st := h.state(dev, id).GetState(); st == authorityv1.JobState_JOB_STATE_FAILED {
			t.Errorf("job %s failed: %q", id, h.state(dev, id).GetMessage())
		}
	}
}

// TestChangePastTheQuotaIsRefused: raising a running job's memory so that
// the tenant's jobs together would pass its quota is refused, naming it;
// within the quota the same kind of change goes through.
func TestChangePastTheQuotaIsRefused(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{devQuota: policy.Quota{MemoryBytes: 1536 << 20}})
	dev := h.client(devID)
	a := h.submit(dev, "q-a", spec()).GetJob().GetJobId() // 512 MiB each by default
	b := h.submit(dev, "q-b", spec()).GetJob().GetJobId()
	h.waitState(dev, a, authorityv1.JobState_JOB_STATE_RUNNING)
	h.waitState(dev, b, authorityv1.JobState_JOB_STATE_RUNNING)
	_, err := dev.UpdateJobLimits(t.Context(), &authorityv1.UpdateJobLimitsRequest{JobId: a, Limits: &typesv1.ResourceLimits{MemoryBytes: 1100 << 20}})
	wantStatus(t, err, codes.ResourceExhausted, "limits.memory_bytes", "quota.memory")
	if _, err := dev.UpdateJobLimits(t.Context(), &authorityv1.UpdateJobLimitsRequest{JobId: a, Limits: &typesv1.ResourceLimits{MemoryBytes: 1 << 30}}); err != nil {
		t.Fatalf("a change within the quota: %v", err)
	}
}

// TestQueuedJobsAreBounded: a tenant cannot pile up waiting jobs without
// bound; past its quota.queued_jobs a submission is refused, naming it.
func TestQueuedJobsAreBounded(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{devQuota: policy.Quota{RunningJobs: 1, QueuedJobs: 2}})
	dev := h.client(devID)
	first := h.submit(dev, "qq-0", spec()).GetJob().GetJobId()
	h.waitState(dev, first, authorityv1.JobState_JOB_STATE_RUNNING)
	h.submit(dev, "qq-1", spec())
	h.submit(dev, "qq-2", spec())
	_, err := dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: spec(), IdempotencyKey: "qq-3"})
	wantStatus(t, err, codes.ResourceExhausted, "2 jobs queued", "quota.queued_jobs")
	// The same key again still answers with its job, whatever the queue.
	if again := h.submit(dev, "qq-1", spec()); again.GetCreated() {
		t.Error("a repeated key made a new job")
	}
}
