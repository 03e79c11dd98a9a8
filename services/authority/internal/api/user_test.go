package api_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestJobUser: who a job runs as is signed into its grant and shown on the
// job: the spec's user, else the tenant's default (root for a policy
// without user, as before the field; agent for tenant other). A caller
// cannot pick ids outside the sandbox's mapping, root where the tenant's
// policy does not allow it, or a cache in a home its user has not.
func TestJobUser(t *testing.T) {
	h := newHarness(t)
	dev, other := h.client(devID), h.client(otherID)
	for _, tc := range []struct {
		name     string
		c        authorityv1.AuthorityServiceClient
		tenant   string
		user     *typesv1.JobUser
		uid, gid uint32
	}{
		{"dev default is root", dev, "dev", nil, 0, 0},
		{"dev asks for agent", dev, "dev", &typesv1.JobUser{Uid: 1000, Gid: 1000}, 1000, 1000},
		{"dev asks for 2000:3000", dev, "dev", &typesv1.JobUser{Uid: 2000, Gid: 3000}, 2000, 3000},
		{"other default is agent", other, "other", nil, 1000, 1000},
		{"other asks for 1500", other, "other", &typesv1.JobUser{Uid: 1500, Gid: 1500}, 1500, 1500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec()
			if tc.tenant == "other" {
				s.Repository = "tools"
			}
			s.User = tc.user
			resp, err := tc.c.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: tc.tenant, Spec: s, IdempotencyKey: "user-" + tc.name})
			if err != nil {
				t.Fatal(err)
			}
			j := resp.GetJob()
			h.waitState(tc.c, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
			gs := h.fake.Grants(j.GetJobId())
			if len(gs) == 0 || gs[0].GetUser() == nil || gs[0].GetUser().GetUid() != tc.uid || gs[0].GetUser().GetGid() != tc.gid {
				t.Fatalf("grants %v; want user %d:%d", gs, tc.uid, tc.gid)
			}
			got, err := tc.c.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: j.GetJobId()})
			if err != nil {
				t.Fatal(err)
			}
			if u := got.GetJob().GetUser(); u.GetUid() != tc.uid || u.GetGid() != tc.gid || u == nil {
				t.Errorf("job shows user %v; want %d:%d", u, tc.uid, tc.gid)
			}
		})
	}

	for _, tc := range []struct {
		name   string
		c      authorityv1.AuthorityServiceClient
		tenant string
		user   *typesv1.JobUser
		caches []string
		code   codes.Code
		want   []string
	}{
		{"root where not allowed", other, "other", &typesv1.JobUser{}, nil, codes.PermissionDenied,
			[]string{"spec.user", `tenant "other" runs jobs as agent (1000:1000) and does not allow root`}},
		{"uid nobody", dev, "dev", &typesv1.JobUser{Uid: 65534, Gid: 1000}, nil, codes.InvalidArgument, []string{"spec.user", "uid 65534: must be 0 to 65533"}},
		{"uid past the mapping", dev, "dev", &typesv1.JobUser{Uid: 1 << 20}, nil, codes.InvalidArgument, []string{"spec.user", "uid 1048576"}},
		{"gid past the mapping", other, "other", &typesv1.JobUser{Uid: 1000, Gid: 65536}, nil, codes.InvalidArgument, []string{"spec.user", "gid 65536"}},
		{"cache in root's home for agent", dev, "dev", &typesv1.JobUser{Uid: 1000, Gid: 1000}, []string{"go-build"}, codes.InvalidArgument,
			[]string{"spec.caches[0]", `"go-build"`, "lies outside the home of the job's user agent"}},
	} {
		s := spec()
		if tc.tenant == "other" {
			s.Repository = "tools"
		}
		s.User, s.Caches = tc.user, tc.caches
		_, err := tc.c.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: tc.tenant, Spec: s, IdempotencyKey: "bad-user-" + tc.name})
		t.Run(tc.name, func(t *testing.T) { wantStatus(t, err, tc.code, tc.want...) })
	}
}
