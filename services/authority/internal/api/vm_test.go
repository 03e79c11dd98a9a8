package api_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// TestVMWithDocker is issue 23 at the authority: a tenant whose policy
// allows the vm class submits a job and creates a session in it with
// docker; each is placed only on an executor that reports the class, its
// grant says the class and carries the request, and the spec keeps it.
// A session's docker request is checked as a job's is.
func TestVMWithDocker(t *testing.T) {
	h := newHarness(t)
	h.quietDefault()
	runc, vm := h.addExecutor("runc-only", bigReport(policy.RuntimeRunc)), h.addExecutor("vmhost", bigReport(policy.RuntimeRunc, policy.RuntimeVM))
	dev := h.client(devID)

	s := spec()
	s.RuntimeClass, s.With, s.Resources = typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"docker"}, &typesv1.ResourceLimits{MemoryBytes: 1 << 30}
	j := h.submit(dev, "vm-docker", s).GetJob()
	if j.GetExecutor() != "vmhost" {
		t.Fatalf("a vm job was placed on %q, want vmhost (the only executor that runs vm)", j.GetExecutor())
	}
	if !slices.Equal(j.GetSpec().GetWith(), []string{"docker"}) {
		t.Errorf("the job's spec.with = %q, want [docker]", j.GetSpec().GetWith())
	}
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	g := vm.fake.Grants(j.GetJobId())
	if len(g) != 1 || g[0].GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_VM || !slices.Equal(g[0].GetWith(), []string{"docker"}) {
		t.Fatalf("vmhost's grants for the job: %v, want one of class vm with docker", g)
	}
	if runc.fake.Attempts(j.GetJobId()) != 0 {
		t.Fatal("an executor without the vm class was asked to run a vm job")
	}

	sp := sessionSpec(&typesv1.SessionSpec{})
	sp.RuntimeClass, sp.With = typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"docker"}
	_, err := dev.CreateSession(t.Context(), &authorityv1.CreateSessionRequest{Tenant: "dev", Spec: sp, IdempotencyKey: "vm-small"})
	wantStatus(t, err, codes.InvalidArgument, "spec.resources.memory_bytes", "with docker")
	sp.Resources = &typesv1.ResourceLimits{MemoryBytes: 2 << 30}
	cs, err := dev.CreateSession(t.Context(), &authorityv1.CreateSessionRequest{Tenant: "dev", Spec: sp, IdempotencyKey: "vm-session"})
	if err != nil {
		t.Fatalf("CreateSession of class vm with docker: %v", err)
	}
	id := cs.GetSession().GetJobId()
	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_RUNNING)
	if g := vm.fake.Grants(id); len(g) != 1 || g[0].GetSession() == nil || !slices.Equal(g[0].GetWith(), []string{"docker"}) {
		t.Fatalf("vmhost's grants for the session: %v, want one session grant with docker", g)
	}

	// An emulated VM's runtime version reaches the job's record as the
	// executor reported it.
	res := exited(digestA)
	res.RuntimeClass, res.RuntimeVersion = typesv1.RuntimeClass_RUNTIME_CLASS_VM, "airlock-vm dev; accel tcg (emulated); sha256:00"
	if _, err := h.client(vm.id).ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: res,
		Detail: noFiles(), Provenance: []byte(`{"payloadType":"application/vnd.in-toto+json"}`)}); err != nil {
		t.Fatalf("ReportResult: %v", err)
	}
	got := h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_FINISHED)
	if !proto.Equal(got.GetResult(), res) || !strings.Contains(got.GetResult().GetRuntimeVersion(), "accel tcg (emulated)") {
		t.Errorf("the finished vm job's result = %v, want %v", got.GetResult(), res)
	}
}
