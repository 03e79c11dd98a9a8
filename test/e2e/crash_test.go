//go:build linux

package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Sizes of the crash test: how many approvals it prepares, how many times
// it kills the authority, and the window in which the kill lands.
const (
	crashApprovals  = 32
	crashIterations = 150
	crashMaxDelay   = 30 * time.Millisecond
)

// startAuthority starts the authority again (startService) and returns
// once it answers an RPC from alice.
func startAuthority(t *testing.T, s *stack, alice *tlsconfig.Source) *serviceProc {
	t.Helper()
	return startService(t, s, "authority", 5*time.Millisecond, func() error {
		cc := crashDial(t, s, alice)
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := authorityv1.NewAuthorityServiceClient(cc).ListApprovals(ctx, &authorityv1.ListApprovalsRequest{PageSize: 1})
		return err
	})
}

// crashDial opens a new connection to the authority that retries its
// connection quickly (the default backoff waits a second after a refusal).
func crashDial(t *testing.T, s *stack, src *tlsconfig.Source) *grpc.ClientConn {
	t.Helper()
	return s.dialWith(t, src, "authority", grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 50 * time.Millisecond},
		MinConnectTimeout: time.Second,
	}))
}

// connectNow makes cc connect and waits until it is ready, so that the
// kill window covers RPCs, not TLS handshakes.
func connectNow(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc.Connect()
	for st := cc.GetState(); st != connectivity.Ready; st = cc.GetState() {
		if !cc.WaitForStateChange(ctx, st) {
			t.Fatalf("connection to the authority not ready: %v", cc.GetState())
		}
	}
}

// crashLedger is what the clients saw succeed, across all iterations.
type crashLedger struct {
	mu        sync.Mutex
	consumeOK map[string]int             // approval id -> ConsumeApproval successes
	votesOK   map[string]map[string]bool // approval id -> approvers whose DecideApproval succeeded
	leasesOK  map[string][]string        // job id -> lease ids LeaseCredential returned
	consumes  int                        // consume attempts, for the log
	leases    int
	decides   int
	cut       int       // RPCs that ended with the authority gone
	inFlight  int       // of those, RPCs sent before the kill
	killAt    time.Time // when this iteration's SIGKILL was sent; zero before
}

// cutOff counts an RPC sent at sent that ended with the authority gone.
func (l *crashLedger) cutOff(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut++
	if !l.killAt.IsZero() && sent.Before(l.killAt) {
		l.inFlight++
	}
}

func (l *crashLedger) consumed(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.consumeOK[id]++
}

func (l *crashLedger) voted(id, approver string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.votesOK[id] == nil {
		l.votesOK[id] = map[string]bool{}
	}
	l.votesOK[id][approver] = true
}

func (l *crashLedger) leased(jobID, leaseID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leasesOK[jobID] = append(l.leasesOK[jobID], leaseID)
}

func (l *crashLedger) count(n *int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*n++
}

// gone reports whether err means the authority is no longer there for
// this iteration (killed, or the iteration's context ended).
func gone(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		return true
	}
	return false
}

// TestAuthorityKilledMidDecisionKeepsEveryInvariant prepares a stack of
// approvals, then, again and again, fires approvers' decisions, two
// concurrent consumes of the same approval and the publisher's lease at the
// real authority and SIGKILLs it a random moment later, starts it again
// with the same config, and checks over fresh connections that nothing the
// clients saw succeed was lost and nothing happened twice: at most one
// consume per approval ever succeeds and its approval stays consumed (a
// further consume fails with FailedPrecondition); every successful vote is
// recorded; every issued lease is listed and belongs to a consumed
// approval; and the audit chain verifies, with exactly one
// approval.consumed event per consumed approval and none for the others.
func TestAuthorityKilledMidDecisionKeepsEveryInvariant(t *testing.T) {
	began := time.Now()
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	aliceSrc, bobSrc, pubSrc := s.source(t, "approver/alice"), s.source(t, "approver/bob"), s.source(t, "service/publisher")
	publisherID := identity.Service(trustDomain, identity.ServicePublisher).String()

	for i := 0; i < crashApprovals; i++ {
		res := s.airlock(t, "job", "submit", "--repo", "sample", "--publish-to", "sample:main",
			"--idempotency-key", "crash-"+strconv.Itoa(i), "--", "true")
		if res.code != 0 {
			t.Fatalf("job submit %d: exit %d\n%s%s", i, res.code, res.stdout, res.stderr)
		}
	}
	var approvals []*authorityv1.Approval
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		cc := crashDial(t, s, aliceSrc)
		approvals = listApprovals(t, authorityv1.NewAuthorityServiceClient(cc))
		cc.Close()
		if len(approvals) == crashApprovals {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("after 60s, %d approvals of %d jobs are open", len(approvals), crashApprovals)
		}
	}
	for _, a := range approvals {
		if a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING || a.GetRequiredApprovals() != 1 ||
			a.GetTarget().GetRepository() != "sample" || a.GetTarget().GetBranch() != "main" {
			t.Fatalf("prepared approval is not a pending one-approver request for sample:main: %v", a)
		}
	}
	t.Logf("prepared %d approvals in %v", len(approvals), time.Since(began).Round(time.Millisecond))

	ledger := &crashLedger{consumeOK: map[string]int{}, votesOK: map[string]map[string]bool{}, leasesOK: map[string][]string{}}
	cur := s.proc("authority")
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("kill delays and targets drawn with seed %d", seed)
	byID := map[string]*authorityv1.Approval{}
	for _, a := range approvals {
		byID[a.GetApprovalId()] = a
	}

	loopStart := time.Now()
	kills := 0
	for it := 0; it < crashIterations && !t.Failed(); it++ {
		// Targets: one approval not yet consumed (if any is left) and two
		// at random, consumed or not.
		var open []*authorityv1.Approval
		for _, a := range approvals {
			if byID[a.GetApprovalId()].GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
				open = append(open, a)
			}
		}
		targets := map[string]*authorityv1.Approval{}
		if len(open) > 0 {
			a := open[rng.Intn(len(open))]
			targets[a.GetApprovalId()] = a
		}
		for len(targets) < 3 {
			a := approvals[rng.Intn(len(approvals))]
			targets[a.GetApprovalId()] = a
		}

		conns := map[string]*grpc.ClientConn{
			"alice": crashDial(t, s, aliceSrc), "bob": crashDial(t, s, bobSrc),
			"pub1": crashDial(t, s, pubSrc), "pub2": crashDial(t, s, pubSrc),
		}
		for _, cc := range conns {
			connectNow(t, cc)
		}
		client := func(name string) authorityv1.AuthorityServiceClient {
			return authorityv1.NewAuthorityServiceClient(conns[name])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		var unexpected []string
		var umu sync.Mutex
		odd := func(format string, args ...any) {
			umu.Lock()
			defer umu.Unlock()
			unexpected = append(unexpected, fmt.Sprintf(format, args...))
		}
		for id, a := range targets {
			for _, who := range []string{"alice", "bob"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sent := time.Now()
					_, err := client(who).DecideApproval(ctx, &authorityv1.DecideApprovalRequest{
						ApprovalId: id, BundleDigest: a.GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE,
						Comment: fmt.Sprintf("crash iteration %d", it),
					})
					ledger.count(&ledger.decides)
					switch code := status.Code(err); {
					case err == nil:
						ledger.voted(id, "spiffe://"+trustDomain+"/approver/"+who)
					case gone(err):
						ledger.cutOff(sent)
					case code == codes.AlreadyExists, code == codes.FailedPrecondition:
					default:
						odd("decide %s as %s: %v", id, who, err)
					}
				}()
			}
			if byID[id].GetState() == authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
				// Consumed before: the publisher leases again meanwhile.
				wg.Add(1)
				go func() {
					defer wg.Done()
					for try := 0; try < 8; try++ {
						sent := time.Now()
						resp, err := client("pub2").LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{
							Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: a.GetJobId(), Resource: "sample",
							Ttl: durationpb.New(10 * time.Minute)})
						ledger.count(&ledger.leases)
						switch {
						case err == nil:
							ledger.leased(a.GetJobId(), resp.GetLease().GetLeaseId())
						case gone(err):
							ledger.cutOff(sent)
							return
						default:
							odd("lease for consumed job %s: %v", a.GetJobId(), err)
							return
						}
						time.Sleep(3 * time.Millisecond)
					}
				}()
			}
			for _, pub := range []string{"pub1", "pub2"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := client(pub)
					req := &authorityv1.ConsumeApprovalRequest{ApprovalId: id, JobId: a.GetJobId(), BundleDigest: a.GetBundleDigest(),
						Target: &typesv1.PublishTarget{Repository: "sample", Branch: "main"}}
					consumedHere := false
					for try := 0; try < 8 && !consumedHere; try++ {
						sent := time.Now()
						_, err := c.ConsumeApproval(ctx, req)
						ledger.count(&ledger.consumes)
						if err == nil {
							ledger.consumed(id)
							consumedHere = true
							break
						}
						if gone(err) {
							ledger.cutOff(sent)
							return
						}
						if status.Code(err) != codes.FailedPrecondition {
							odd("consume %s via %s: %v", id, pub, err)
							return
						}
						time.Sleep(3 * time.Millisecond)
					}
					// The publisher leases after its consume.
					if !consumedHere {
						return
					}
					sent := time.Now()
					resp, err := c.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{
						Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY, JobId: a.GetJobId(), Resource: "sample",
						Ttl: durationpb.New(10 * time.Minute)})
					ledger.count(&ledger.leases)
					switch {
					case err == nil:
						ledger.leased(a.GetJobId(), resp.GetLease().GetLeaseId())
					case gone(err):
						ledger.cutOff(sent)
						return
					case status.Code(err) == codes.FailedPrecondition && !consumedHere:
						return // not consumed (yet): no lease, rightly
					default:
						odd("lease for job %s via %s (consumed here: %v): %v", a.GetJobId(), pub, consumedHere, err)
						return
					}
				}()
			}
		}
		time.Sleep(time.Duration(rng.Int63n(int64(crashMaxDelay) + 1)))
		ledger.mu.Lock()
		ledger.killAt = time.Now()
		ledger.mu.Unlock()
		killService(t, s, cur, false)
		kills++
		wg.Wait()
		ledger.mu.Lock()
		ledger.killAt = time.Time{}
		ledger.mu.Unlock()
		cancel()
		for _, cc := range conns {
			cc.Close()
		}
		for _, u := range unexpected {
			t.Errorf("iteration %d: unexpected answer before the kill: %s", it, u)
		}

		cur = startAuthority(t, s, aliceSrc)
		byID = checkCrashInvariants(t, s, it, aliceSrc, pubSrc, ledger, targets, publisherID)
	}
	if !t.Failed() {
		checkCrashInvariants(t, s, crashIterations, aliceSrc, pubSrc, ledger, byID, publisherID)
	}
	consumed := 0
	for _, a := range byID {
		if a.GetState() == authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
			consumed++
		}
	}
	leases := 0
	for _, l := range ledger.leasesOK {
		leases += len(l)
	}
	t.Logf("%d kills in %v (whole test %v): %d decides, %d consumes, %d leases attempted, %d cut by a kill (%d of them sent before it); %d approvals consumed, %d leases seen issued",
		kills, time.Since(loopStart).Round(time.Millisecond), time.Since(began).Round(time.Millisecond),
		ledger.decides, ledger.consumes, ledger.leases, ledger.cut, ledger.inFlight, consumed, leases)
}

// checkCrashInvariants checks, over new connections to the restarted
// authority, everything the ledger says the clients saw, and returns the
// approvals by id as the authority now has them.
func checkCrashInvariants(t *testing.T, s *stack, it int, aliceSrc, pubSrc *tlsconfig.Source, ledger *crashLedger,
	probe map[string]*authorityv1.Approval, publisherID string) map[string]*authorityv1.Approval {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	aliceCC, pubCC := crashDial(t, s, aliceSrc), crashDial(t, s, pubSrc)
	defer aliceCC.Close()
	defer pubCC.Close()
	alice, pub := authorityv1.NewAuthorityServiceClient(aliceCC), authorityv1.NewAuthorityServiceClient(pubCC)

	list := listApprovals(t, alice)
	byID := map[string]*authorityv1.Approval{}
	for _, a := range list {
		byID[a.GetApprovalId()] = a
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()

	// Consumes: at most one success ever; a seen success stays consumed;
	// another consume of a consumed approval fails with FailedPrecondition.
	for id, n := range ledger.consumeOK {
		if n > 1 {
			t.Errorf("after kill %d: approval %s was consumed %d times", it, id, n)
		}
		if st := byID[id].GetState(); n > 0 && st != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
			t.Errorf("after kill %d: a consume of approval %s succeeded but it is %v", it, id, st)
		}
	}
	for id := range probe {
		a := byID[id]
		if a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
			continue
		}
		if got, err := alice.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: id}); err != nil ||
			got.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
			t.Errorf("after kill %d: GetApproval %s: %v, %v; want CONSUMED as listed", it, id, got.GetApproval().GetState(), err)
		}
		_, err := pub.ConsumeApproval(ctx, &authorityv1.ConsumeApprovalRequest{ApprovalId: id, JobId: a.GetJobId(),
			BundleDigest: a.GetBundleDigest(), Target: a.GetTarget()})
		if err == nil {
			ledger.consumeOK[id]++
			t.Errorf("after kill %d: approval %s, already consumed, was consumed again", it, id)
		} else if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("after kill %d: consume of consumed approval %s: %v, want FailedPrecondition", it, id, err)
		}
	}

	// Decisions: every vote a client saw succeed is recorded.
	for id, who := range ledger.votesOK {
		recorded := map[string]bool{}
		for _, v := range byID[id].GetVotes() {
			recorded[v.GetApprover()] = true
		}
		for approver := range who {
			if !recorded[approver] {
				t.Errorf("after kill %d: %s's decision on approval %s was acknowledged but is lost (votes %v)", it, approver, id, byID[id].GetVotes())
			}
		}
	}
	for id, a := range byID {
		approves := 0
		for _, v := range a.GetVotes() {
			if v.GetDecision() == authorityv1.Decision_DECISION_APPROVE {
				approves++
			}
		}
		if len(a.GetVotes()) > 1 || (a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING && approves != 1) {
			t.Errorf("after kill %d: approval %s is %v with votes %v; want one vote once decided (one required)", it, id, a.GetState(), a.GetVotes())
		}
	}

	// Leases: every issued lease is listed, and only consumed approvals
	// have leases.
	listed := map[string]*authorityv1.Lease{}
	for token := ""; ; {
		resp, err := alice.ListLeases(ctx, &authorityv1.ListLeasesRequest{IncludeInactive: true, PageSize: 500, PageToken: token})
		if err != nil {
			t.Fatalf("after kill %d: list leases: %v", it, err)
		}
		for _, l := range resp.GetLeases() {
			listed[l.GetLeaseId()] = l
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	jobState := map[string]authorityv1.ApprovalState{}
	for _, a := range byID {
		jobState[a.GetJobId()] = a.GetState()
	}
	for jobID, ids := range ledger.leasesOK {
		for _, id := range ids {
			if _, ok := listed[id]; !ok {
				t.Errorf("after kill %d: lease %s for job %s was issued but is not listed", it, id, jobID)
			}
		}
	}
	for id, l := range listed {
		if st := jobState[l.GetJobId()]; st != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED || l.GetHolder() != publisherID {
			t.Errorf("after kill %d: lease %s for job %s held by %s, whose approval is %v", it, id, l.GetJobId(), l.GetHolder(), st)
		}
	}

	// Audit: the chain verifies, and each consumed approval has exactly one
	// allowed approval.consumed event, the others none.
	if res := s.airlock(t, "audit", "verify", "--as", "approver/alice"); res.code != 0 {
		t.Errorf("after kill %d: audit verify: exit %d\n%s%s", it, res.code, res.stdout, res.stderr)
	}
	consumedEvents := map[string]int{}
	for token := ""; ; {
		resp, err := alice.ListAuditEvents(ctx, &authorityv1.ListAuditEventsRequest{Kind: "approval.consumed", PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatalf("after kill %d: list audit events: %v", it, err)
		}
		for _, e := range resp.GetEvents() {
			if e.GetOutcome() == authorityv1.AuditOutcome_AUDIT_OUTCOME_ALLOWED {
				consumedEvents[e.GetSubject()]++
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	for id, a := range byID {
		want := 0
		if a.GetState() == authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
			want = 1
		}
		if consumedEvents[id] != want {
			t.Errorf("after kill %d: approval %s is %v with %d allowed approval.consumed events, want %d", it, id, a.GetState(), consumedEvents[id], want)
		}
	}
	return byID
}

// listApprovals lists every approval the client may see, in all states.
func listApprovals(t *testing.T, c authorityv1.AuthorityServiceClient) []*authorityv1.Approval {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*authorityv1.Approval
	for token := ""; ; {
		resp, err := c.ListApprovals(ctx, &authorityv1.ListApprovalsRequest{PageSize: 500, PageToken: token})
		if err != nil {
			t.Fatalf("list approvals: %v", err)
		}
		out = append(out, resp.GetApprovals()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
}
