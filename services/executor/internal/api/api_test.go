package api

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
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/test/executorcontract"
)

// UpdateRun maps the run manager's refusals to status codes with their
// messages. (Updates that reach a sandbox are tested in package runs.)
func TestUpdateRunErrors(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := runs.New(runs.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Runs: mgr, Verifier: grant.NewVerifier(pub)})
	issued, expires := grant.Timestamps(time.Now(), time.Hour)
	sg, err := grant.NewSigner(key).Sign(&typesv1.Grant{
		JobId: "job-1", Tenant: "acme", Commit: strings.Repeat("a", 40), Command: []string{"true"},
		Limits:        &typesv1.ResourceLimits{CpuMillis: 1000, MemoryBytes: 64 << 20, Pids: 32, DiskBytes: 16 << 20, Deadline: durationpb.New(time.Minute)},
		NetworkPolicy: &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}},
		IssuedAt:      issued, ExpiresAt: expires, Generation: 2,
	})
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
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := runs.New(runs.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	executorcontract.Run(t, executorcontract.Env{Server: New(Config{Runs: mgr, Verifier: grant.NewVerifier(pub)}), Signer: grant.NewSigner(key)})
}
