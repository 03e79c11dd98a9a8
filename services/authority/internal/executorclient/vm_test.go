package executorclient

import (
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/grant"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// TestGrantVMWithRoundTrip: the vm class and a docker request survive the
// authority's stored grant (so a renewal or change of the job grants the
// same), and the signed body, so its digest, covers the request.
func TestGrantVMWithRoundTrip(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s := NewSigner(grant.NewSigner(key))
	now := time.Now()
	req := jobs.GrantRequest{
		JobID: "j1", Tenant: "dev", Requester: "spiffe://test.example/client/dev", Repository: "demo", Commit: strings.Repeat("a", 40),
		Command: []string{"true"}, Limits: policy.DefaultLimits, Network: jobs.Network{Mode: jobs.NetworkDenyAll}, RuntimeClass: policy.RuntimeVM, Generation: 1,
		With: []string{"docker"}, IssuedAt: now, ExpiresAt: now.Add(time.Hour),
	}
	sg, err := s.Sign(req)
	if err != nil {
		t.Fatal(err)
	}
	back, err := s.Decode(sg.Wire)
	if err != nil {
		t.Fatal(err)
	}
	if back.RuntimeClass != policy.RuntimeVM || !slices.Equal(back.With, []string{"docker"}) {
		t.Errorf("class %q with %q came back %q with %q", req.RuntimeClass, req.With, back.RuntimeClass, back.With)
	}
	req.With = nil
	without, err := s.Sign(req)
	if err != nil {
		t.Fatal(err)
	}
	if without.Digest == sg.Digest {
		t.Error("grants differing only in with have one digest")
	}
}

// TestRuntimeClassNames: every class the policy knows has an enum value
// and comes back as itself; an enum value this build does not know is
// refused, not taken for another class.
func TestRuntimeClassNames(t *testing.T) {
	for _, name := range policy.RuntimeClasses() {
		rc, err := RuntimeClassToProto(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if back, ok := RuntimeClassFromProto(rc); !ok || back != name {
			t.Errorf("%s -> %v -> %q, %v", name, rc, back, ok)
		}
	}
	if _, ok := RuntimeClassFromProto(typesv1.RuntimeClass(99)); ok {
		t.Error("runtime class 99 was taken for a known one")
	}
}
