package api_test

import (
	"crypto/ed25519"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/airlockhq/airlock/pkg/audit"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestAuditLogIsScopedToAnApproversTenants is issue 9 §3: an approver who
// is not an auditor reads only the entries of the tenants that list it,
// and must say which; the whole log is for the configured auditors.
func TestAuditLogIsScopedToAnApproversTenants(t *testing.T) {
	h := newHarness(t)
	dev, other := h.client(devID), h.client(otherID)
	h.waitState(dev, h.submit(dev, "scoped-dev", spec()).GetJob().GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	otherSpec := spec()
	otherSpec.Repository = "tools"
	if _, err := other.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "other", IdempotencyKey: "scoped-other", Spec: otherSpec}); err != nil {
		t.Fatal(err)
	}

	bob, eve := h.client(bobID), h.client(eveID)
	_, err := bob.ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{})
	wantStatus(t, err, codes.PermissionDenied, "tenant: required", "audit.auditors")
	resp, err := bob.ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Tenant: "dev", PageSize: 1000})
	if err != nil {
		t.Fatalf("bob reading dev's entries: %v", err)
	}
	if len(resp.GetEvents()) == 0 {
		t.Fatal("bob sees none of dev's entries")
	}
	for _, e := range resp.GetEvents() {
		if e.GetTenant() != "dev" {
			t.Errorf("bob, reading dev's entries, got one of tenant %q: %v", e.GetTenant(), e)
		}
	}
	// "other" lists no approvers (any approver decides), so bob may read
	// it; eve is listed nowhere and reads dev's entries no more than
	// a tenant that does not exist.
	if _, err := bob.ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Tenant: "other"}); err != nil {
		t.Errorf("bob reading other's entries: %v", err)
	}
	_, err = eve.ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, `tenant "dev"`, "not one of its approvers")
	_, err = eve.ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Tenant: "nope"})
	wantStatus(t, err, codes.PermissionDenied, `tenant "nope"`, "not one of its approvers")

	// alice, the auditor, reads the whole log, both tenants and the
	// entries of no tenant, and it verifies.
	all := readAudit(t, h.client(aliceID))
	tenants := map[string]bool{}
	for _, e := range all {
		tenants[e.Tenant] = true
	}
	if !tenants["dev"] || !tenants["other"] {
		t.Errorf("the auditor sees tenants %v, want dev and other", tenants)
	}
}

// TestAuditCheckpointsAreServed: the authority signs checkpoints of its
// log's head (here every 3 entries, and at shutdown) and serves them; each
// verifies with the authority's checkpoint key and agrees with the log.
func TestAuditCheckpointsAreServed(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{checkpointEvery: 3, checkpointInterval: time.Hour})
	dev := h.client(devID)
	for _, key := range []string{"cp-1", "cp-2", "cp-3", "cp-4", "cp-5"} {
		h.waitState(dev, h.submit(dev, key, spec()).GetJob().GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	}
	h.restart() // a checkpoint of the head at shutdown
	bob := h.client(bobID)
	var cps []audit.Checkpoint
	req := &authorityv1.ListAuditCheckpointsRequest{PageSize: 2}
	for {
		resp, err := bob.ListAuditCheckpoints(t.Context(), req)
		if err != nil {
			t.Fatalf("an approver reading the checkpoints: %v", err)
		}
		if string(resp.GetPublicKey()) != string(h.cpKey.Public().(ed25519.PublicKey)) || resp.GetHalted() != "" {
			t.Fatalf("key %x halted %q", resp.GetPublicKey(), resp.GetHalted())
		}
		for _, c := range resp.GetCheckpoints() {
			cps = append(cps, audit.Checkpoint{Sequence: c.GetSequence(), Hash: c.GetHash(), Time: c.GetTime().AsTime(),
				KeyID: c.GetKeyId(), PublicKey: c.GetPublicKey(), Signature: c.GetSignature()})
		}
		if !resp.GetMore() {
			break
		}
		req.AfterSequence = resp.GetCheckpoints()[len(resp.GetCheckpoints())-1].GetSequence()
	}
	events := readAudit(t, h.client(aliceID))
	if len(cps) < 2 || cps[len(cps)-1].Sequence != events[len(events)-1].Sequence || cps[0].Sequence != 3 {
		t.Fatalf("%d checkpoints for %d entries (every 3 and at shutdown): %v", len(cps), len(events), cps)
	}
	a, err := audit.NewAnchors(cps, h.cpKey.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if err := a.Entry(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.End(); err != nil || a.Matched() != len(cps) {
		t.Fatalf("matched %d of %d: %v", a.Matched(), len(cps), err)
	}
	_, err = h.client(devID).ListAuditCheckpoints(t.Context(), &authorityv1.ListAuditCheckpointsRequest{})
	wantStatus(t, err, codes.PermissionDenied)
	_, err = bob.ListAuditCheckpoints(t.Context(), &authorityv1.ListAuditCheckpointsRequest{PageSize: 5000})
	wantStatus(t, err, codes.InvalidArgument, "page_size")
}
