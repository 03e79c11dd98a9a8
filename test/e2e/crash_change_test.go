//go:build linux

package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Sizes of the change crash test.
const (
	changeCrashJobs       = 3
	changeCrashIterations = 100
	changeCrashMaxDelay   = 40 * time.Millisecond
)

// TestAuthorityKilledMidChangeKeepsGrantsInStep runs jobs at the real
// executor and, again and again, has their client ask to raise their pids
// limit (a widening: a change approval) while two approvers approve every
// pending change at once, and SIGKILLs the authority a random moment
// later. After each restart, once the authority has handed every stored
// grant to the executor: each job's grant generation is one more than its
// number of applied (consumed) change approvals, with exactly that many
// job.changed entries on the log; the executor runs every job under the
// very grant the authority recorded, whose pids limit is the one in the
// job's cgroup; every change an approver saw applied stays applied; no
// approval has two votes; and the audit chain verifies.
func TestAuthorityKilledMidChangeKeepsGrantsInStep(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	aliceSrc, bobSrc, devSrc := s.source(t, "approver/alice"), s.source(t, "approver/bob"), s.source(t, "client/dev")
	executor := executorv1.NewExecutorServiceClient(s.dial(t, "service/authority", "executor"))

	var jobs []string
	for i := range changeCrashJobs {
		res := s.airlock(t, "job", "submit", "--repo", "sample", "--idempotency-key", fmt.Sprintf("change-crash-%d", i), "--", "sleep", "3600")
		if res.code != 0 {
			t.Fatalf("job submit: exit %d\n%s", res.code, res.stderr)
		}
		jobs = append(jobs, strings.TrimSpace(res.stdout))
	}
	for _, id := range jobs {
		for start := time.Now(); s.job(t, id).GetState() != authorityv1.JobState_JOB_STATE_RUNNING; time.Sleep(50 * time.Millisecond) {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("job %s not running after 30s", id)
			}
		}
	}
	defer func() {
		for _, id := range jobs {
			s.airlock(t, "job", "cancel", id)
		}
	}()

	var (
		mu        sync.Mutex
		appliedOK = map[string]bool{} // change approvals a decider saw consumed
	)
	cur := s.proc("authority")
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("kill delays drawn with seed %d", seed)
	requests, decides, cut := 0, 0, 0
	for it := 0; it < changeCrashIterations && !t.Failed(); it++ {
		alice, bob, dev := crashDial(t, s, aliceSrc), crashDial(t, s, bobSrc), crashDial(t, s, devSrc)
		for _, cc := range []*grpc.ClientConn{alice, bob, dev} {
			connectNow(t, cc)
		}
		pending := pendingChanges(t, authorityv1.NewAuthorityServiceClient(alice))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		var odd []string
		note := func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			odd = append(odd, fmt.Sprintf(format, args...))
		}
		for _, id := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := authorityv1.NewAuthorityServiceClient(dev)
				j, err := c.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
				if err == nil {
					_, err = c.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: id,
						Limits: &typesv1.ResourceLimits{Pids: j.GetJob().GetLimits().GetPids() + 1}})
				}
				mu.Lock()
				requests++
				mu.Unlock()
				// A change approved meanwhile may already have raised pids
				// to what is asked.
				if err != nil && !gone(err) && !strings.Contains(err.Error(), "already runs under exactly") {
					note("change request for %s: %v", id, err)
				}
			}()
		}
		for _, a := range pending {
			for _, cc := range []*grpc.ClientConn{alice, bob} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := authorityv1.NewAuthorityServiceClient(cc).DecideApproval(ctx, &authorityv1.DecideApprovalRequest{
						ApprovalId: a.GetApprovalId(), BundleDigest: a.GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE})
					mu.Lock()
					defer mu.Unlock()
					decides++
					switch code := status.Code(err); {
					case err == nil && resp.GetApproval().GetState() == authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED:
						appliedOK[a.GetApprovalId()] = true
					case err == nil:
						odd = append(odd, fmt.Sprintf("decide %s: approved but not applied, without an error", a.GetApprovalId()))
					case gone(err):
						cut++
					case code == codes.AlreadyExists, code == codes.FailedPrecondition:
						// Decided by the other approver first, or stale.
					default:
						odd = append(odd, fmt.Sprintf("decide %s: %v", a.GetApprovalId(), err))
					}
				}()
			}
		}
		time.Sleep(time.Duration(rng.Int63n(int64(changeCrashMaxDelay) + 1)))
		killService(t, s, cur, false)
		wg.Wait()
		cancel()
		for _, cc := range []*grpc.ClientConn{alice, bob, dev} {
			cc.Close()
		}
		for _, o := range odd {
			t.Errorf("iteration %d: unexpected answer before the kill: %s", it, o)
		}
		cur = startAuthority(t, s, aliceSrc)
		mu.Lock()
		seen := make(map[string]bool, len(appliedOK))
		for k := range appliedOK {
			seen[k] = true
		}
		mu.Unlock()
		checkChangeInvariants(t, s, it, aliceSrc, devSrc, executor, jobs, seen)
	}
	t.Logf("%d kills: %d change requests, %d decisions, %d cut by a kill; %d changes seen applied",
		changeCrashIterations, requests, decides, cut, len(appliedOK))
}

// pendingChanges lists the pending change approvals.
func pendingChanges(t *testing.T, c authorityv1.AuthorityServiceClient) []*authorityv1.Approval {
	t.Helper()
	var out []*authorityv1.Approval
	for _, a := range listApprovals(t, c) {
		if a.GetKind() == authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE && a.GetState() == authorityv1.ApprovalState_APPROVAL_STATE_PENDING {
			out = append(out, a)
		}
	}
	return out
}

func checkChangeInvariants(t *testing.T, s *stack, it int, aliceSrc, devSrc *tlsconfig.Source, executor executorv1.ExecutorServiceClient, jobs []string, appliedOK map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc := crashDial(t, s, aliceSrc)
	defer cc.Close()
	alice := authorityv1.NewAuthorityServiceClient(cc)
	// The jobs' records, as their client reads them (`job get` is GetJob),
	// on one connection for the whole wait: a CLI process per job per poll
	// cost most of each kill's check.
	devCC := crashDial(t, s, devSrc)
	defer devCC.Close()
	dev := authorityv1.NewAuthorityServiceClient(devCC)

	// What must hold at every moment.
	for _, a := range listApprovals(t, alice) {
		if a.GetKind() != authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE {
			continue
		}
		if len(a.GetVotes()) > 1 {
			t.Errorf("after kill %d: approval %s has %d votes, one is required", it, a.GetApprovalId(), len(a.GetVotes()))
		}
		if appliedOK[a.GetApprovalId()] && a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
			t.Errorf("after kill %d: approval %s was seen applied but is %v", it, a.GetApprovalId(), a.GetState())
		}
	}
	if res := s.airlock(t, "audit", "verify", "--as", "approver/alice"); res.code != 0 {
		t.Errorf("after kill %d: audit verify: exit %d\n%s%s", it, res.code, res.stdout, res.stderr)
	}

	// What must hold once the restarted authority has resumed its work
	// (applied changes approved before the kill, handed stored grants to
	// the executor): checked again until it holds, for up to 20s.
	var problems []string
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		problems = changeProblems(ctx, t, s, alice, dev, executor, jobs)
		if len(problems) == 0 {
			return
		}
		if time.Since(start) > 20*time.Second {
			break
		}
	}
	for _, p := range problems {
		t.Errorf("after kill %d, 20s after the restart: %s", it, p)
	}
	for _, id := range jobs {
		res := s.airlock(t, "audit", "list", "--as", "approver/alice", "--job", id, "--limit", "0")
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		t.Logf("job %s, last audit entries:\n%s", id, strings.Join(lines[max(0, len(lines)-8):], "\n"))
	}
}

// changeProblems compares, for each job, the authority's record, its log
// and the executor: the grant is in force (applied), its generation is one
// more than the job's applied change approvals and job.changed entries,
// and the executor runs that very grant with its pids limit in the cgroup.
func changeProblems(ctx context.Context, t *testing.T, s *stack, alice, dev authorityv1.AuthorityServiceClient, executor executorv1.ExecutorServiceClient, jobs []string) []string {
	var out []string
	consumed := map[string]int{}
	var approved []*authorityv1.Approval
	for _, a := range listApprovals(t, alice) {
		if a.GetKind() != authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE {
			continue
		}
		switch a.GetState() {
		case authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED:
			consumed[a.GetJobId()]++
		case authorityv1.ApprovalState_APPROVAL_STATE_APPROVED:
			approved = append(approved, a)
		}
	}
	changed := map[string]int{}
	for token := ""; ; {
		resp, err := alice.ListAuditEvents(ctx, &authorityv1.ListAuditEventsRequest{Kind: "job.changed", PageSize: 1000, PageToken: token})
		if err != nil {
			return []string{fmt.Sprintf("audit events: %v", err)}
		}
		for _, e := range resp.GetEvents() {
			changed[e.GetJobId()]++
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	byJob := map[string]*authorityv1.Job{}
	for _, id := range jobs {
		resp, err := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
		if err != nil {
			return []string{fmt.Sprintf("GetJob %s: %v", id, err)}
		}
		byJob[id] = resp.GetJob()
	}
	// An approved change the job could still take is a decision not yet
	// carried out: the restarted authority must apply it.
	for _, a := range approved {
		if j := byJob[a.GetJobId()]; j != nil && a.GetChange().GetBaseGeneration() == j.GetGrantGeneration() {
			out = append(out, fmt.Sprintf("change %s of job %s is approved against generation %d, which the job still runs under, but not applied",
				a.GetApprovalId(), a.GetJobId(), j.GetGrantGeneration()))
		}
	}
	for _, id := range jobs {
		j := byJob[id]
		gen := j.GetGrantGeneration()
		if st := j.GetNetworkPolicyStatus().GetState(); st != typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED {
			out = append(out, fmt.Sprintf("job %s: grant generation %d is %v", id, gen, st))
		}
		if gen != int64(1+consumed[id]) || changed[id] != consumed[id] {
			out = append(out, fmt.Sprintf("job %s at grant generation %d with %d applied change approvals and %d job.changed entries; want generation = 1 + applied = 1 + entries",
				id, gen, consumed[id], changed[id]))
		}
		run, err := executor.GetRun(ctx, &executorv1.GetRunRequest{JobId: id})
		if err != nil {
			out = append(out, fmt.Sprintf("executor GetRun %s: %v", id, err))
			continue
		}
		g := &typesv1.Grant{}
		if err := proto.Unmarshal(run.GetRun().GetGrant().GetBody(), g); err != nil {
			out = append(out, fmt.Sprintf("executor's grant of %s: %v", id, err))
			continue
		}
		if g.GetGeneration() != gen || g.GetLimits().GetPids() != j.GetLimits().GetPids() {
			out = append(out, fmt.Sprintf("job %s: the executor runs generation %d (pids %d), the authority recorded %d (pids %d)",
				id, g.GetGeneration(), g.GetLimits().GetPids(), gen, j.GetLimits().GetPids()))
		}
		if pidsMax := readTrim(t, jobLimitFile(s.executorCgroupParent(), id, "pids")); pidsMax != fmt.Sprint(g.GetLimits().GetPids()) {
			out = append(out, fmt.Sprintf("job %s: pids.max in its cgroup %s, the executor's grant says %d", id, pidsMax, g.GetLimits().GetPids()))
		}
	}
	return out
}
