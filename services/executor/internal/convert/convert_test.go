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

// A run's usage: while it runs, its awake and asleep time so far; once
// ended, its result's, with its network bytes.
func TestRunUsage(t *testing.T) {
	start := time.Now().Add(-10 * time.Second)
	r := runs.Run{JobID: "s", State: runs.Running, StartedAt: start, AsleepTime: 3 * time.Second,
		Suspended: true, SuspendedAt: time.Now().Add(-2 * time.Second), SuspendReason: runs.ReasonIdleTimeout}
	out := Run(r)
	u := out.GetUsage()
	awake, asleep := u.GetAwakeTime().AsDuration(), u.GetAsleepTime().AsDuration()
	if asleep < 5*time.Second || asleep > 6*time.Second || awake < 4*time.Second || awake > 6*time.Second || u.GetWallTime().AsDuration() != awake+asleep {
		t.Fatalf("live usage %v: want about 5s asleep of 10s", u)
	}
	if out.GetSuspendReason() != typesv1.TerminationReason_TERMINATION_REASON_IDLE_TIMEOUT || !out.GetSuspendedAt().AsTime().Equal(r.SuspendedAt) {
		t.Fatalf("an asleep run: %v since %v", out.GetSuspendReason(), out.GetSuspendedAt())
	}
	r.State, r.FinishedAt = runs.Finished, time.Now()
	r.Result = &runs.Result{AwakeTime: time.Second, AsleepTime: 2 * time.Second, NetworkSentBytes: 10, NetworkReceivedBytes: 20}
	out = Run(r)
	if out.GetUsage() != nil {
		t.Fatalf("an ended run's usage is its result's, not a live one: %v", out.GetUsage())
	}
	if u := out.GetResult().GetUsage(); u.GetAwakeTime().AsDuration() != time.Second || u.GetAsleepTime().AsDuration() != 2*time.Second ||
		u.GetNetworkSentBytes() != 10 || u.GetNetworkReceivedBytes() != 20 {
		t.Fatalf("result usage %v", u)
	}
}
