//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// coldStart is one session's steps, each from its CreateSession call.
type coldStart struct {
	// created: CreateSession answered (the session granted, placed and
	// stored); running: its sandbox up and taking execs (WatchJob says
	// RUNNING); first: the first exec's first byte of output.
	created, running, first time.Duration
}

// sessionFirstOutput is what a platform compares sandboxes by: from
// CreateSession to the first byte of the first exec's output, through the
// real authority and executor over mTLS, with a Go client. It returns the
// session's id and its steps' times; the exec is then read to its end.
func sessionFirstOutput(ctx context.Context, client authorityv1.AuthorityServiceClient, key string) (string, coldStart, error) {
	var st coldStart
	sid, err := func() (string, error) {
		began := time.Now()
		resp, err := client.CreateSession(ctx, &authorityv1.CreateSessionRequest{Tenant: "dev", IdempotencyKey: key,
			Spec: &authorityv1.JobSpec{Repository: "bench", Revision: "main"}})
		if err != nil {
			return "", err
		}
		st.created = time.Since(began)
		sid := resp.GetSession().GetJobId()
		return sid, watchFirstOutput(ctx, client, sid, began, &st)
	}()
	return sid, st, err
}

// watchFirstOutput waits for session sid to run, then runs its first exec
// and times both from began.
func watchFirstOutput(ctx context.Context, client authorityv1.AuthorityServiceClient, sid string, began time.Time, st *coldStart) error {
	watch, err := client.WatchJob(ctx, &authorityv1.WatchJobRequest{JobId: sid})
	if err != nil {
		return err
	}
	for running := false; !running; {
		msg, err := watch.Recv()
		if err != nil {
			return fmt.Errorf("watch session %s: %w", sid, err)
		}
		switch j := msg.GetJob(); {
		case j == nil:
		case j.GetState() == authorityv1.JobState_JOB_STATE_RUNNING:
			running = true
		case jobEnded(j):
			return fmt.Errorf("session %s ended %v: %s", sid, j.GetState(), j.GetMessage())
		}
	}
	st.running = time.Since(began)
	stream, err := client.RunExec(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{
		SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: "first", Argv: []string{"echo", "hi"}},
	}}}); err != nil {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("the exec's stream ended without its record")
		}
		if err != nil {
			return err
		}
		if o := msg.GetOutput(); o != nil && st.first == 0 && len(o.GetData()) > 0 {
			st.first = time.Since(began)
		}
		if x := msg.GetExec(); x != nil {
			if x.GetExitCode() != 0 || st.first == 0 {
				return fmt.Errorf("the first exec: %v %d, output seen %v", x.GetReason(), x.GetExitCode(), st.first > 0)
			}
			return nil
		}
	}
}

// medianMs is the median of ds, in milliseconds.
func medianMs(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2].Microseconds()) / 1000
}

// coldStartClients are a client/dev and an operator/admin client of s's
// authority, and a session finisher, once a first session has staged the
// source "bench" and taught the executor the dev tenant's shape.
func coldStartClients(ctx context.Context, b testing.TB, s *stack) (client, ops authorityv1.AuthorityServiceClient, finish func(string)) {
	b.Helper()
	client = authorityv1.NewAuthorityServiceClient(s.dial(b, "client/dev", "authority"))
	ops = authorityv1.NewAuthorityServiceClient(s.dial(b, "operator/admin", "authority"))
	finish = func(sid string) {
		if _, err := client.FinishSession(ctx, &authorityv1.FinishSessionRequest{SessionId: sid}); err != nil {
			b.Fatal(err)
		}
	}
	sid, _, err := sessionFirstOutput(ctx, client, "teach")
	if err != nil {
		b.Fatal(err)
	}
	finish(sid)
	return client, ops, finish
}

// warmPools is what the stack's executor last reported of its warm pools.
func warmPools(ctx context.Context, b testing.TB, ops authorityv1.AuthorityServiceClient) []*authorityv1.WarmPoolReport {
	b.Helper()
	resp, err := ops.ListExecutors(ctx, &authorityv1.ListExecutorsRequest{})
	if err != nil {
		b.Fatal(err)
	}
	var out []*authorityv1.WarmPoolReport
	for _, e := range resp.GetExecutors() {
		out = append(out, e.GetReport().GetWarmPools()...)
	}
	return out
}

// waitWarm waits until the executor reports the dev tenant's pool as cond
// has it (heartbeats come every few seconds).
func waitWarm(ctx context.Context, b testing.TB, ops authorityv1.AuthorityServiceClient, what string, cond func(*authorityv1.WarmPoolReport) bool) *authorityv1.WarmPoolReport {
	b.Helper()
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		for _, p := range warmPools(ctx, b, ops) {
			if p.GetTenant() == "dev" && cond(p) {
				return p
			}
		}
		if time.Now().After(end) {
			b.Fatalf("the executor never reported the dev tenant's warm pool %s: %v", what, warmPools(ctx, b, ops))
		}
	}
}

// BenchmarkColdStart: from CreateSession to the first exec's first byte of
// output, a Go client over mTLS through the real authority and executor,
// with no pool (via=cold) and with a warm pool of 2 (via=warm), in one
// run. Between sessions, off the clock, the last one is finished and the
// pool given time to refill. It reports the medians of each step from the
// CreateSession call: its answer (created-ms), the session running
// (running-ms), and the first output (median-ms). With a pool, every
// timed session must have been a hit, as the executor reports.
func BenchmarkColdStart(b *testing.B) {
	for _, via := range []string{"cold", "warm"} {
		b.Run("via="+via, func(b *testing.B) {
			args := []string{"--repo", "bench=" + benchRepo(b, 3)}
			if via == "warm" {
				args = append(args, "--warm-pool", "2")
			}
			s := startStack(b, args...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			client, ops, finish := coldStartClients(ctx, b, s)
			var before int64
			if via == "warm" {
				p := waitWarm(ctx, b, ops, "full", func(p *authorityv1.WarmPoolReport) bool { return p.GetReady() == 2 && p.GetTarget() == 2 })
				before = p.GetHits()
			}
			var created, up, first []time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				// A pooled sandbox is made in about a third of a second
				// here: the next session finds the pool full.
				time.Sleep(time.Second)
				b.StartTimer()
				sid, st, err := sessionFirstOutput(ctx, client, fmt.Sprintf("cold-start-%d", i))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				created, up, first = append(created, st.created), append(up, st.running), append(first, st.first)
				finish(sid)
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(medianMs(first), "median-ms")
			b.ReportMetric(medianMs(up), "running-ms")
			b.ReportMetric(medianMs(created), "created-ms")
			if via == "warm" {
				want := before + int64(b.N)
				waitWarm(ctx, b, ops, fmt.Sprintf("with %d hits", want), func(p *authorityv1.WarmPoolReport) bool { return p.GetHits() >= want })
			}
		})
	}
}
