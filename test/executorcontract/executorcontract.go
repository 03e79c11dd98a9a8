// Package executorcontract is the contract the authority's fake executor
// (services/authority/internal/fakeexecutor) must keep with the real one
// (services/executor/internal/api over runs.Manager): the same requests,
// refused with the same status codes. Both run Run in their tests, so a
// fake that drifts from the real service fails, instead of letting the
// authority's tests pass against behaviour no executor has. It covers
// what needs no sandbox: the refusals of grants and of unknown runs.
// Only tests import it.
package executorcontract

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/grant"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Env is one executor under test.
type Env struct {
	// Server is the executor's API, called in process.
	Server executorv1.ExecutorServiceServer
	// Signer signs grants the executor trusts.
	Signer *grant.Signer
	// Executor is the executor's SPIFFE ID, which every grant names.
	Executor string
}

// Grant is a well-formed grant for job id on executor (its SPIFFE ID),
// issued now and expiring after ttl (negative: already expired). It is
// the one grant the executor's tests sign.
func Grant(executor, id string, ttl time.Duration) *typesv1.Grant {
	now := time.Now()
	issued, expires := grant.Timestamps(now.Add(-time.Minute), time.Minute+ttl)
	return &typesv1.Grant{
		Executor: executor,
		JobId:    id, Tenant: "acme", Requester: "spiffe://airlock.test/client/dev", Repository: "demo",
		Commit: strings.Repeat("a", 40), Command: []string{"true"},
		Limits:                  &typesv1.ResourceLimits{CpuMillis: 1000, MemoryBytes: 64 << 20, Pids: 32, DiskBytes: 16 << 20, Deadline: durationpb.New(time.Minute)},
		NetworkPolicy:           &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}},
		NetworkPolicyGeneration: 1, Generation: 1,
		IssuedAt: issued, ExpiresAt: expires,
	}
}

// Run checks e against the contract.
func Run(t *testing.T, e Env) {
	t.Helper()
	ctx := context.Background()
	sign := func(g *typesv1.Grant) *typesv1.SignedGrant {
		t.Helper()
		sg, err := e.Signer.Sign(g)
		if err != nil {
			t.Fatal(err)
		}
		return sg
	}
	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := grant.NewSigner(otherKey).Sign(Grant(e.Executor, "contract-foreign", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	good := sign(Grant(e.Executor, "contract-tampered", time.Hour))
	tampered := &typesv1.SignedGrant{Body: append([]byte(nil), good.Body...), Signature: good.Signature, KeyId: good.KeyId}
	tampered.Body[len(tampered.Body)-1] ^= 1
	expired := sign(Grant(e.Executor, "contract-expired", -time.Second))

	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"StartJob expired grant", func() error {
			_, err := e.Server.StartJob(ctx, &executorv1.StartJobRequest{Grant: expired})
			return err
		}, codes.FailedPrecondition},
		{"StartJob grant of another key", func() error {
			_, err := e.Server.StartJob(ctx, &executorv1.StartJobRequest{Grant: foreign})
			return err
		}, codes.PermissionDenied},
		{"StartJob tampered grant", func() error {
			_, err := e.Server.StartJob(ctx, &executorv1.StartJobRequest{Grant: tampered})
			return err
		}, codes.PermissionDenied},
		{"StartJob no grant", func() error {
			_, err := e.Server.StartJob(ctx, &executorv1.StartJobRequest{})
			return err
		}, codes.InvalidArgument},
		{"GetRun unknown job", func() error {
			_, err := e.Server.GetRun(ctx, &executorv1.GetRunRequest{JobId: "contract-unknown"})
			return err
		}, codes.NotFound},
		{"CancelRun unknown job", func() error {
			_, err := e.Server.CancelRun(ctx, &executorv1.CancelRunRequest{JobId: "contract-unknown"})
			return err
		}, codes.NotFound},
		{"StartJob after a cancel that found no run", func() error {
			// A cancel can reach the executor before the StartJob already
			// on its way: the job must not start after it.
			_, _ = e.Server.CancelRun(ctx, &executorv1.CancelRunRequest{JobId: "contract-cancelled-first"})
			_, err := e.Server.StartJob(ctx, &executorv1.StartJobRequest{Grant: sign(Grant(e.Executor, "contract-cancelled-first", time.Hour))})
			return err
		}, codes.FailedPrecondition},
		{"UpdateRun grant of another key", func() error {
			_, err := e.Server.UpdateRun(ctx, &executorv1.UpdateRunRequest{Grant: foreign})
			return err
		}, codes.PermissionDenied},
		{"UpdateRun unknown job", func() error {
			_, err := e.Server.UpdateRun(ctx, &executorv1.UpdateRunRequest{Grant: sign(Grant(e.Executor, "contract-unknown", time.Hour))})
			return err
		}, codes.NotFound},
		// A session's calls (the authority's jobs.Sessions) about a run the
		// executor does not have, and without what they require.
		{"GetExec unknown job", func() error {
			_, err := e.Server.GetExec(ctx, &executorv1.GetExecRequest{JobId: "contract-unknown", ExecId: "e1"})
			return err
		}, codes.NotFound},
		{"GetExec no exec_id", func() error {
			_, err := e.Server.GetExec(ctx, &executorv1.GetExecRequest{JobId: "contract-unknown"})
			return err
		}, codes.InvalidArgument},
		{"StartExec unknown job", func() error {
			_, err := e.Server.StartExec(ctx, &executorv1.StartExecRequest{JobId: "contract-unknown", Spec: &typesv1.ExecSpec{ExecId: "e1", Argv: []string{"true"}}})
			return err
		}, codes.NotFound},
		{"StartExec no spec", func() error {
			_, err := e.Server.StartExec(ctx, &executorv1.StartExecRequest{JobId: "contract-unknown"})
			return err
		}, codes.InvalidArgument},
		{"ListExecs unknown job", func() error {
			_, err := e.Server.ListExecs(ctx, &executorv1.ListExecsRequest{JobId: "contract-unknown"})
			return err
		}, codes.NotFound},
		{"CancelExec unknown job", func() error {
			_, err := e.Server.CancelExec(ctx, &executorv1.CancelExecRequest{JobId: "contract-unknown", ExecId: "e1"})
			return err
		}, codes.NotFound},
		{"WatchExec unknown job", func() error {
			return e.Server.WatchExec(&executorv1.WatchExecRequest{JobId: "contract-unknown", ExecId: "e1"}, &sink[executorv1.WatchExecResponse]{ctx: ctx})
		}, codes.NotFound},
		{"FinishRun unknown job", func() error {
			_, err := e.Server.FinishRun(ctx, &executorv1.FinishRunRequest{JobId: "contract-unknown"})
			return err
		}, codes.NotFound},
		{"SuspendRun unknown job", func() error {
			_, err := e.Server.SuspendRun(ctx, &executorv1.SuspendRunRequest{JobId: "contract-unknown"})
			return err
		}, codes.NotFound},
		{"ResumeRun unknown job", func() error {
			_, err := e.Server.ResumeRun(ctx, &executorv1.ResumeRunRequest{JobId: "contract-unknown"})
			return err
		}, codes.NotFound},
		{"ReadFile unknown job", func() error {
			return e.Server.ReadFile(&executorv1.ReadFileRequest{JobId: "contract-unknown", Path: "/work/a"}, &sink[executorv1.ReadFileResponse]{ctx: ctx})
		}, codes.NotFound},
		{"ListFiles unknown job", func() error {
			_, err := e.Server.ListFiles(ctx, &executorv1.ListFilesRequest{JobId: "contract-unknown", Path: "/work"})
			return err
		}, codes.NotFound},
		// The authority's jobs.Caches.
		{"ListCaches no tenant", func() error {
			_, err := e.Server.ListCaches(ctx, &executorv1.ListCachesRequest{})
			return err
		}, codes.InvalidArgument},
		{"ClearCaches no tenant", func() error {
			_, err := e.Server.ClearCaches(ctx, &executorv1.ClearCachesRequest{Name: "go-build"})
			return err
		}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(tc.call()); got != tc.code {
				t.Errorf("%s: %v, want %v", tc.name, tc.call(), tc.code)
			}
		})
	}
}

// sink is a server stream that takes what is sent and nothing else: the
// calls above end before they receive or set headers.
type sink[T any] struct {
	grpc.ServerStream
	ctx  context.Context
	sent []*T
}

func (s *sink[T]) Context() context.Context { return s.ctx }
func (s *sink[T]) Send(m *T) error {
	s.sent = append(s.sent, m)
	return nil
}
