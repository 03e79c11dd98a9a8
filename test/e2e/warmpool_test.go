//go:build linux

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestWarmPoolAllowPolicy: a job submitted with an allow policy claims a
// pooled sandbox (made ahead with a deny-all network and no interface),
// and its claim puts the policy in force: the job reaches exactly the
// allowed port of a test host — not its other port, nor the executor
// host's own address inside the allowed CIDR. Narrowing it to deny-all
// then applies at once, as on a sandbox made for the job. (A kernel
// before 6.15 has no exec helper and pools nothing, as the sandbox
// package's tests check: there the job is made cold, and the rest holds.)
func TestWarmPoolAllowPolicy(t *testing.T) {
	pooled := kernelAtLeast(t, 6, 15)
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo, "--warm-pool", "1")
	th, targets := probeTargets(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ops := authorityv1.NewAuthorityServiceClient(s.dial(t, "operator/admin", "authority"))

	// A first job teaches the executor the dev tenant's shape (a miss);
	// then the pool makes one sandbox of it.
	if res := s.airlock(t, "job", "submit", "--wait", "--repo", "sample", "--rev", "main", "--", "true"); res.code != 0 {
		t.Fatalf("the first job: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if pooled {
		waitWarm(ctx, t, ops, "ready", func(p *authorityv1.WarmPoolReport) bool { return p.GetReady() == 1 })
	}

	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--allow", th.Prefix.String()+":8080,8082", "--", "bash", "-c", probeScript(targets))
	if res.code != 0 {
		t.Fatalf("job submit --allow: exit %d\n%s", res.code, res.stderr)
	}
	id := strings.TrimSpace(res.stdout)
	watch := s.startAirlock(t, "job", "watch", id)
	defer s.airlock(t, "job", "cancel", id)
	// It claimed the pooled sandbox.
	if pooled {
		waitWarm(ctx, t, ops, "hit", func(p *authorityv1.WarmPoolReport) bool { return p.GetHits() == 1 })
	}

	r := waitRound(t, watch, "the allowed port from the claimed sandbox", func(r map[string]bool) bool { return r["allowed"] })
	if r["other-port"] || r["host"] {
		t.Fatalf("beyond the allowed port the claimed job reached %v (the host's own address is never reachable)", r)
	}
	if st := s.job(t, id).GetNetworkPolicyStatus(); st.GetPolicy().GetAllow() == nil || st.GetState().String() != "NETWORK_POLICY_STATE_APPLIED" {
		t.Fatalf("the claimed job's network policy status: %v", st)
	}
	if res := s.airlock(t, "job", "update", id, "--deny-all"); res.code != 0 || !strings.Contains(res.stdout, "network_policy: applied") {
		t.Fatalf("job update --deny-all: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if r := nextRound(t, watch); r["allowed"] || r["other-port"] || r["host"] {
		t.Fatalf("after narrowing to deny-all the claimed job still reached %v", r)
	}
}
