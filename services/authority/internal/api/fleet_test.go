package api_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// quietDefault takes the harness's first executor out of placement: it
// reports no runtime class.
func (h *harness) quietDefault() {
	h.setReport(h.fleet[0], bigReport(), false)
	eventually(h.t, "the default executor to report no class", func() bool {
		m, ok, err := h.auth.fleet.Lookup(h.t.Context(), executorID.String())
		return err == nil && ok && len(m.Report.Classes) == 0
	})
}

// job reads a job as dev.
func (h *harness) job(id string) *authorityv1.Job {
	h.t.Helper()
	resp, err := h.client(devID).GetJob(h.t.Context(), &authorityv1.GetJobRequest{JobId: id})
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.GetJob()
}

// TestFleetPlacesByClassAndRoom is issue 22 §2 at the authority: a job
// goes to an executor that runs its class and has room, its grant names
// that executor (which alone accepts it), a tenant's jobs spread, a
// drained executor gets nothing new, and a job nothing has room for waits
// saying why, and goes as soon as room appears.
func TestFleetPlacesByClassAndRoom(t *testing.T) {
	h := newHarness(t)
	h.quietDefault()
	e1 := h.addExecutor("e1", bigReport(policy.RuntimeRunc))
	e2 := h.addExecutor("e2", bigReport(policy.RuntimeRunc, policy.RuntimeRunsc))
	dev := h.client(devID)

	// runsc runs only on e2.
	rs := spec()
	rs.RuntimeClass = typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC
	j := h.submit(dev, "runsc", rs).GetJob()
	if j.GetExecutor() != "e2" {
		t.Fatalf("a runsc job was placed on %q, want e2 (e1 runs runc only)", j.GetExecutor())
	}
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	if g := e2.fake.Grants(j.GetJobId()); len(g) != 1 || g[0].GetExecutor() != e2.id.String() {
		t.Fatalf("e2's grants for the job: %v", g)
	}
	if len(e1.fake.Grants(j.GetJobId())) != 0 || e1.fake.Attempts(j.GetJobId()) != 0 {
		t.Fatal("e1 was asked to run a job placed on e2")
	}

	// The tenant's runc jobs spread over both.
	placed := map[string]int{}
	for i := range 6 {
		j := h.submit(dev, "spread-"+string(rune('a'+i)), spec()).GetJob()
		placed[j.GetExecutor()]++
	}
	if placed["e1"] == 0 || placed["e2"] == 0 || placed["default"] != 0 {
		t.Fatalf("runc jobs placed %v, want some on each of e1 and e2, none on the classless default", placed)
	}

	// Drained, e2 gets nothing new; e1 full (no job slot), a job waits,
	// saying why, and runs once e1 has room.
	if _, err := h.client(operatorID).DrainExecutor(t.Context(), &authorityv1.DrainExecutorRequest{Name: "e2", Drain: true, Reason: "kernel upgrade"}); err != nil {
		t.Fatal(err)
	}
	full := bigReport(policy.RuntimeRunc)
	full.Capacity.JobsFree = 0
	h.setReport(e1, full, false)
	eventually(t, "e1 to report no room", func() bool {
		m, _, _ := h.auth.fleet.Lookup(t.Context(), e1.id.String())
		return m.Report.Capacity.JobsFree == 0
	})
	w := h.submit(dev, "waits", spec()).GetJob()
	if w.GetExecutor() != "" {
		t.Fatalf("a job was placed on %q with e1 full and e2 drained", w.GetExecutor())
	}
	eventually(t, "the waiting job to say why", func() bool {
		msg := h.job(w.GetJobId()).GetMessage()
		return strings.Contains(msg, "no executor has room for it yet") && strings.Contains(msg, "1 drained")
	})
	h.setReport(e1, bigReport(policy.RuntimeRunc), false)
	got := h.waitState(dev, w.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	if got.GetExecutor() != "e1" || len(e1.fake.Grants(w.GetJobId())) != 1 {
		t.Fatalf("the waiting job went to %q once e1 had room", got.GetExecutor())
	}
	events := h.auditOf(t, w.GetJobId())
	if !hasEvent(events, audit.KindJobPlaced, "placed on executor e1") {
		t.Errorf("no job.placed entry for the late placement: %v", events)
	}

	// The drain is on the log, as the operator's, once: draining a
	// drained executor changes nothing. A client cannot drain.
	if _, err := h.client(operatorID).DrainExecutor(t.Context(), &authorityv1.DrainExecutorRequest{Name: "e2", Drain: true, Reason: "again"}); err != nil {
		t.Fatal(err)
	}
	if drains := h.audit(t, audit.KindExecutorDrained); len(drains) != 1 || !hasEvent(drains, audit.KindExecutorDrained, "kernel upgrade") || drains[0].GetCaller() != operatorID.String() {
		t.Errorf("the drain on the audit log: %v", drains)
	}
	_, err := dev.DrainExecutor(t.Context(), &authorityv1.DrainExecutorRequest{Name: "e1", Drain: true})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a client draining an executor: %v", err)
	}
	for _, err := range []error{
		func() error {
			_, err := h.client(operatorID).DrainExecutor(t.Context(), &authorityv1.DrainExecutorRequest{Name: "nope", Drain: true})
			return err
		}(),
		func() error {
			_, err := h.client(operatorID).GetExecutor(t.Context(), &authorityv1.GetExecutorRequest{Name: "nope"})
			return err
		}(),
	} {
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `no executor "nope" in the fleet`) {
			t.Errorf("an unknown executor: %v", err)
		}
	}
	resp, err := h.client(operatorID).GetExecutor(t.Context(), &authorityv1.GetExecutorRequest{Name: "e2"})
	if err != nil || !resp.GetExecutor().GetDraining() || resp.GetExecutor().GetPlaced() == 0 || len(resp.GetJobs()) == 0 {
		t.Fatalf("GetExecutor e2: %v, %v", resp, err)
	}
}

// TestFleetExecutorLost is issue 22 §4 at the authority: an executor whose
// heartbeats stop is lost; its running job ends executor_lost (never run
// again), its queued job that was never handed to it runs elsewhere under
// a new grant, on the log; when it comes back it is told to stop the run
// whose job ended.
func TestFleetExecutorLost(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{devQuota: policy.Quota{RunningJobs: 1}})
	h.quietDefault()
	e1 := h.addExecutor("e1", bigReport(policy.RuntimeRunc))
	dev := h.client(devID)

	running := h.submit(dev, "running", spec()).GetJob()
	h.waitState(dev, running.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	// At its quota, the tenant's next job is placed on e1 but waits.
	queued := h.submit(dev, "queued", spec()).GetJob()
	if queued.GetExecutor() != "e1" {
		t.Fatalf("the queued job was placed on %q, want e1", queued.GetExecutor())
	}
	eventually(t, "the queued job to wait for its quota", func() bool {
		return strings.Contains(h.job(queued.GetJobId()).GetMessage(), "quota.running_jobs")
	})
	e2 := h.addExecutor("e2", bigReport(policy.RuntimeRunc))

	h.setReport(e1, bigReport(policy.RuntimeRunc), true) // e1 goes silent
	lost := h.waitState(dev, running.GetJobId(), authorityv1.JobState_JOB_STATE_FAILED)
	if lost.GetResult().GetReason() != typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_LOST || !strings.HasPrefix(lost.GetMessage(), "executor_lost: executor e1") {
		t.Fatalf("the running job ended %v: %q", lost.GetResult().GetReason(), lost.GetMessage())
	}
	moved := h.waitState(dev, queued.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	if moved.GetExecutor() != "e2" {
		t.Fatalf("the queued job runs on %q, want e2", moved.GetExecutor())
	}
	if g := e2.fake.Grants(queued.GetJobId()); len(g) != 1 || g[0].GetExecutor() != e2.id.String() {
		t.Fatalf("e2 got %v for the moved job, want one grant naming e2", g)
	}
	if n := e1.fake.Attempts(queued.GetJobId()); n != 0 {
		t.Fatalf("e1 was handed the queued job %d times", n)
	}
	if !hasEvent(h.auditOf(t, running.GetJobId()), audit.KindJobExecutorLost, "executor e1 stopped answering") {
		t.Error("no job.executor_lost entry")
	}
	if !hasEvent(h.auditOf(t, queued.GetJobId()), audit.KindJobPlaced, "(executor e1 was lost)") {
		t.Errorf("no job.placed entry for the move: %v", h.auditOf(t, queued.GetJobId()))
	}
	if !hasEvent(h.audit(t, audit.KindExecutorLost), audit.KindExecutorLost, "no heartbeat from executor e1") {
		t.Error("no executor.lost entry")
	}

	// e1 comes back still holding the run: it is told to stop it.
	a, err := h.auth.fleet.Heartbeat(t.Context(), e1.id, e1.addr, fleet.Report{Classes: []string{policy.RuntimeRunc},
		Capacity: bigReport().Capacity, Runs: []string{running.GetJobId()}})
	if err != nil || len(a.CancelRuns) != 1 || a.CancelRuns[0] != running.GetJobId() {
		t.Fatalf("e1's return: %+v, %v; want it told to stop %s", a, err, running.GetJobId())
	}
	if !hasEvent(h.audit(t, audit.KindExecutorReturned), audit.KindExecutorReturned, "e1 came back") {
		t.Error("no executor.returned entry")
	}
	// The moved job's result is e2's alone to report.
	if _, err := h.auth.jobs.ReportResult(t.Context(), e1.id, queued.GetJobId(), reportOf()); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("e1 reporting the moved job: %v", err)
	}
}

// TestHeartbeatBounds: a report is checked before it is kept, and an
// executor name is one certificate's.
func TestHeartbeatBounds(t *testing.T) {
	h := newHarness(t)
	e1 := h.addExecutor("e1", bigReport(policy.RuntimeRunc))
	for _, tc := range []struct {
		name    string
		address string
		report  fleet.Report
		says    string
	}{
		{"no address", "", bigReport(), "address: required"},
		{"unknown class", e1.addr, bigReport("kvm"), `report.runtime_classes: unknown class "kvm"`},
		{"too many runs", e1.addr, fleet.Report{Runs: make([]string, 4097)}, "report.runs: 4097 entries, at most 4096"},
		{"huge entry", e1.addr, fleet.Report{Images: []string{strings.Repeat("x", 300)}}, "report.images: an entry of 300 bytes"},
		{"negative capacity", e1.addr, fleet.Report{Capacity: fleet.Capacity{MemoryFree: -1}}, "report.capacity: a negative figure"},
		// More free than it has would buy it every placement.
		{"more free than total", e1.addr, fleet.Report{Capacity: fleet.Capacity{MemoryBytes: 1, MemoryFree: 1 << 50}}, "report.capacity: 1125899906842624 of memory free, more than its total 1"},
		{"unspecified address", "0.0.0.0:7402", bigReport(), "cannot be dialled"},
		{"port 0", "10.0.0.1:0", bigReport(), "port must be 1 to 65535"},
		{"escapes in the host", "evil\x07host:7402", bigReport(), "neither an IP address nor a DNS name"},
		{"long address", strings.Repeat("a", 260) + ":1", bigReport(), "262 bytes, at most 255"},
	} {
		_, err := h.auth.fleet.Heartbeat(t.Context(), e1.id, tc.address, tc.report)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want InvalidArgument saying %q", tc.name, err, tc.says)
		}
	}
	if _, err := h.auth.fleet.Heartbeat(t.Context(), devID, e1.addr, bigReport()); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a client's heartbeat: %v", err)
	}
	// Another trust domain's executor of the same name does not take it.
	if _, err := h.auth.fleet.Heartbeat(t.Context(), mustExecutor(t, "elsewhere.test", "e1"), "10.0.0.1:7402", bigReport()); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a foreign e1's heartbeat: %v", err)
	}
}

// auditOf is a job's audit entries, read as alice (an auditor).
func (h *harness) auditOf(t *testing.T, jobID string) []*authorityv1.AuditEvent {
	t.Helper()
	ev, err := h.client(aliceID).ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{JobId: jobID, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return ev.GetEvents()
}

// audit is every audit entry of kind.
func (h *harness) audit(t *testing.T, kind string) []*authorityv1.AuditEvent {
	t.Helper()
	ev, err := h.client(aliceID).ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Kind: kind, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return ev.GetEvents()
}

// hasEvent says whether events has one of kind whose reason says says.
func hasEvent(events []*authorityv1.AuditEvent, kind, says string) bool {
	for _, e := range events {
		if e.GetKind() == kind && strings.Contains(e.GetReason(), says) {
			return true
		}
	}
	return false
}

// reportOf is a plain result report.
func reportOf() jobs.Report { return jobs.Report{Reason: jobs.ReasonSandboxError, Message: "forged"} }

func mustExecutor(t *testing.T, td, name string) identity.ID {
	t.Helper()
	id, err := identity.Executor(td, name)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestSessionOnLostExecutor: a session whose executor is lost stays, shown
// suspended (executor_lost) rather than ended, and a cancel of it ends it
// at the authority at once.
func TestSessionOnLostExecutor(t *testing.T) {
	h := newHarness(t)
	h.quietDefault()
	e1 := h.addExecutor("e1", bigReport(policy.RuntimeRunc))
	dev := h.client(devID)
	sp := spec()
	sp.Command = nil
	sp.Session = &typesv1.SessionSpec{}
	cs, err := dev.CreateSession(t.Context(), &authorityv1.CreateSessionRequest{Tenant: "dev", Spec: sp, IdempotencyKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	id := cs.GetSession().GetJobId()
	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_RUNNING)
	h.setReport(e1, bigReport(policy.RuntimeRunc), true)
	e1.stop() // gone
	eventually(t, "e1 to be lost", func() bool {
		m, _, _ := h.auth.fleet.Lookup(t.Context(), e1.id.String())
		return m.Lost
	})
	gs, err := dev.GetSession(t.Context(), &authorityv1.GetSessionRequest{SessionId: id})
	if err != nil || gs.GetSession().GetState() != authorityv1.JobState_JOB_STATE_RUNNING || !gs.GetSuspended() ||
		gs.GetSuspendReason() != typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_LOST {
		t.Fatalf("the session on a lost executor: %v, %v", gs, err)
	}
	// Clearing the tenant's caches cannot reach e1: said, not hidden.
	if _, err := dev.ClearCaches(t.Context(), &authorityv1.ClearCachesRequest{Tenant: "dev"}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "executor e1 is lost") {
		t.Errorf("clearing caches with e1 lost: %v", err)
	}
	c, err := dev.CancelSession(t.Context(), &authorityv1.CancelSessionRequest{SessionId: id, Reason: "give up"})
	if err != nil || c.GetSession().GetState() != authorityv1.JobState_JOB_STATE_CANCELLED || !strings.Contains(c.GetSession().GetMessage(), "its executor e1 is lost") {
		t.Fatalf("cancel on a lost executor: %v, %v", c, err)
	}
}
