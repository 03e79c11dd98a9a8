package convert

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

// The run's network policy status is its grant's policy and generation.
func TestNetworkPolicyStatus(t *testing.T) {
	policy := &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{
		Rules: []*typesv1.AllowRule{{Cidr: "192.0.2.0/24", Ports: []uint32{443}}}}}}
	body, err := proto.Marshal(&typesv1.Grant{JobId: "job-1", NetworkPolicy: policy, NetworkPolicyGeneration: 3, Generation: 4})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(&typesv1.SignedGrant{Body: body, Signature: []byte("sig"), KeyId: "k"})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	applied := created.Add(time.Minute)
	r := runs.Run{JobID: "job-1", State: runs.Running, SignedGrant: raw, CreatedAt: created, NetworkUpdatedAt: applied}

	st := Run(r).GetNetworkPolicyStatus()
	if !proto.Equal(st.GetPolicy(), policy) || st.GetGeneration() != 3 ||
		st.GetState() != typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED || !st.GetUpdatedAt().AsTime().Equal(applied) {
		t.Fatalf("status %v, want the grant's policy at generation 3, applied at %s", st, applied)
	}

	r.NetworkUpdatedAt, r.NetworkFailure = time.Time{}, "no veth"
	st = NetworkPolicyStatus(r)
	if st.GetState() != typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED || st.GetMessage() != "no veth" || !st.GetUpdatedAt().AsTime().Equal(created) {
		t.Fatalf("status %v, want failed with its reason", st)
	}
}
