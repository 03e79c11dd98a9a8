package api

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/test/bufconntest"
	"github.com/airlockhq/airlock/test/executorcontract"
)

// UpdateRun maps the run manager's refusals to status codes with their
// messages. (Updates that reach a sandbox are tested in package runs.)
func TestUpdateRunErrors(t *testing.T) {
	mgr, pub, signer := newManager(t)
	s := New(Config{Runs: mgr, Verifier: grant.NewVerifier(pub), Self: execB})
	g := executorcontract.Grant(execB.String(), "job-1", time.Hour)
	g.Generation = 2
	sg, err := signer.Sign(g)
	if err != nil {
		t.Fatal(err)
	}
	bad := &typesv1.SignedGrant{Body: sg.Body, Signature: append([]byte{sg.Signature[0] ^ 1}, sg.Signature[1:]...), KeyId: sg.KeyId}
	for _, tc := range []struct {
		name string
		req  *executorv1.UpdateRunRequest
		code codes.Code
		text string
	}{
		{"no grant", &executorv1.UpdateRunRequest{}, codes.InvalidArgument, "grant is required"},
		{"bad signature", &executorv1.UpdateRunRequest{Grant: bad}, codes.PermissionDenied, "bad signature"},
		{"unknown job", &executorv1.UpdateRunRequest{Grant: sg}, codes.NotFound, "job-1"},
	} {
		_, err := s.UpdateRun(context.Background(), tc.req)
		if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.text) {
			t.Errorf("%s: %v, want %s naming %q", tc.name, err, tc.code, tc.text)
		}
	}
}

// TestContract: the real executor API keeps the contract the authority's
// fake is held to (test/executorcontract).
func TestContract(t *testing.T) {
	mgr, pub, signer := newManager(t)
	executorcontract.Run(t, executorcontract.Env{
		Server: New(Config{Runs: mgr, Verifier: grant.NewVerifier(pub), Self: execB}), Signer: signer, Executor: execB.String(),
	})
}

// execA and execB are two executors of one fleet; the tests' executor is B.
var (
	execA = identity.MustParse("spiffe://test.example/service/executor/exec-a")
	execB = identity.MustParse("spiffe://test.example/service/executor/exec-b")
)

// TestGrantForAnotherExecutor is the attacker's side of a fleet: whoever
// holds a grant the authority signed for executor A — correctly signed,
// unexpired — presents it to executor B over gRPC. B refuses it,
// PermissionDenied naming both, and starts nothing: it has no run of the
// job. A grant naming no executor, and an UpdateRun with A's grant, are
// refused the same way.
func TestGrantForAnotherExecutor(t *testing.T) {
	mgr, pub, signer := newManager(t)
	client := serve(t, New(Config{Runs: mgr, Verifier: grant.NewVerifier(pub), Self: execB}))
	forA, err := signer.Sign(executorcontract.Grant(execA.String(), "job-for-a", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	forNone, err := signer.Sign(executorcontract.Grant("", "job-for-a", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		text string
	}{
		{"StartJob for A", func() error {
			_, err := client.StartJob(ctx, &executorv1.StartJobRequest{Grant: forA})
			return err
		}, "grant is for executor " + execA.String() + "; this is " + execB.String()},
		{"StartJob for none", func() error {
			_, err := client.StartJob(ctx, &executorv1.StartJobRequest{Grant: forNone})
			return err
		}, "the grant names no executor"},
		{"UpdateRun for A", func() error {
			_, err := client.UpdateRun(ctx, &executorv1.UpdateRunRequest{Grant: forA})
			return err
		}, "grant is for executor " + execA.String()},
	} {
		st := status.Convert(tc.call())
		if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), tc.text) {
			t.Errorf("%s: %v; want PermissionDenied naming %q", tc.name, st.Err(), tc.text)
		}
	}
	if run, err := mgr.Get("job-for-a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("executor B has a run of A's job: %+v, %v", run, err)
	}
}

// serve is s behind a real gRPC server, in process.
func serve(t *testing.T, s *Service) executorv1.ExecutorServiceClient {
	t.Helper()
	return executorv1.NewExecutorServiceClient(bufconntest.Dial(t, s.Register))
}

// newManager is a run manager with no sandbox (enough for refusals), and
// a grant key the tests' executor trusts.
func newManager(t *testing.T) (*runs.Manager, ed25519.PublicKey, *grant.Signer) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := runs.New(runs.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return mgr, pub, grant.NewSigner(key)
}
