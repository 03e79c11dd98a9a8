package api_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
)

// readAudit pages through the whole audit log as the CLI's audit verify
// does, and checks the chain.
func readAudit(t *testing.T, c authorityv1.AuthorityServiceClient) []audit.Event {
	t.Helper()
	var events []audit.Event
	req := &authorityv1.ListAuditEventsRequest{PageSize: 1000}
	for {
		resp, err := c.ListAuditEvents(t.Context(), req)
		if err != nil {
			t.Fatalf("ListAuditEvents after %d events: %v", len(events), err)
		}
		if n := proto.Size(resp); n > 4<<20 {
			t.Fatalf("an audit page of %d bytes", n)
		}
		for _, e := range resp.GetEvents() {
			events = append(events, audit.Event{Sequence: e.GetSequence(), Time: e.GetTime().AsTime(), Kind: e.GetKind(), Caller: e.GetCaller(),
				Subject: e.GetSubject(), Tenant: e.GetTenant(), JobID: e.GetJobId(), Outcome: outcomeWord(e.GetOutcome()), Reason: e.GetReason(),
				PrevHash: e.GetPreviousHash(), Hash: e.GetHash()})
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	if i, err := audit.Verify(events); err != nil {
		t.Fatalf("audit chain of %d events breaks at %d: %v", len(events), i, err)
	}
	return events
}

func outcomeWord(o authorityv1.AuditOutcome) string {
	return strings.ToLower(strings.TrimPrefix(o.String(), "AUDIT_OUTCOME_"))
}

// TestCallerCannotBreakSharedViews is issue 9's attack from the caller's
// side: a 3 MB tenant name, many 128 KiB commands and jobs with large
// environments. Each oversized field is refused naming it, nothing audited
// grows with what was sent, the audit log still pages and verifies, and
// the tenant's jobs still list, page by page.
func TestCallerCannotBreakSharedViews(t *testing.T) {
	h := newHarness(t)
	dev, alice := h.client(devID), h.client(aliceID)
	_, err := dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: strings.Repeat("t", 3<<20), Spec: spec(), IdempotencyKey: "big-tenant"})
	wantStatus(t, err, codes.InvalidArgument, "tenant: at most 256 bytes")
	big := spec()
	big.Repository = strings.Repeat("r", 100<<10)
	_, err = dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: big, IdempotencyKey: "big-repo"})
	wantStatus(t, err, codes.InvalidArgument, "spec.repository: at most 256 bytes")
	huge := spec()
	huge.Env = map[string]string{}
	for i := range 20 {
		huge.Env[fmt.Sprintf("V%d", i)] = strings.Repeat("x", 30<<10)
	}
	_, err = dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: huge, IdempotencyKey: "huge-env"})
	wantStatus(t, err, codes.InvalidArgument, "spec.env: at most 256KiB")

	for i := range 30 {
		s := spec()
		s.Command = []string{"sh", "-c", strings.Repeat("x", 128<<10-10)}
		s.Env = map[string]string{}
		for k := range 8 {
			s.Env[fmt.Sprintf("V%d", k)] = strings.Repeat("y", 30<<10)
		}
		h.submit(dev, fmt.Sprintf("big-%d", i), s)
	}
	events := readAudit(t, alice)
	for _, e := range events {
		if n := len(e.Subject) + len(e.Reason) + len(e.Tenant); n > 12<<10 {
			t.Fatalf("event %d (%s) holds %d bytes of caller text", e.Sequence, e.Kind, n)
		}
	}
	var cut int
	for _, e := range events {
		if strings.Contains(e.Reason+e.Tenant+e.Subject, "…[cut: ") {
			cut++
		}
	}
	if cut < 31 {
		t.Errorf("%d events say they were cut, want the refusal and every job.granted", cut)
	}

	// 30 jobs of about 500 KiB each: more than one message holds.
	var listed int
	req := &authorityv1.ListJobsRequest{Tenant: "dev", PageSize: 500}
	pages := 0
	for {
		resp, err := dev.ListJobs(t.Context(), req)
		if err != nil {
			t.Fatalf("ListJobs page %d: %v", pages+1, err)
		}
		pages++
		if n := proto.Size(resp); n > 4<<20 {
			t.Errorf("a job page of %d bytes", n)
		}
		listed += len(resp.GetJobs())
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	if listed != 30 || pages < 2 {
		t.Errorf("listed %d jobs in %d pages, want 30 in several", listed, pages)
	}
}

// TestRepeatedRefusalsDoNotFillTheLog: one caller repeating one refused
// request is one entry, not hundreds; another refusal still shows.
func TestRepeatedRefusalsDoNotFillTheLog(t *testing.T) {
	h := newHarness(t)
	dev, alice := h.client(devID), h.client(aliceID)
	bad := spec()
	bad.Repository = "not-ours"
	for i := range 200 {
		_, err := dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: bad, IdempotencyKey: fmt.Sprintf("r%d", i)})
		wantStatus(t, err, codes.PermissionDenied, "spec.repository")
	}
	other := spec()
	other.Repository = "also-not-ours"
	if _, err := dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: other, IdempotencyKey: "other"}); err == nil {
		t.Fatal("a foreign repository was accepted")
	}
	refused := 0
	for _, e := range readAudit(t, alice) {
		if e.Kind == "job.refused" {
			refused++
		}
	}
	if refused != 2 {
		t.Errorf("%d job.refused entries for 200 identical refusals and one other, want 2", refused)
	}
}

// TestQueuedJobOutlivesItsGrant is issue 9 §4: with the executor out of
// reach for longer than a grant lives, a queued job is granted again (the
// same decision, on the log) and runs once the executor is back; only past
// its start deadline does it fail, saying why.
func TestQueuedJobOutlivesItsGrant(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{grantTTL: 300 * time.Millisecond, startDeadline: 4 * time.Second})
	dev, alice := h.client(devID), h.client(aliceID)
	h.fake.FailStarts(status.Error(codes.Unavailable, "executor down (fake)"))
	j := h.submit(dev, "outage", spec()).GetJob()
	time.Sleep(1500 * time.Millisecond)
	if got := h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_QUEUED); got.GetState() != authorityv1.JobState_JOB_STATE_QUEUED {
		t.Fatalf("after its first grant expired the job is %v", got.GetState())
	}
	h.fake.FailStarts(nil)
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	grants := h.fake.Grants(j.GetJobId())
	if len(grants) != 1 {
		t.Fatalf("the executor accepted %d grants, want 1", len(grants))
	}
	// The first grant expired 300 ms after submission; the one accepted
	// was signed later, for the same job and limits.
	g := grants[0]
	if !g.GetIssuedAt().AsTime().After(j.GetCreatedAt().AsTime().Add(300*time.Millisecond)) || g.GetJobId() != j.GetJobId() ||
		g.GetLimits().GetMemoryBytes() != h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING).GetLimits().GetMemoryBytes() {
		t.Errorf("accepted grant %v: want a fresh grant of the same decision", g)
	}
	regranted := 0
	for _, e := range readAudit(t, alice) {
		if e.Kind == "job.regranted" && e.Subject == j.GetJobId() {
			regranted++
		}
	}
	if regranted == 0 {
		t.Error("no job.regranted on the log")
	}

	// Past the start deadline: failed, saying so.
	h.fake.FailStarts(status.Error(codes.Unavailable, "executor down (fake)"))
	j2 := h.submit(dev, "outage-2", spec()).GetJob()
	got := h.waitState(dev, j2.GetJobId(), authorityv1.JobState_JOB_STATE_FAILED)
	if !strings.Contains(got.GetMessage(), "start deadline") {
		t.Errorf("failed with %q, want the start deadline named", got.GetMessage())
	}
}

// TestChangeTheExecutorWouldRefuseIsRefused: a change to limits no runtime
// can start under is refused at the authority, naming the field, and opens
// no approval that could never apply.
func TestChangeTheExecutorWouldRefuseIsRefused(t *testing.T) {
	h := newHarness(t)
	dev, alice := h.client(devID), h.client(aliceID)
	j := h.submit(dev, "change-small", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	_, err := dev.UpdateJobLimits(t.Context(), &authorityv1.UpdateJobLimitsRequest{JobId: j.GetJobId(), Limits: &typesv1.ResourceLimits{MemoryBytes: 1}})
	wantStatus(t, err, codes.InvalidArgument, "limits.memory_bytes: 1: must be at least")
	_, err = dev.UpdateNetworkPolicy(t.Context(), &authorityv1.UpdateNetworkPolicyRequest{JobId: j.GetJobId(), Policy: &typesv1.NetworkPolicy{
		Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{Rules: []*typesv1.AllowRule{{Cidr: "::ffff:169.254.169.254/128"}}}}}})
	wantStatus(t, err, codes.InvalidArgument, "IPv4-mapped")
	if l, err := alice.ListApprovals(t.Context(), &authorityv1.ListApprovalsRequest{}); err != nil || len(l.GetApprovals()) != 0 {
		t.Errorf("approvals after refused changes: %v, %v; want none", l.GetApprovals(), err)
	}
}

// rawCodec sends bytes as they are: what no proto library would encode.
type rawCodec struct{}

func (rawCodec) Name() string                  { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

// TestInvalidUTF8NamesTheField: a submit whose nested string is not UTF-8
// is InvalidArgument naming the field, not Internal.
func TestInvalidUTF8NamesTheField(t *testing.T) {
	h := newHarness(t)
	s := spec()
	s.Repository = "demoXX"
	req, err := proto.Marshal(&authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: "utf8", Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	req = bytes.Replace(req, []byte("demoXX"), []byte("demo\xff\xfe"), 1)
	conn, err := grpcclient.Dial(h.auth.addr, h.source(devID), authorityID)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var resp []byte
	err = conn.Invoke(t.Context(), authorityv1.AuthorityService_SubmitJob_FullMethodName, &req, &resp, grpc.ForceCodec(rawCodec{}))
	wantStatus(t, err, codes.InvalidArgument, "spec.repository: not valid UTF-8")
}

// TestRegrantRechecksThePolicy: a queued job whose grant expired is granted
// again only if the tenant's policy in force still allows it. Here the
// authority restarts with a lower memory ceiling while the executor is
// down: the job fails, saying why, instead of being signed again.
func TestRegrantRechecksThePolicy(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{grantTTL: 300 * time.Millisecond, startDeadline: time.Minute})
	dev := h.client(devID)
	h.fake.FailStarts(status.Error(codes.Unavailable, "executor down (fake)"))
	s := spec()
	s.Resources = &typesv1.ResourceLimits{MemoryBytes: 1 << 30}
	j := h.submit(dev, "recheck", s).GetJob()
	h.auth.stop()
	h.tenants["dev"].Max.MemoryBytes = 512 << 20
	h.start()
	got := h.waitState(h.client(devID), j.GetJobId(), authorityv1.JobState_JOB_STATE_FAILED)
	if !strings.Contains(got.GetMessage(), "no longer allows it") || !strings.Contains(got.GetMessage(), "limits.memory_bytes") {
		t.Errorf("failed with %q, want the policy change named", got.GetMessage())
	}
	if n := len(h.fake.Grants(j.GetJobId())); n != 0 {
		t.Errorf("the executor accepted %d grants", n)
	}
}

// discard is a SourceWriter that keeps nothing.
type discard struct{}

func (discard) Header(string, string, []byte, int) error { return nil }
func (discard) Write(p []byte) (int, error)              { return len(p), nil }
func (d discard) History(int, int) (io.Writer, error)    { return d, nil }

// TestOnlyTheExecutorDispatchedToReports is issue 9 §3 and issue 22 §2:
// each job is bound to the executor it is placed on, and only that
// identity fetches the job's source or reports its result — not another
// executor of the same fleet, nor one of another trust domain.
func TestOnlyTheExecutorDispatchedToReports(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	j := h.submit(dev, "bound", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	for _, other := range []identity.ID{
		identity.MustParse("spiffe://airlock.test/service/executor/exec-2"),
		identity.MustParse("spiffe://elsewhere.test/service/executor"),
	} {
		err := h.auth.jobs.FetchSource(t.Context(), other, j.GetJobId(), discard{})
		if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "is placed on spiffe://airlock.test/service/executor, not on "+other.String()) {
			t.Fatalf("executor %s fetching the source: %v", other, err)
		}
		_, err = h.auth.jobs.ReportResult(t.Context(), other, j.GetJobId(), jobs.Report{Reason: jobs.ReasonSandboxError, Message: "forged"})
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("executor %s reporting a result: %v", other, err)
		}
	}
	if got := h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING); got.GetState() != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("the job is %v after a refused report", got.GetState())
	}
	// The executor it was dispatched to still may.
	if err := h.auth.jobs.FetchSource(t.Context(), executorID, j.GetJobId(), discard{}); err != nil {
		t.Fatalf("the executor dispatched to fetching the source: %v", err)
	}
}
