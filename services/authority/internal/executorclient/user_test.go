package executorclient

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// TestGrantUserRoundTrip: who a job runs as survives the authority's
// stored grant, so every later grant of the job (a renewal, a change of
// limits, built from the stored one) names the same user, which the
// executor holds fixed.
func TestGrantUserRoundTrip(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s := NewSigner(grant.NewSigner(key))
	for _, u := range []runspec.User{runspec.Root, runspec.Agent, {UID: 2000, GID: 3000}} {
		now := time.Now()
		sg, err := s.Sign(jobs.GrantRequest{
			JobID: "j1", Tenant: "dev", Requester: "spiffe://test.example/client/dev", Repository: "demo", Commit: strings.Repeat("a", 40),
			Command: []string{"true"}, Limits: policy.DefaultLimits, Network: jobs.Network{Mode: jobs.NetworkDenyAll}, RuntimeClass: policy.RuntimeRunc, Generation: 1,
			User: u, IssuedAt: now, ExpiresAt: now.Add(time.Hour),
		})
		if err != nil {
			t.Fatal(err)
		}
		back, err := s.Decode(sg.Wire)
		if err != nil {
			t.Fatal(err)
		}
		if back.User != u {
			t.Errorf("user %v came back %v", u, back.User)
		}
	}
}
