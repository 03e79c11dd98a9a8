package storetest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// ApprovalCrash is Crash for approvals and leases: the child opens an
// approval, decides it, has two goroutines race to consume it, takes a
// lease, and has two goroutines race to apply an approved change to a job,
// round after round, reporting each commit, until it is SIGKILLed;
// Iterations times. After each kill it checks that the chain verifies;
// that every commit the child reported is there; and that every approval
// and lease agrees with the log: one approval.opened each, one
// approval.decided per stored vote, one approval.consumed exactly when
// the approval is consumed (never two), one lease.issued per lease. The
// test function named in c.Name calls ApprovalCrashChild first.
func ApprovalCrash(t *testing.T, c CrashTest) {
	if os.Getenv(crashEnv) != "" {
		t.Fatal("the crash test's child got past ApprovalCrashChild")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	childTarget := c.ChildTarget
	if childTarget == "" {
		childTarget = c.Target
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	var commits int
	for i := range c.Iterations {
		reported, err := runAndKill(exe, c.Name, childTarget, time.Duration(rng.Int64N(int64(c.MaxDelay)+1)))
		if err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
		if c.Settle != nil {
			c.Settle(t)
		}
		if err := checkApprovalsAfterCrash(t, c, reported); err != nil {
			t.Fatalf("after kill %d (child reported %d commits): %v", i, len(reported), err)
		}
		commits += len(reported)
	}
	t.Logf("%d kills, %d reported commits", c.Iterations, commits)
}

func checkApprovalsAfterCrash(t *testing.T, c CrashTest, reported []string) error {
	s, err := c.Open(ctx(t), c.Target)
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	defer s.Close()
	events := VerifyAudit(t, s)
	count := map[string]int{}
	for _, e := range events {
		count[e.Kind+" "+e.Subject]++
	}
	for _, l := range reported {
		kind, id, _ := strings.Cut(l, " ")
		switch kind {
		case "o", "d", "c":
			a, err := s.GetApproval(ctx(t), "a-"+id)
			if err != nil {
				return fmt.Errorf("committed approval a-%s: %w", id, err)
			}
			if kind == "d" && len(a.Votes) != 1 {
				return fmt.Errorf("committed decision of a-%s is missing", id)
			}
			if kind == "c" && a.State != store.ApprovalConsumed {
				return fmt.Errorf("committed consumption of a-%s is missing (state %s)", id, a.State)
			}
		case "l":
			if _, err := s.GetLease(ctx(t), "l-"+id); err != nil {
				return fmt.Errorf("committed lease l-%s: %w", id, err)
			}
		case "x":
			a, err := s.GetApproval(ctx(t), "ca-"+id)
			if err != nil || a.State != store.ApprovalConsumed {
				return fmt.Errorf("committed change ca-%s: %s, %v", id, a.State, err)
			}
		default:
			return fmt.Errorf("child said %q", l)
		}
	}
	tok := ""
	for {
		page, next, err := s.ListApprovals(ctx(t), store.ApprovalFilter{Limit: 200, PageToken: tok})
		if err != nil {
			return err
		}
		for _, a := range page {
			if n := count["approval.opened "+a.ID]; n != 1 {
				return fmt.Errorf("approval %s has %d approval.opened events", a.ID, n)
			}
			if n := count["approval.decided "+a.ID]; n != len(a.Votes) {
				return fmt.Errorf("approval %s has %d votes but %d approval.decided events", a.ID, len(a.Votes), n)
			}
			want := 0
			if a.State == store.ApprovalConsumed {
				want = 1
			}
			if n := count["approval.consumed "+a.ID]; n != want {
				return fmt.Errorf("approval %s is %s with %d approval.consumed events", a.ID, a.State, n)
			}
			if a.Kind == store.KindChange {
				// The change took effect exactly when its approval was spent.
				j, err := s.GetJob(ctx(t), a.JobID)
				if err != nil {
					return fmt.Errorf("job of change %s: %w", a.ID, err)
				}
				changed := string(j.Grant) == "g-"+strings.TrimPrefix(a.ID, "ca-")
				if changed != (want == 1) || count["job.changed "+a.JobID] != want {
					return fmt.Errorf("change %s is %s but its job changed=%v with %d job.changed events", a.ID, a.State, changed, count["job.changed "+a.JobID])
				}
			}
		}
		if next == "" {
			break
		}
		tok = next
	}
	tok = ""
	for {
		page, next, err := s.ListLeases(ctx(t), store.LeaseFilter{Limit: 200, PageToken: tok})
		if err != nil {
			return err
		}
		for _, l := range page {
			if n := count["lease.issued "+l.ID]; n != 1 {
				return fmt.Errorf("lease %s has %d lease.issued events", l.ID, n)
			}
		}
		if next == "" {
			break
		}
		tok = next
	}
	return nil
}

// ApprovalCrashChild returns at once unless this process is the child of
// an approval crash test, which it then is: it runs rounds until killed
// and never returns.
func ApprovalCrashChild(open func(ctx context.Context, target string) (store.Store, error)) {
	target := os.Getenv(crashEnv)
	if target == "" {
		return
	}
	ctx := context.Background()
	out := os.NewFile(3, "committed")
	s, err := open(ctx, target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	fail := func(what string, err error) {
		fmt.Fprintln(os.Stderr, what+":", err)
		os.Exit(3)
	}
	say := func(kind, id string) {
		if _, err := io.WriteString(out, kind+" "+id+"\n"); err != nil {
			os.Exit(0)
		}
	}
	const approver = "spiffe://airlock.test/approver/alice"
	deadline := time.Now().Add(time.Minute)
	prefix := strconv.Itoa(os.Getpid())
	for i := 0; time.Now().Before(deadline); i++ {
		id := prefix + "-" + strconv.Itoa(i)
		now := time.Now().UTC()
		a := store.Approval{ID: "a-" + id, JobID: "j-" + id, Tenant: "dev", Requester: "spiffe://airlock.test/client/dev",
			BundleDigest: "sha256:" + id, TargetRepo: "demo", TargetBranch: "main", State: store.ApprovalPending,
			Required: 1, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if _, _, err := s.CreateApprovalAudited(ctx, a, audit.Event{Kind: audit.KindApprovalOpened, Subject: a.ID, Outcome: "allowed"}); err != nil {
			fail("open", err)
		}
		say("o", id)
		if _, err := s.DecideApprovalAudited(ctx, a.ID, func(a *store.Approval) (store.Vote, audit.Event, error) {
			a.State = store.ApprovalApproved
			return store.Vote{Approver: approver, Decision: store.DecisionApprove, DecidedAt: now},
				audit.Event{Kind: audit.KindApprovalDecided, Caller: approver, Subject: a.ID, Outcome: "allowed"}, nil
		}); err != nil {
			fail("decide", err)
		}
		say("d", id)
		var (
			wg  sync.WaitGroup
			won = make(chan struct{}, 2)
		)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.ConsumeApprovalAudited(ctx, consumeReq(a, now), audit.Event{Kind: audit.KindApprovalConsumed, Subject: a.ID, Outcome: "allowed"})
				if err == nil {
					won <- struct{}{}
				}
			}()
		}
		wg.Wait()
		if len(won) != 1 {
			fail("consume", fmt.Errorf("%d of 2 consumers won", len(won)))
		}
		say("c", id)
		l := store.Lease{ID: "l-" + id, Purpose: "deploy", JobID: a.JobID, Resource: "demo", Holder: "spiffe://airlock.test/service/publisher",
			IssuedAt: now, ExpiresAt: now.Add(5 * time.Minute)}
		if _, err := s.CreateLeaseAudited(ctx, l, audit.Event{Kind: audit.KindLeaseIssued, Subject: l.ID, Outcome: "allowed"}); err != nil {
			fail("lease", err)
		}
		say("l", id)

		// A change to the round's job: approved, then two appliers race;
		// the job's new grant and the spent approval commit together.
		j := NewJob("dev", "j-"+id, 0)
		j.IdempotencyKey = "k-" + id
		if _, _, err := s.CreateJob(ctx, j); err != nil {
			fail("job", err)
		}
		c := store.Approval{ID: "ca-" + id, Kind: store.KindChange, JobID: j.ID, Tenant: "dev", Requester: "spiffe://airlock.test/client/dev",
			BundleDigest: "sha256:change-" + id, Change: []byte(id), State: store.ApprovalPending, Required: 1, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if _, _, err := s.CreateApprovalAudited(ctx, c, audit.Event{Kind: audit.KindApprovalOpened, Subject: c.ID, Outcome: "allowed"}); err != nil {
			fail("open change", err)
		}
		if _, err := s.DecideApprovalAudited(ctx, c.ID, func(a *store.Approval) (store.Vote, audit.Event, error) {
			a.State = store.ApprovalApproved
			return store.Vote{Approver: approver, Decision: store.DecisionApprove, DecidedAt: now},
				audit.Event{Kind: audit.KindApprovalDecided, Caller: approver, Subject: a.ID, Outcome: "allowed"}, nil
		}); err != nil {
			fail("decide change", err)
		}
		applied := make(chan struct{}, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, err := s.ApplyChangeAudited(ctx, changeReq(c, now), audit.Event{Kind: audit.KindApprovalConsumed, Subject: c.ID, Outcome: "allowed"},
					func(j *store.Job) (audit.Event, error) {
						j.Grant = []byte("g-" + id)
						return audit.Event{Kind: audit.KindJobChanged, Subject: j.ID, Outcome: "allowed"}, nil
					})
				if err == nil {
					applied <- struct{}{}
				}
			}()
		}
		wg.Wait()
		if len(applied) != 1 {
			fail("apply change", fmt.Errorf("%d of 2 appliers won", len(applied)))
		}
		say("x", id)
	}
	os.Exit(0)
}
