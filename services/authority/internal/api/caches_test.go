package api_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestCachesGrantedFromPolicy: a job asking for a cache of its tenant's
// policy gets it in its signed grant, path and max size as the policy
// says; a name the policy lacks is refused naming it, a name twice is
// refused, and another tenant without caches is told it has none.
func TestCachesGrantedFromPolicy(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	s := spec()
	s.Caches = []string{"go-build"}
	j := h.submit(dev, "cached", s).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	gs := h.fake.Grants(j.GetJobId())
	if len(gs) == 0 || len(gs[0].GetCaches()) != 1 {
		t.Fatalf("grant: %v; want one cache", gs)
	}
	if c := gs[0].GetCaches()[0]; c.GetName() != "go-build" || c.GetPath() != "/root/.cache/go-build" || c.GetMaxSizeBytes() != 1<<30 {
		t.Errorf("granted cache %v", c)
	}
	if got := j.GetSpec().GetCaches(); len(got) != 1 || got[0] != "go-build" {
		t.Errorf("the job's spec says caches %v", got)
	}

	for _, tc := range []struct {
		name   string
		tenant string
		caches []string
		code   codes.Code
		want   []string
	}{
		{"unknown name", "dev", []string{"go-build", "npm"}, codes.PermissionDenied, []string{"spec.caches[1]", `"npm" is not a cache of tenant "dev"`, "it has: go-build"}},
		{"twice", "dev", []string{"go-build", "go-build"}, codes.InvalidArgument, []string{"spec.caches[1]", "listed twice"}},
		{"tenant without caches", "other", []string{"go-build"}, codes.PermissionDenied, []string{"spec.caches[0]", `tenant "other" has no caches`}},
		{"too many", "dev", []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}, codes.InvalidArgument, []string{"spec.caches: 9 given, at most 8"}},
	} {
		c, sp := dev, spec()
		if tc.tenant == "other" {
			c, sp = h.client(otherID), &authorityv1.JobSpec{Repository: "tools", Revision: "main", Command: []string{"true"}}
		}
		sp.Caches = tc.caches
		_, err := c.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: tc.tenant, Spec: sp, IdempotencyKey: "k-" + tc.name})
		t.Run(tc.name, func(t *testing.T) { wantStatus(t, err, tc.code, tc.want...) })
	}
}

// TestCacheListAndClear: a tenant's client lists and clears its own
// caches, through the authority to the executor, and the clear is on the
// audit log; another tenant's client can do neither.
func TestCacheListAndClear(t *testing.T) {
	h := newHarness(t)
	dev, other := h.client(devID), h.client(otherID)
	s := spec()
	s.Caches = []string{"go-build"}
	j := h.submit(dev, "cached", s).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	list, err := dev.ListCaches(t.Context(), &authorityv1.ListCachesRequest{Tenant: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	if got := list.GetCaches(); len(got) != 1 || got[0].GetRepository() != "demo" || got[0].GetName() != "go-build" {
		t.Fatalf("list %v", got)
	}
	_, err = other.ListCaches(t.Context(), &authorityv1.ListCachesRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, "does not act for tenant")
	_, err = other.ClearCaches(t.Context(), &authorityv1.ClearCachesRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, "does not act for tenant")
	if l, _ := dev.ListCaches(t.Context(), &authorityv1.ListCachesRequest{Tenant: "dev"}); len(l.GetCaches()) != 1 {
		t.Fatal("another tenant's clear reached dev's caches")
	}
	if l, err := other.ListCaches(t.Context(), &authorityv1.ListCachesRequest{Tenant: "other"}); err != nil || len(l.GetCaches()) != 0 {
		t.Fatalf("other's own list: %v, %v", l.GetCaches(), err)
	}

	cleared, err := dev.ClearCaches(t.Context(), &authorityv1.ClearCachesRequest{Tenant: "dev", Repository: "demo"})
	if err != nil || len(cleared.GetCleared()) != 1 {
		t.Fatalf("clear: %v, %v", cleared, err)
	}
	if l, _ := dev.ListCaches(t.Context(), &authorityv1.ListCachesRequest{Tenant: "dev"}); len(l.GetCaches()) != 0 {
		t.Errorf("after clear: %v", l.GetCaches())
	}
	ev, err := h.client(aliceID).ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Kind: "caches.cleared", PageSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.GetEvents()) != 1 || ev.GetEvents()[0].GetCaller() != devID.String() || !strings.Contains(ev.GetEvents()[0].GetReason(), "the caches of repository demo: 1 cleared") {
		t.Errorf("audit %v", ev.GetEvents())
	}
}
