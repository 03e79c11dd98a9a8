package api_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/audit"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
)

// dollarAMinute prices one vCPU-minute at exactly $1 and nothing else, so
// costs read as whole dollars.
var dollarAMinute = metering.Rates{VCPUMonth: metering.Micros(metering.MonthMinutes) * 1_000_000, ClassCompute: map[string]int64{"vm": 2500}}

// runFor submits a default job (1 vCPU), waits for it to run and reports
// it ended after awake, with some use and network bytes.
func (h *harness) runFor(key string, awake time.Duration) (id, warning string) {
	h.t.Helper()
	dev, executor := h.client(devID), h.client(executorID)
	resp := h.submit(dev, key, spec())
	j := resp.GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	res := exited(digestA)
	res.Usage = &typesv1.ResourceUsage{AwakeTime: durationpb.New(awake), WallTime: durationpb.New(awake), CpuTime: durationpb.New(awake / 2),
		PeakMemoryBytes: 256 << 20, NetworkSentBytes: 1000, NetworkReceivedBytes: 2000}
	if _, err := executor.ReportResult(h.t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: res, Detail: noFiles()}); err != nil {
		h.t.Fatalf("ReportResult: %v", err)
	}
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_FINISHED)
	return j.GetJobId(), resp.GetBudgetWarning()
}

// clearOfMonthEnd waits out the turn of the UTC month if it is less than
// margin away, so that a test reading month-to-date figures runs in one
// month: a few minutes a month at most.
func clearOfMonthEnd(t *testing.T, margin time.Duration) {
	now := time.Now().UTC()
	if next := metering.MonthStart(now).AddDate(0, 1, 0); next.Sub(now) < margin {
		t.Logf("waiting %s for the UTC month to turn", next.Sub(now).Round(time.Second))
		time.Sleep(next.Sub(now) + time.Second)
	}
}

// utcDays is the UTC days from before to after (one, or two across a
// midnight): the day a job run between them is in.
func utcDays(before, after time.Time) []string {
	return slices.Compact([]string{before.UTC().Format(time.DateOnly), after.UTC().Format(time.DateOnly)})
}

func TestGetUsage(t *testing.T) {
	clearOfMonthEnd(t, 2*time.Minute)
	h := newHarnessWith(t, harnessOptions{rates: &dollarAMinute})
	before := time.Now()
	id, _ := h.runFor("u1", 10*time.Minute-time.Second) // 9m59s: ten started minutes
	dev := h.client(devID)

	resp, err := dev.GetUsage(t.Context(), &authorityv1.GetUsageRequest{})
	if err != nil {
		t.Fatalf("GetUsage: %v", err)
	}
	if len(resp.GetRows()) != 1 {
		t.Fatalf("rows %v, want dev's one job", resp.GetRows())
	}
	r := resp.GetRows()[0]
	if r.GetJobId() != id || r.GetTenant() != "dev" || r.GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_RUNC || r.GetRunning() ||
		r.GetAwakeMinutes() != 10 || r.GetVcpuMinutes() != 10 || r.GetMemoryGbMinutes() != 5 || r.GetDiskGbMinutes() != 10 ||
		r.GetCostMicros() != 10_000_000 || r.GetNetworkSentBytes() != 1000 || r.GetNetworkReceivedBytes() != 2000 ||
		r.GetMemoryUsedGbMinutes() != 2.5 || r.GetCpuUsedMinutes() < 4.99 || r.GetCpuUsedMinutes() > 5 {
		t.Fatalf("row = %v", r)
	}
	if resp.GetTotal().GetCostMicros() != 10_000_000 || resp.GetTruncated() {
		t.Fatalf("total %v, truncated %v", resp.GetTotal(), resp.GetTruncated())
	}
	if got := resp.GetRates(); got.GetVcpuMonthMicros() != int64(dollarAMinute.VCPUMonth) || got.GetClassComputeMillis()["vm"] != 2500 {
		t.Fatalf("rates %v", got)
	}
	if b := resp.GetBudgets(); len(b) != 1 || b[0].GetTenant() != "dev" || b[0].GetUsedMicros() != 10_000_000 || b[0].GetMonthlyLimitMicros() != 0 {
		t.Fatalf("budgets %v", b)
	}

	// By day: one row for today, the job's whole.
	day, err := dev.GetUsage(t.Context(), &authorityv1.GetUsageRequest{Tenant: "dev", By: authorityv1.UsageGrouping_USAGE_GROUPING_DAY})
	if err != nil {
		t.Fatal(err)
	}
	if rows := day.GetRows(); len(rows) != 1 || !slices.Contains(utcDays(before, time.Now()), rows[0].GetDay()) || rows[0].GetJobId() != "" ||
		rows[0].GetCostMicros() != 10_000_000 {
		t.Fatalf("by day %v", rows)
	}
	// A window that ends before the job began holds nothing.
	early, err := dev.GetUsage(t.Context(), &authorityv1.GetUsageRequest{Since: timestamppb.New(time.Now().Add(-48 * time.Hour)), Until: timestamppb.New(time.Now().Add(-24 * time.Hour))})
	if err != nil || len(early.GetRows()) != 0 || early.GetTotal().GetCostMicros() != 0 {
		t.Fatalf("an earlier window: %v, %v", early, err)
	}

	// Scoping: an operator reads every tenant; a client its own only;
	// another tenant is refused, naming it.
	ops, err := h.client(operatorID).GetUsage(t.Context(), &authorityv1.GetUsageRequest{})
	if err != nil || len(ops.GetRows()) != 1 || len(ops.GetBudgets()) != 2 {
		t.Fatalf("operator: %v, %v", ops, err)
	}
	mine, err := h.client(otherID).GetUsage(t.Context(), &authorityv1.GetUsageRequest{})
	if err != nil || len(mine.GetRows()) != 0 || len(mine.GetBudgets()) != 1 || mine.GetBudgets()[0].GetTenant() != "other" {
		t.Fatalf("client/other: %v, %v", mine, err)
	}
	_, err = h.client(otherID).GetUsage(t.Context(), &authorityv1.GetUsageRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, `tenant "dev"`)
	_, err = dev.GetUsage(t.Context(), &authorityv1.GetUsageRequest{Tenant: "other"})
	wantStatus(t, err, codes.PermissionDenied, `tenant "other"`)
	_, err = dev.GetUsage(t.Context(), &authorityv1.GetUsageRequest{Tenant: "nope"})
	wantStatus(t, err, codes.PermissionDenied, `tenant "nope"`)
	if _, err := h.client(aliceID).GetUsage(t.Context(), &authorityv1.GetUsageRequest{Tenant: "dev"}); err != nil {
		t.Fatalf("dev's approver: %v", err)
	}
	_, err = h.client(eveID).GetUsage(t.Context(), &authorityv1.GetUsageRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, `tenant "dev"`)

	// Bad requests name their field.
	now := time.Now()
	for _, c := range []struct {
		req  *authorityv1.GetUsageRequest
		want string
	}{
		{&authorityv1.GetUsageRequest{Since: timestamppb.New(now), Until: timestamppb.New(now.Add(-time.Hour))}, "since:"},
		{&authorityv1.GetUsageRequest{Since: &timestamppb.Timestamp{Seconds: 1 << 60}}, "since:"},
		{&authorityv1.GetUsageRequest{Until: &timestamppb.Timestamp{Nanos: -1}}, "until:"},
		{&authorityv1.GetUsageRequest{Limit: 1001}, "limit:"},
		{&authorityv1.GetUsageRequest{Limit: -1}, "limit:"},
		{&authorityv1.GetUsageRequest{By: 7}, "by:"},
	} {
		_, err := dev.GetUsage(t.Context(), c.req)
		wantStatus(t, err, codes.InvalidArgument, c.want)
	}
}

// TestBudget: at 80% of its monthly budget a tenant's submissions carry a
// warning, logged on the audit log once; past it new work is refused,
// sessions too, while a retry of recorded work is still answered.
func TestBudget(t *testing.T) {
	clearOfMonthEnd(t, 2*time.Minute)
	h := newHarnessWith(t, harnessOptions{rates: &dollarAMinute, budgets: map[string]metering.Micros{"dev": 12_000_000}})
	dev := h.client(devID)
	if _, w := h.runFor("ten", 10*time.Minute); w != "" { // $10 of $12
		t.Fatalf("a fresh month warned: %q", w)
	}
	resp := h.submit(dev, "warned", spec())
	if w := resp.GetBudgetWarning(); w != "tenant dev has used $10.00 of its $12.00 monthly budget (83%)" {
		t.Fatalf("warning %q", w)
	}
	h.waitState(dev, resp.GetJob().GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING) // a minute more while it runs
	again := h.submit(dev, "warned-again", spec())
	if w := again.GetBudgetWarning(); w != "tenant dev has used $11.00 of its $12.00 monthly budget (91%)" {
		t.Fatalf("the second submission past 80%%: warning %q", w)
	}
	h.waitState(dev, again.GetJob().GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING) // $12: the whole budget
	events, err := h.client(aliceID).ListAuditEvents(t.Context(), &authorityv1.ListAuditEventsRequest{Tenant: "dev", Kind: audit.KindBudgetWarning, PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(events.GetEvents()); n != 1 || !strings.Contains(events.GetEvents()[0].GetReason(), "of its $12.00 monthly budget") {
		t.Fatalf("budget warnings on the log: %v, want one", events.GetEvents())
	}

	next := metering.MonthStart(time.Now()).AddDate(0, 1, 0).Format(time.DateOnly)
	_, err = dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: spec(), IdempotencyKey: "refused"})
	wantStatus(t, err, codes.ResourceExhausted, fmt.Sprintf("tenant dev has used $12.00 of its $12.00 monthly budget; new jobs are refused until %s", next))
	_, err = dev.CreateSession(t.Context(), &authorityv1.CreateSessionRequest{Tenant: "dev", Spec: &authorityv1.JobSpec{Repository: "demo", Revision: "main"}, IdempotencyKey: "s"})
	wantStatus(t, err, codes.ResourceExhausted, "monthly budget; new jobs are refused until")
	// Work recorded before is answered as before.
	if again := h.submit(dev, "warned", spec()); again.GetCreated() || again.GetJob().GetJobId() != resp.GetJob().GetJobId() {
		t.Fatalf("retry: %v", again)
	}
	// Another tenant has no budget and is not refused.
	if _, err := h.client(otherID).SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "other",
		Spec: &authorityv1.JobSpec{Repository: "tools", Revision: "main", Command: []string{"true"}}, IdempotencyKey: "o"}); err != nil {
		t.Fatalf("tenant other: %v", err)
	}
}

// TestBudgetRefusesResume: resuming a suspended session is new compute,
// refused past the budget as a new job is; the session stays suspended.
// A session's calls while it runs are admitted work (not checked).
func TestBudgetRefusesResume(t *testing.T) {
	clearOfMonthEnd(t, 2*time.Minute)
	h := newHarnessWith(t, harnessOptions{rates: &dollarAMinute, budgets: map[string]metering.Micros{"dev": 10_000_000}})
	dev := h.client(devID)
	sid := h.runningSession("s", nil).GetJobId() // $1 while it runs, a minute started
	if _, err := dev.SuspendSession(t.Context(), &authorityv1.SuspendSessionRequest{SessionId: sid}); err != nil {
		t.Fatal(err)
	}
	h.runFor("ten", 10*time.Minute) // admitted at $1; $11 of $10 after
	_, err := dev.ResumeSession(t.Context(), &authorityv1.ResumeSessionRequest{SessionId: sid})
	wantStatus(t, err, codes.ResourceExhausted, "tenant dev has used $11.00 of its $10.00 monthly budget; new jobs are refused until")
	if s, err := dev.GetSession(t.Context(), &authorityv1.GetSessionRequest{SessionId: sid}); err != nil || !s.GetSuspended() {
		t.Fatalf("the session after a refused resume: %v, %v; want it suspended", s, err)
	}
}
