// Package approvals owns the authority's approval requests and credential
// leases: opening a request when a job with a publish target finishes,
// who may see and decide it, the single-use consumption by the publisher,
// and the short deploy-credential leases that follow, sealed to the
// caller's certificate. Every decision and every refusal goes to the audit
// log. It imports no gRPC; the authority's api and composition root import
// it.
package approvals

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/pkg/seal"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Lease durations: what a request without a TTL gets, and the most any
// lease gets, counted also from the consumption of the job's approval.
const (
	DefaultLeaseTTL = 5 * time.Minute
	MaxLeaseTTL     = 15 * time.Minute
)

// Bounds on what callers send: a vote's comment or a revocation's reason
// is stored, shown to every approver and audited.
const (
	MaxCommentBytes = 4096
	maxIDBytes      = 128
)

// Lease purposes: PurposeDeploy pushes one reviewed commit; PurposeRead
// fetches the target branch to prepare it, before the approval is spent.
const (
	PurposeDeploy = "deploy"
	PurposeRead   = "read"
)

// Audit outcomes as the log stores them.
const (
	outcomeAllowed = "allowed"
	outcomeDenied  = "denied"
)

// Config configures a Service.
type Config struct {
	Store   store.Store
	Tenants policy.Tenants
	// Artifacts opens result bundles for ReadReview; without it ReadReview
	// is refused.
	Artifacts Artifacts
	Logger    *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// ReadFile reads a deploy credential file; default os.ReadFile.
	ReadFile func(string) ([]byte, error)
	// Refusals throttles repeated refusals on the log; default a
	// throttle of its own (audit.NewRefusalThrottle). Whoever owns it runs
	// its Flush.
	Refusals *audit.Throttle
	// Meter makes the approval metrics (metrics.go); nil is the global
	// meter provider.
	Meter metric.MeterProvider
}

// Service is the approval and lease logic; safe for concurrent use.
type Service struct {
	cfg Config
	// refusals keeps one caller's repeated refusal from filling the log.
	refusals *audit.Throttle
	metrics  *metrics
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("approvals: store is required")
	}
	if cfg.Tenants == nil {
		cfg.Tenants = policy.Tenants{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ReadFile == nil {
		cfg.ReadFile = os.ReadFile
	}
	if cfg.Refusals == nil {
		cfg.Refusals = audit.NewRefusalThrottle()
	}
	m, err := newMetrics(cfg.Meter)
	if err != nil {
		return nil, fmt.Errorf("approvals: metrics: %w", err)
	}
	return &Service{cfg: cfg, refusals: cfg.Refusals, metrics: m}, nil
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// newID returns a random id (pkg/ids).
func newID() string { return ids.New() }

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

func denied(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrPermissionDenied, fmt.Sprintf(format, args...))
}

func precondition(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, fmt.Sprintf(format, args...))
}

// refusable reports whether err is a refusal of the caller's request (to
// be audited as denied) rather than an internal failure.
func refusable(err error) bool {
	for _, e := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
		errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// refused records a refused decision and returns err. If the log cannot be
// written the refusal still stands; the failure is logged.
func (s *Service) refused(ctx context.Context, e audit.Event, err error) error {
	if !refusable(err) {
		return err
	}
	e.Outcome, e.Reason, e.Time = outcomeDenied, err.Error(), s.now()
	e, ok := s.refusals.Admit(e, e.Time)
	if !ok {
		return err // the same refusal was logged within the window; the next says how many
	}
	if _, aerr := s.cfg.Store.AppendAudit(ctx, e); aerr != nil {
		s.cfg.Logger.ErrorContext(ctx, "audit a refusal", "kind", e.Kind, "error", aerr)
	}
	return err
}

// Target is a publish target.
type Target struct{ Repo, Branch string }

// Effective returns a's state as callers see it: a pending or approved
// request past its expiry is expired.
func Effective(a store.Approval, now time.Time) store.ApprovalState {
	if (a.State == store.ApprovalPending || a.State == store.ApprovalApproved) && !now.Before(a.ExpiresAt) {
		return store.ApprovalExpired
	}
	return a.State
}

// Open opens the approval request for job j's result, bound to its bundle
// digest and target, unless the job already has one (then it returns that
// one): calling it again after a retried report is safe. A job that did
// not finish, has no bundle digest or no target gets none, and Open
// returns created=false with a zero approval.
func (s *Service) Open(ctx context.Context, caller identity.ID, j store.Job, t Target) (store.Approval, bool, error) {
	if j.State != store.StateFinished || j.BundleDigest == "" || t.Repo == "" {
		return store.Approval{}, false, nil
	}
	tenant := s.cfg.Tenants[j.Tenant]
	if tenant == nil {
		return store.Approval{}, false, fmt.Errorf("approvals: job %q belongs to unknown tenant %q", j.ID, j.Tenant)
	}
	now := s.now()
	a := store.Approval{
		ID: newID(), JobID: j.ID, Tenant: j.Tenant, Requester: j.Requester, BundleDigest: j.BundleDigest,
		TargetRepo: t.Repo, TargetBranch: t.Branch, State: store.ApprovalPending,
		Required: max(tenant.Approvals.Required, 1), CreatedAt: now, ExpiresAt: now.Add(orDefault(tenant.Approvals.TTL, policy.DefaultApprovalTTL)),
	}
	stored, created, err := s.cfg.Store.CreateApprovalAudited(ctx, a, audit.Event{
		Time: now, Kind: audit.KindApprovalOpened, Caller: caller.String(), Subject: a.ID, Outcome: outcomeAllowed,
		Reason: fmt.Sprintf("bundle %s to %s:%s, %d approval(s) needed by %s", a.BundleDigest, a.TargetRepo, a.TargetBranch, a.Required, a.ExpiresAt.Format(time.RFC3339)),
	})
	if err != nil {
		return store.Approval{}, false, fmt.Errorf("approvals: open for job %q: %w", j.ID, err)
	}
	return stored, created, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// ListRequest selects approval requests.
type ListRequest struct {
	Tenant    string
	States    []store.ApprovalState
	PageSize  int
	PageToken string
}

func pageSize(n int) (int, error) {
	switch {
	case n == 0:
		return 50, nil
	case n < 0 || n > 500:
		return 0, invalid("page_size", "%d is not between 1 and 500", n)
	}
	return n, nil
}

// List returns a page of approval requests, newest first. Approvers see
// the tenants that list them; a client must name a tenant it acts for. A state filter
// applies to the state callers see (expired included), so a page may hold
// fewer requests than asked even when more follow.
func (s *Service) List(ctx context.Context, caller identity.ID, req ListRequest) ([]store.Approval, string, error) {
	size, err := pageSize(req.PageSize)
	if err != nil {
		return nil, "", err
	}
	switch caller.Kind {
	case identity.KindApprover:
		if req.Tenant != "" && !s.approverOf(caller, req.Tenant) {
			return nil, "", denied("tenant: %s is not an approver of tenant %q", caller.Principal(), req.Tenant)
		}
	case identity.KindClient:
		if req.Tenant == "" {
			return nil, "", invalid("tenant", "required for a client")
		}
		if t := s.cfg.Tenants[req.Tenant]; t == nil || !t.HasClient(caller.Principal()) {
			return nil, "", denied("tenant: %s does not act for tenant %q", caller.Principal(), req.Tenant)
		}
	default:
		return nil, "", denied("%s may not list approvals", caller.Principal())
	}
	want := map[store.ApprovalState]bool{}
	var stored []store.ApprovalState
	for _, st := range req.States {
		want[st] = true
		if st == store.ApprovalExpired {
			stored = append(stored, store.ApprovalPending, store.ApprovalApproved)
		} else {
			stored = append(stored, st)
		}
	}
	list, next, err := s.cfg.Store.ListApprovals(ctx, store.ApprovalFilter{Tenant: req.Tenant, States: stored, Limit: size, PageToken: req.PageToken})
	if err != nil {
		return nil, "", err
	}
	now := s.now()
	out := list[:0]
	for _, a := range list {
		// An approver sees only the tenants it approves for.
		if caller.Kind == identity.KindApprover && !s.approverOf(caller, a.Tenant) {
			continue
		}
		if len(want) == 0 || want[Effective(a, now)] {
			out = append(out, a)
		}
	}
	return out, next, nil
}

// approverOf reports whether approver caller may see and decide tenant's
// requests: the tenant lists it (or lists no approvers at all).
func (s *Service) approverOf(caller identity.ID, tenant string) bool {
	t := s.cfg.Tenants[tenant]
	return t != nil && caller.Kind == identity.KindApprover && t.Approvals.AllowsApprover(caller.Principal())
}

// Get returns one approval request and its job (whose record holds the
// review material). A client sees only its tenant's, an approver only the
// tenants that list it; any other request, existing or not, is NotFound.
func (s *Service) Get(ctx context.Context, caller identity.ID, id string) (store.Approval, store.Job, error) {
	if id == "" {
		return store.Approval{}, store.Job{}, invalid("approval_id", "required")
	}
	a, err := s.cfg.Store.GetApproval(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Approval{}, store.Job{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return store.Approval{}, store.Job{}, err
	}
	switch caller.Kind {
	case identity.KindApprover:
		if !s.approverOf(caller, a.Tenant) {
			return store.Approval{}, store.Job{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, id)
		}
	case identity.KindClient:
		if t := s.cfg.Tenants[a.Tenant]; t == nil || !t.HasClient(caller.Principal()) {
			return store.Approval{}, store.Job{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, id)
		}
	default:
		return store.Approval{}, store.Job{}, denied("%s may not read approvals", caller.Principal())
	}
	j, err := s.cfg.Store.GetJob(ctx, a.JobID)
	if err != nil {
		return store.Approval{}, store.Job{}, err
	}
	return a, j, nil
}

// DecideRequest is one approver's decision.
type DecideRequest struct {
	ID           string
	BundleDigest string
	// Decision is store.DecisionApprove or store.DecisionDeny.
	Decision string
	Comment  string
}

// Decide records caller's decision. Refused: anyone but an approver (the
// services included); the job's requester under any kind (client/dev and
// approver/dev are one person); an approver the tenant does not list; an
// expired or already decided request; a digest other than the request's;
// a second vote by the same approver; a deny without a comment. Reaching
// the required count approves; one deny denies.
func (s *Service) Decide(ctx context.Context, caller identity.ID, req DecideRequest) (store.Approval, error) {
	ev := audit.Event{Kind: audit.KindApprovalDecided, Caller: caller.String(), Subject: req.ID}
	if err := s.checkDecide(caller, req); err != nil {
		return store.Approval{}, s.refused(ctx, ev, err)
	}
	now := s.now()
	a, err := s.cfg.Store.DecideApprovalAudited(ctx, req.ID, func(a *store.Approval) (store.Vote, audit.Event, error) {
		ev.Tenant, ev.JobID = a.Tenant, a.JobID
		if err := s.mayDecide(caller, *a, req, now); err != nil {
			return store.Vote{}, audit.Event{}, err
		}
		approvals := 0
		for _, v := range a.Votes {
			if v.Decision == store.DecisionApprove {
				approvals++
			}
		}
		switch req.Decision {
		case store.DecisionDeny:
			a.State = store.ApprovalDenied
		default:
			if approvals+1 >= a.Required {
				a.State = store.ApprovalApproved
			}
		}
		e := ev
		e.Time, e.Outcome = now, outcomeAllowed
		e.Reason = fmt.Sprintf("%s (%d of %d approvals), now %s", req.Decision, approvals+boolInt(req.Decision == store.DecisionApprove), a.Required, a.State)
		if req.Comment != "" {
			e.Reason += ": " + req.Comment
		}
		return store.Vote{Approver: caller.String(), Decision: req.Decision, Comment: req.Comment, DecidedAt: now}, e, nil
	})
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, req.ID)
		}
		return store.Approval{}, s.refused(ctx, ev, err)
	}
	s.metrics.voted(a, req.Decision)
	return a, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkDecide checks what needs no stored record.
func (s *Service) checkDecide(caller identity.ID, req DecideRequest) error {
	if caller.Kind != identity.KindApprover {
		return denied("%s is not an approver; only approver identities decide", caller.Principal())
	}
	switch {
	case req.ID == "":
		return invalid("approval_id", "required")
	case req.BundleDigest == "":
		return invalid("bundle_digest", "required: the digest you reviewed")
	case req.Decision != store.DecisionApprove && req.Decision != store.DecisionDeny:
		return invalid("decision", "required: approve or deny")
	case req.Decision == store.DecisionDeny && req.Comment == "":
		return invalid("comment", "required when denying")
	case len(req.Comment) > MaxCommentBytes:
		return invalid("comment", "at most %d bytes", MaxCommentBytes)
	case len(req.ID) > maxIDBytes:
		return invalid("approval_id", "at most %d bytes", maxIDBytes)
	}
	return nil
}

// mayDecide checks caller's decision against the stored request, under its
// row lock.
func (s *Service) mayDecide(caller identity.ID, a store.Approval, req DecideRequest, now time.Time) error {
	// First, and as Get answers: an approver of other tenants learns
	// nothing of this request, not even that it exists.
	if !s.approverOf(caller, a.Tenant) {
		return fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, a.ID)
	}
	if r, err := identity.Parse(a.Requester); err != nil || r.Name == caller.Name {
		return denied("%s requested job %q (as %s) and may not decide its approval", caller.Name, a.JobID, a.Requester)
	}
	for _, v := range a.Votes {
		if v.Approver == caller.String() {
			return fmt.Errorf("%w: %s has already decided approval %q (%s)", errdefs.ErrAlreadyExists, caller.Principal(), a.ID, v.Decision)
		}
	}
	if st := Effective(a, now); st != store.ApprovalPending {
		return precondition("approval %q is %s, not pending", a.ID, st)
	}
	if req.BundleDigest != a.BundleDigest {
		return precondition("bundle_digest: %s is not the request's %s", req.BundleDigest, a.BundleDigest)
	}
	return nil
}

// ConsumeRequest is what the publisher is about to publish.
type ConsumeRequest struct {
	ID, JobID, BundleDigest string
	Target                  Target
}

func isPublisher(id identity.ID) bool {
	return id.Kind == identity.KindService && id.Name == identity.ServicePublisher
}

// Consume turns an approved request into consumed, once, for exactly its
// job, digest and target; anything else fails naming what differs.
func (s *Service) Consume(ctx context.Context, caller identity.ID, req ConsumeRequest) (store.Approval, error) {
	ev := audit.Event{Kind: audit.KindApprovalConsumed, Caller: caller.String(), Subject: req.ID, JobID: req.JobID}
	a, err := s.checkConsume(ctx, caller, req, &ev)
	if err != nil {
		return store.Approval{}, s.refused(ctx, ev, err)
	}
	now := s.now()
	e := ev
	e.Time, e.Outcome = now, outcomeAllowed
	e.Reason = fmt.Sprintf("bundle %s to %s:%s", a.BundleDigest, a.TargetRepo, a.TargetBranch)
	out, err := s.cfg.Store.ConsumeApprovalAudited(ctx, store.ConsumeRequest{
		ID: req.ID, JobID: req.JobID, BundleDigest: req.BundleDigest, TargetRepo: req.Target.Repo, TargetBranch: req.Target.Branch,
		By: caller.String(), At: now,
	}, e)
	if err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			err = precondition("approval %q was consumed, or changed, concurrently", req.ID)
		}
		return store.Approval{}, s.refused(ctx, ev, err)
	}
	return out, nil
}

func (s *Service) checkConsume(ctx context.Context, caller identity.ID, req ConsumeRequest, ev *audit.Event) (store.Approval, error) {
	if !isPublisher(caller) {
		return store.Approval{}, denied("only the publisher consumes approvals")
	}
	switch {
	case req.ID == "":
		return store.Approval{}, invalid("approval_id", "required")
	case req.JobID == "":
		return store.Approval{}, invalid("job_id", "required")
	case req.BundleDigest == "":
		return store.Approval{}, invalid("bundle_digest", "required")
	case req.Target.Repo == "" || req.Target.Branch == "":
		return store.Approval{}, invalid("target", "repository and branch are required")
	}
	a, err := s.cfg.Store.GetApproval(ctx, req.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Approval{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, req.ID)
	}
	if err != nil {
		return store.Approval{}, err
	}
	ev.Tenant = a.Tenant
	switch {
	case req.JobID != a.JobID:
		return a, precondition("job_id: approval %q is for job %q, not %q", a.ID, a.JobID, req.JobID)
	case req.BundleDigest != a.BundleDigest:
		return a, precondition("bundle_digest: approval %q is for %s, not %s", a.ID, a.BundleDigest, req.BundleDigest)
	case req.Target.Repo != a.TargetRepo || req.Target.Branch != a.TargetBranch:
		return a, precondition("target: approval %q is for %s:%s, not %s:%s", a.ID, a.TargetRepo, a.TargetBranch, req.Target.Repo, req.Target.Branch)
	}
	if st := Effective(a, s.now()); st != store.ApprovalApproved {
		return a, precondition("state: approval %q is %s, not approved", a.ID, st)
	}
	return a, nil
}

// LeaseRequest asks for a credential.
type LeaseRequest struct {
	Purpose  string
	JobID    string
	Resource string
	// TTL 0 means DefaultLeaseTTL; more than MaxLeaseTTL is cut to it.
	TTL time.Duration
}

// Lease issues a credential lease to the publisher for job req.JobID's
// publish target repository: the deploy credential after its approval
// was consumed, the repository's source credential (PurposeRead) while it
// is approved. It returns the credential sealed to cert (the caller's own certificate)
// with the context LeaseContext. A lease ends at most MaxLeaseTTL after
// the approval was consumed, and a read lease before a consume when the
// approval expires.
func (s *Service) Lease(ctx context.Context, caller identity.ID, cert *x509.Certificate, req LeaseRequest) (store.Lease, []byte, error) {
	ev := audit.Event{Kind: audit.KindLeaseIssued, Caller: caller.String(), Subject: req.Resource, JobID: req.JobID}
	l, secret, err := s.checkLease(ctx, caller, cert, req, &ev)
	if err != nil {
		return store.Lease{}, nil, s.refused(ctx, ev, err)
	}
	box, err := seal.Seal(cert, LeaseContext(l.ID, l.JobID, l.Resource), secret)
	clear(secret)
	if err != nil {
		return store.Lease{}, nil, fmt.Errorf("approvals: seal the credential: %w", err)
	}
	e := ev
	e.Subject, e.Time, e.Outcome = l.ID, l.IssuedAt, outcomeAllowed
	e.Reason = fmt.Sprintf("%s credential for %s until %s", l.Purpose, l.Resource, l.ExpiresAt.Format(time.RFC3339))
	stored, err := s.cfg.Store.CreateLeaseAudited(ctx, l, e)
	if err != nil {
		return store.Lease{}, nil, err
	}
	s.metrics.leased(stored.Purpose)
	return stored, box, nil
}

// LeaseContext is the context a lease's credential is sealed with.
func LeaseContext(leaseID, jobID, resource string) []byte {
	return seal.LeaseContext(leaseID, jobID, resource)
}

func (s *Service) checkLease(ctx context.Context, caller identity.ID, cert *x509.Certificate, req LeaseRequest, ev *audit.Event) (store.Lease, []byte, error) {
	if !isPublisher(caller) {
		return store.Lease{}, nil, denied("only the publisher leases deploy credentials")
	}
	switch {
	case req.Purpose != PurposeDeploy && req.Purpose != PurposeRead:
		return store.Lease{}, nil, invalid("purpose", "must be deploy or read")
	case req.JobID == "":
		return store.Lease{}, nil, invalid("job_id", "required")
	case req.Resource == "":
		return store.Lease{}, nil, invalid("resource", "required: the publish target repository")
	case req.TTL < 0:
		return store.Lease{}, nil, invalid("ttl", "must not be negative")
	case cert == nil:
		return store.Lease{}, nil, denied("no client certificate to seal the credential to")
	}
	if id, err := identity.FromCertificate(cert); err != nil || id != caller {
		return store.Lease{}, nil, denied("the certificate is not the caller's")
	}
	a, err := s.cfg.Store.ApprovalForJob(ctx, req.JobID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Lease{}, nil, precondition("job_id: job %q has no approval", req.JobID)
	}
	if err != nil {
		return store.Lease{}, nil, err
	}
	ev.Tenant = a.Tenant
	if req.Resource != a.TargetRepo {
		return store.Lease{}, nil, denied("resource: %q is not the publish target of job %q", req.Resource, req.JobID)
	}
	now := s.now()
	st := Effective(a, now)
	consumedHere := a.State == store.ApprovalConsumed && a.ConsumedBy == caller.String()
	if a.State == store.ApprovalConsumed && !consumedHere {
		return store.Lease{}, nil, denied("the approval of job %q was consumed by %s", req.JobID, a.ConsumedBy)
	}
	ttl := min(orDefault(req.TTL, DefaultLeaseTTL), MaxLeaseTTL)
	expires := now.Add(ttl)
	t := s.cfg.Tenants[a.Tenant]
	path, what := "", "deploy"
	if req.Purpose == PurposeDeploy {
		if !consumedHere {
			return store.Lease{}, nil, precondition("job_id: the approval of job %q is %s, not consumed", req.JobID, st)
		}
		if end := a.ConsumedAt.Add(MaxLeaseTTL); expires.After(end) {
			expires = end
		}
		if !expires.After(now) {
			return store.Lease{}, nil, precondition("job_id: the approval of job %q was consumed more than %v ago", req.JobID, MaxLeaseTTL)
		}
		if t != nil {
			path = t.DeployCredentials[a.TargetRepo]
		}
	} else {
		// Reading the branch needs a result approved and not yet spent
		// elsewhere: the publisher prepares the commit before it consumes.
		if st != store.ApprovalApproved && !consumedHere {
			return store.Lease{}, nil, precondition("job_id: the approval of job %q is %s, not approved", req.JobID, st)
		}
		end := a.ExpiresAt
		if consumedHere {
			end = a.ConsumedAt.Add(MaxLeaseTTL)
		}
		if expires.After(end) {
			expires = end
		}
		if !expires.After(now) {
			return store.Lease{}, nil, precondition("job_id: the approval of job %q was consumed more than %v ago", req.JobID, MaxLeaseTTL)
		}
		if t != nil {
			path = t.Repositories[a.TargetRepo].Credential
		}
		what = "source"
	}
	if path == "" {
		return store.Lease{}, nil, precondition("resource: tenant %q has no %s credential for %q", a.Tenant, what, a.TargetRepo)
	}
	secret, err := s.cfg.ReadFile(path)
	if err != nil {
		// The path is the operator's, not the caller's: log it, say less.
		s.cfg.Logger.ErrorContext(ctx, "read "+what+" credential", "tenant", a.Tenant, "repository", a.TargetRepo, "error", err)
		return store.Lease{}, nil, fmt.Errorf("%w: the %s credential for %q cannot be read", errdefs.ErrUnavailable, what, a.TargetRepo)
	}
	return store.Lease{ID: newID(), Purpose: req.Purpose, JobID: req.JobID, Resource: req.Resource, Holder: caller.String(),
		IssuedAt: now, ExpiresAt: expires}, secret, nil
}

// Revoke ends a lease. The publisher may revoke the leases it holds;
// approvers any.
func (s *Service) Revoke(ctx context.Context, caller identity.ID, id, reason string) (store.Lease, error) {
	ev := audit.Event{Kind: audit.KindLeaseRevoked, Caller: caller.String(), Subject: id}
	switch {
	case id == "":
		return store.Lease{}, s.refused(ctx, ev, invalid("lease_id", "required"))
	case len(id) > maxIDBytes:
		return store.Lease{}, s.refused(ctx, ev, invalid("lease_id", "at most %d bytes", maxIDBytes))
	case len(reason) > MaxCommentBytes:
		return store.Lease{}, s.refused(ctx, ev, invalid("reason", "at most %d bytes", MaxCommentBytes))
	}
	l, err := s.cfg.Store.GetLease(ctx, id)
	if err != nil {
		return store.Lease{}, s.refused(ctx, ev, err)
	}
	ev.JobID = l.JobID
	mayRevoke := isPublisher(caller) && l.Holder == caller.String()
	if caller.Kind == identity.KindApprover {
		tenant, err := s.tenantOfJob(ctx, l.JobID)
		if err != nil {
			return store.Lease{}, s.refused(ctx, ev, err)
		}
		if !s.approverOf(caller, tenant) {
			// As for a lease that does not exist: ids reveal nothing.
			return store.Lease{}, s.refused(ctx, ev, fmt.Errorf("%w: lease %q", errdefs.ErrNotFound, id))
		}
		mayRevoke = true
	}
	if !mayRevoke {
		return store.Lease{}, s.refused(ctx, ev, denied("%s may not revoke lease %q", caller.Principal(), id))
	}
	now := s.now()
	e := ev
	e.Time, e.Outcome, e.Reason = now, outcomeAllowed, orNone(reason)
	out, err := s.cfg.Store.RevokeLeaseAudited(ctx, id, now, reason, e)
	if err != nil {
		return store.Lease{}, s.refused(ctx, ev, err)
	}
	return out, nil
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// LeaseQuery selects leases.
type LeaseQuery struct {
	JobID           string
	IncludeInactive bool
	PageSize        int
	PageToken       string
}

// ListLeases returns a page of leases, newest first, only active ones
// unless q.IncludeInactive. Approvers list those of the tenants that list
// them, the publisher those it holds.
func (s *Service) ListLeases(ctx context.Context, caller identity.ID, q LeaseQuery) ([]store.Lease, string, error) {
	if caller.Kind != identity.KindApprover && !isPublisher(caller) {
		return nil, "", denied("%s may not list leases", caller.Principal())
	}
	size, err := pageSize(q.PageSize)
	if err != nil {
		return nil, "", err
	}
	f := store.LeaseFilter{JobID: q.JobID, Limit: size, PageToken: q.PageToken}
	if !q.IncludeInactive {
		f.ActiveAt = s.now()
	}
	list, next, err := s.cfg.Store.ListLeases(ctx, f)
	if err != nil {
		return nil, "", err
	}
	if isPublisher(caller) {
		// The publisher sees the leases it holds, to end any a crash left.
		out := list[:0]
		for _, l := range list {
			if l.Holder == caller.String() {
				out = append(out, l)
			}
		}
		return out, next, nil
	}
	// Only the leases of tenants the approver approves for (a page may
	// then hold fewer than asked while more follow).
	tenants := map[string]string{}
	out := list[:0]
	for _, l := range list {
		t, ok := tenants[l.JobID]
		if !ok {
			if t, err = s.tenantOfJob(ctx, l.JobID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return nil, "", err
			}
			tenants[l.JobID] = t
		}
		if s.approverOf(caller, t) {
			out = append(out, l)
		}
	}
	return out, next, nil
}

// tenantOfJob is the tenant of job jobID.
func (s *Service) tenantOfJob(ctx context.Context, jobID string) (string, error) {
	j, err := s.cfg.Store.GetJob(ctx, jobID)
	if err != nil {
		return "", err
	}
	return j.Tenant, nil
}

// IDForJob returns the id of job jobID's approval, or "" if it has none.
func (s *Service) IDForJob(ctx context.Context, jobID string) (string, error) {
	a, err := s.cfg.Store.ApprovalForJob(ctx, jobID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", nil
	}
	return a.ID, err
}

// State returns a's state as callers see it now (see Effective).
func (s *Service) State(a store.Approval) store.ApprovalState { return Effective(a, s.now()) }

// OpenMissing opens the approval of every finished job that has a bundle
// digest and a publish target (as targetOf reads it from the job) but no
// approval yet: what a crash between recording a result and opening its
// approval, with no retried report to follow, would leave. The authority
// runs it at start-up. It returns how many it opened.
func (s *Service) OpenMissing(ctx context.Context, caller identity.ID, targetOf func(store.Job) (Target, error)) (int, error) {
	finished, err := s.cfg.Store.JobsInStates(ctx, store.StateFinished)
	if err != nil {
		return 0, fmt.Errorf("approvals: open missing: %w", err)
	}
	opened := 0
	for _, j := range finished {
		if j.BundleDigest == "" {
			continue
		}
		t, err := targetOf(j)
		if err != nil {
			return opened, fmt.Errorf("approvals: open missing: job %q: %w", j.ID, err)
		}
		if t.Repo == "" {
			continue
		}
		if _, err := s.cfg.Store.ApprovalForJob(ctx, j.ID); err == nil {
			continue
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return opened, err
		}
		_, created, err := s.Open(ctx, caller, j, t)
		if err != nil {
			return opened, err
		}
		if created {
			opened++
		}
	}
	return opened, nil
}

// PublishSpec is what the publisher needs to publish one approval.
type PublishSpec struct {
	Approval store.Approval
	// Repository is the publish target, from the tenant's policy.
	Repository policy.Repository
	// Base is the commit the job ran on.
	Base string
	// Approvers are the approving votes' SPIFFE IDs in the order cast;
	// ApprovedAt is when the deciding one was cast.
	Approvers  []string
	ApprovedAt time.Time
	Policy     policy.Publish
	// TenantApprovers are the approvers the tenant lists (empty: any).
	TenantApprovers []string
	// DeployCredential says whether the tenant has a deploy credential
	// for the target.
	DeployCredential bool
}

// PublishSpec returns the publish spec of approval id. Only the publisher
// asks; a change request has none.
func (s *Service) PublishSpec(ctx context.Context, caller identity.ID, id string) (PublishSpec, error) {
	if !isPublisher(caller) {
		return PublishSpec{}, denied("only the publisher reads publish specs")
	}
	switch {
	case id == "":
		return PublishSpec{}, invalid("approval_id", "required")
	case len(id) > maxIDBytes:
		return PublishSpec{}, invalid("approval_id", "at most %d bytes", maxIDBytes)
	}
	a, err := s.cfg.Store.GetApproval(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return PublishSpec{}, fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return PublishSpec{}, err
	}
	if a.Kind == store.KindChange || a.TargetRepo == "" {
		return PublishSpec{}, precondition("approval_id: %q is not a publish request", id)
	}
	t := s.cfg.Tenants[a.Tenant]
	if t == nil {
		return PublishSpec{}, precondition("approval_id: tenant %q of approval %q is no longer configured", a.Tenant, id)
	}
	repo, ok := t.Repositories[a.TargetRepo]
	if !ok {
		return PublishSpec{}, precondition("target: %q is no longer a repository of tenant %q", a.TargetRepo, a.Tenant)
	}
	j, err := s.cfg.Store.GetJob(ctx, a.JobID)
	if err != nil {
		return PublishSpec{}, err
	}
	spec := PublishSpec{Approval: a, Repository: repo, Base: j.Commit, Policy: t.Publish, TenantApprovers: t.Approvals.Approvers,
		DeployCredential: t.DeployCredentials[a.TargetRepo] != ""}
	for _, v := range a.Votes {
		if v.Decision == store.DecisionApprove {
			spec.Approvers = append(spec.Approvers, v.Approver)
			if len(spec.Approvers) == a.Required {
				spec.ApprovedAt = v.DecidedAt
			}
		}
	}
	return spec, nil
}

// UseRequest announces the use of a leased credential.
type UseRequest struct {
	LeaseID, JobID, Resource string
}

// UseLease is what the holder of a lease calls right before it presents
// the credential: it refuses anyone but the holder, a lease for another
// job or resource, and a revoked or expired lease, and records the use.
// A revocation that commits after UseLease returned ends the lease for the
// next use; the one in flight is on the log before the revocation.
func (s *Service) UseLease(ctx context.Context, caller identity.ID, req UseRequest) (store.Lease, error) {
	ev := audit.Event{Kind: audit.KindLeaseUsed, Caller: caller.String(), Subject: req.LeaseID, JobID: req.JobID}
	switch {
	case req.LeaseID == "":
		return store.Lease{}, s.refused(ctx, ev, invalid("lease_id", "required"))
	case req.JobID == "":
		return store.Lease{}, s.refused(ctx, ev, invalid("job_id", "required"))
	case req.Resource == "":
		return store.Lease{}, s.refused(ctx, ev, invalid("resource", "required"))
	}
	l, err := s.cfg.Store.GetLease(ctx, req.LeaseID)
	if err != nil {
		return store.Lease{}, s.refused(ctx, ev, err)
	}
	now := s.now()
	switch {
	case l.Holder != caller.String():
		err = denied("lease %q is held by %s, not %s", l.ID, l.Holder, caller)
	case l.JobID != req.JobID:
		err = denied("job_id: lease %q is for job %q", l.ID, l.JobID)
	case l.Resource != req.Resource:
		err = denied("resource: lease %q is for %q", l.ID, l.Resource)
	case !l.RevokedAt.IsZero():
		err = precondition("lease %q was revoked at %s (%s)", l.ID, l.RevokedAt.Format(time.RFC3339), orNone(l.RevokeReason))
	case !now.Before(l.ExpiresAt):
		err = precondition("lease %q expired at %s", l.ID, l.ExpiresAt.Format(time.RFC3339))
	}
	if err != nil {
		return store.Lease{}, s.refused(ctx, ev, err)
	}
	e := ev
	e.Time, e.Outcome = now, outcomeAllowed
	e.Reason = fmt.Sprintf("%s credential used on %s; the lease ends %s", l.Purpose, l.Resource, l.ExpiresAt.Format(time.RFC3339))
	if _, err := s.cfg.Store.AppendAudit(ctx, e); err != nil {
		// A use that is not on the log must not happen.
		return store.Lease{}, fmt.Errorf("approvals: record the use of lease %q: %w", l.ID, err)
	}
	return l, nil
}

// Sweep rewrites every approval past its expiry, and every change request
// whose job has ended, as expired, and ends every lease past its expiry, each with an audit entry by caller (the
// authority itself), and returns how many of each. Both already read as
// expired before the sweep; it makes the log say when they ran out.
func (s *Service) Sweep(ctx context.Context, caller identity.ID) (approvalsExpired, leasesExpired int, err error) {
	now := s.now()
	expired := func(a store.Approval, reason string) audit.Event {
		return audit.Event{Kind: audit.KindApprovalExpired, Caller: caller.String(), Subject: a.ID, Time: now, Outcome: outcomeAllowed, Reason: reason}
	}
	n, err := drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireApprovalsAudited(ctx, now, batch, func(a store.Approval) audit.Event {
			return expired(a, fmt.Sprintf("%s request expired at %s undecided or unconsumed", a.Kind, a.ExpiresAt.Format(time.RFC3339)))
		})
		s.metrics.expired(list)
		return len(list), err
	})
	approvalsExpired += n
	if err != nil {
		return approvalsExpired, leasesExpired, err
	}
	n, err = drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireChangesOfEndedJobsAudited(ctx, batch, func(a store.Approval) audit.Event {
			return expired(a, fmt.Sprintf("change request for job %s: the job has ended, so the change can no longer apply", a.JobID))
		})
		s.metrics.expired(list)
		return len(list), err
	})
	approvalsExpired += n
	if err != nil {
		return approvalsExpired, leasesExpired, err
	}
	leasesExpired, err = drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.ExpireLeasesAudited(ctx, now, batch, func(l store.Lease) audit.Event {
			return audit.Event{Kind: audit.KindLeaseExpired, Caller: caller.String(), Subject: l.ID, Time: now, Outcome: outcomeAllowed,
				Reason: fmt.Sprintf("%s lease on %s ended at %s", l.Purpose, l.Resource, l.ExpiresAt.Format(time.RFC3339))}
		})
		return len(list), err
	})
	return approvalsExpired, leasesExpired, err
}

// drain calls step with a batch size until a batch comes back short or
// fails, and returns how many it handled in all.
func drain(step func(batch int) (int, error)) (int, error) {
	const batch = 100
	total := 0
	for {
		n, err := step(batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
	}
}

// SweepEvery runs Sweep every interval until ctx ends; failures are
// logged and tried again at the next tick.
func (s *Service) SweepEvery(ctx context.Context, caller identity.ID, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		a, l, err := s.Sweep(ctx, caller)
		switch {
		case err != nil && ctx.Err() == nil:
			s.cfg.Logger.ErrorContext(ctx, "expiry sweep", "error", err)
		case a+l > 0:
			s.cfg.Logger.InfoContext(ctx, "expiry sweep", "approvals_expired", a, "leases_expired", l)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
