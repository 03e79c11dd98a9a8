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
}

// Grant is a well-formed grant for job id, issued now and expiring after
// ttl (negative: already expired).
func Grant(id string, ttl time.Duration) *typesv1.Grant {
	now := time.Now()
	issued, expires := grant.Timestamps(now.Add(-time.Minute), time.Minute+ttl)
	return &typesv1.Grant{
		JobId: id, Tenant: "acme", Requester: "spiffe://airlock.test/client/dev", Repository: "demo",
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
	foreign, err := grant.NewSigner(otherKey).Sign(Grant("contract-foreign", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	good := sign(Grant("contract-tampered", time.Hour))
	tampered := &typesv1.SignedGrant{Body: append([]byte(nil), good.Body...), Signature: good.Signature, KeyId: good.KeyId}
	tampered.Body[len(tampered.Body)-1] ^= 1
	expired := sign(Grant("contract-expired", -time.Second))

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
			_, err := e.Server.StartJob(ctx, &executorv1.StartJobRequest{Grant: sign(Grant("contract-cancelled-first", time.Hour))})
			return err
		}, codes.FailedPrecondition},
		{"UpdateRun grant of another key", func() error {
			_, err := e.Server.UpdateRun(ctx, &executorv1.UpdateRunRequest{Grant: foreign})
			return err
		}, codes.PermissionDenied},
		{"UpdateRun unknown job", func() error {
			_, err := e.Server.UpdateRun(ctx, &executorv1.UpdateRunRequest{Grant: sign(Grant("contract-unknown", time.Hour))})
			return err
		}, codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(tc.call()); got != tc.code {
				t.Errorf("%s: %v, want %v", tc.name, tc.call(), tc.code)
			}
		})
	}
}
