// Package leases owns the authority's credential leases: the short deploy
// and source credentials the publisher leases for a job whose approval it
// consumed (or, to read, that is approved), and the brokered credentials
// the executor a job runs on leases for the job's egress proxy, sealed to
// the caller's certificate; their revocation (a brokered lease ends with
// its job, and with the executor process that held it), listing and
// announced use; and their expiry on the log. Refusals are recorded through package approvals,
// whose throttle they share, and who may see a tenant's leases is who may
// decide its approvals. It imports no gRPC; the authority's api and
// composition root import it.
package leases

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/pkg/seal"
	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Lease durations: what a request without a TTL gets, and the most any
// lease gets, counted also from the consumption of the job's approval.
const (
	DefaultTTL = 5 * time.Minute
	MaxTTL     = 15 * time.Minute
)

// Lease purposes: PurposeDeploy pushes one reviewed commit; PurposeRead
// fetches the target branch to prepare it, before the approval is spent;
// PurposeBrokered is a brokered credential a running job's egress proxy
// adds to the job's requests to its hosts.
const (
	PurposeDeploy   = "deploy"
	PurposeRead     = "read"
	PurposeBrokered = "brokered"
)

// Config configures a Service.
type Config struct {
	Store   store.Store
	Tenants policy.Tenants
	// Approvals records the refusals, says who approves a tenant and is
	// the clock; required.
	Approvals *approvals.Service
	Logger    *slog.Logger
	// ReadFile reads a credential file; default os.ReadFile.
	ReadFile func(string) ([]byte, error)
	// Getenv reads the authority's environment variable holding a
	// brokered credential; default os.Getenv.
	Getenv func(string) string
	// Grants reads what a brokered lease needs of a job's stored grant
	// (store.Job.Grant); without it no brokered credential is leased.
	Grants func(wire []byte) (JobGrant, error)
	// Meter makes the lease metrics; nil is the global meter provider.
	Meter metric.MeterProvider
}

// Service is the lease logic; safe for concurrent use.
type Service struct {
	cfg Config
	// issued counts leases issued, by purpose (a fixed set, never an id).
	issued metric.Int64Counter
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("leases: store is required")
	}
	if cfg.Approvals == nil {
		return nil, errors.New("leases: approvals is required")
	}
	if cfg.Tenants == nil {
		cfg.Tenants = policy.Tenants{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ReadFile == nil {
		cfg.ReadFile = os.ReadFile
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	// The counter keeps the scope it had when leases were part of
	// approvals, so dashboards see no change.
	set := instruments.New(cfg.Meter, approvals.MeterName)
	issued := set.Counter("airlock.authority.leases.issued", "{lease}", "Credential leases issued, by purpose.")
	if err := set.Err(); err != nil {
		return nil, fmt.Errorf("leases: metrics: %w", err)
	}
	return &Service{cfg: cfg, issued: issued}, nil
}

func (s *Service) now() time.Time { return s.cfg.Approvals.Now() }

func (s *Service) refused(ctx context.Context, e audit.Event, err error) error {
	return s.cfg.Approvals.Refused(ctx, e, err)
}

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

func denied(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrPermissionDenied, fmt.Sprintf(format, args...))
}

func precondition(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, fmt.Sprintf(format, args...))
}

// Request asks for a credential.
type Request struct {
	Purpose string
	JobID   string
	// Resource is the publish target repository, or a brokered
	// credential's name.
	Resource string
	// TTL 0 means DefaultTTL (a brokered credential's MaxTTL); more than
	// MaxTTL (the credential's) is cut to it.
	TTL time.Duration
}

// Issued is a lease as issued.
type Issued struct {
	Lease store.Lease
	// Sealed is the credential sealed to the caller's certificate with
	// the context SealContext.
	Sealed []byte
	// Brokered is, for PurposeBrokered, how the job's egress proxy uses
	// the credential; nil otherwise.
	Brokered *Brokered
}

// Lease issues a credential lease. To the publisher, for job req.JobID's
// publish target repository: the deploy credential after its approval
// was consumed, the repository's source credential (PurposeRead) while it
// is approved; such a lease ends at most MaxTTL after the approval was
// consumed, and a read lease before a consume when the approval expires.
// To the executor job req.JobID runs on, a brokered credential the job
// asked for (PurposeBrokered; see checkBrokered). The credential is
// sealed to cert, the caller's own certificate.
func (s *Service) Lease(ctx context.Context, caller identity.ID, cert *x509.Certificate, req Request) (Issued, error) {
	ev := audit.Event{Kind: audit.KindLeaseIssued, Caller: caller.String(), Subject: req.Resource, JobID: req.JobID}
	var (
		l      store.Lease
		secret []byte
		b      *Brokered
		err    error
	)
	if req.Purpose == PurposeBrokered {
		l, secret, b, err = s.checkBrokered(ctx, caller, cert, req, &ev)
	} else {
		l, secret, err = s.checkLease(ctx, caller, cert, req, &ev)
	}
	if err != nil {
		return Issued{}, s.refused(ctx, ev, err)
	}
	box, err := seal.Seal(cert, SealContext(l.ID, l.JobID, l.Resource), secret)
	clear(secret)
	if err != nil {
		return Issued{}, fmt.Errorf("leases: seal the credential: %w", err)
	}
	e := ev
	e.Subject, e.Time, e.Outcome = l.ID, l.IssuedAt, audit.OutcomeAllowed
	e.Reason = fmt.Sprintf("%s credential for %s until %s", l.Purpose, l.Resource, l.ExpiresAt.Format(time.RFC3339))
	if b != nil {
		e.Reason = fmt.Sprintf("brokered credential %s for job %s on hosts %s until %s", l.Resource, l.JobID,
			strings.Join(b.Hosts, ", "), l.ExpiresAt.Format(time.RFC3339))
	}
	stored, err := s.cfg.Store.CreateLeaseAudited(ctx, l, e)
	if err != nil {
		return Issued{}, err
	}
	s.issued.Add(context.Background(), 1, metric.WithAttributes(attribute.String("purpose", stored.Purpose)))
	return Issued{Lease: stored, Sealed: box, Brokered: b}, nil
}

// SealContext is the context a lease's credential is sealed with.
func SealContext(leaseID, jobID, resource string) []byte {
	return seal.LeaseContext(leaseID, jobID, resource)
}

// checkRequest checks what every lease request needs: a job, a
// resource (what it is, for the message), a TTL that is not negative,
// and the caller's own certificate to seal the credential to.
func checkRequest(caller identity.ID, cert *x509.Certificate, req Request, resource string) error {
	switch {
	case req.JobID == "":
		return invalid("job_id", "required")
	case req.Resource == "":
		return invalid("resource", "required: %s", resource)
	case req.TTL < 0:
		return invalid("ttl", "must not be negative")
	case cert == nil:
		return denied("no client certificate to seal the credential to")
	}
	if id, err := identity.FromCertificate(cert); err != nil || id != caller {
		return denied("the certificate is not the caller's")
	}
	return nil
}

func (s *Service) checkLease(ctx context.Context, caller identity.ID, cert *x509.Certificate, req Request, ev *audit.Event) (store.Lease, []byte, error) {
	if !approvals.IsPublisher(caller) {
		return store.Lease{}, nil, denied("only the publisher leases deploy credentials")
	}
	if req.Purpose != PurposeDeploy && req.Purpose != PurposeRead {
		return store.Lease{}, nil, invalid("purpose", "must be deploy, read or brokered")
	}
	if err := checkRequest(caller, cert, req, "the publish target repository"); err != nil {
		return store.Lease{}, nil, err
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
	st := approvals.Effective(a, now)
	consumedHere := a.State == store.ApprovalConsumed && a.ConsumedBy == caller.String()
	if a.State == store.ApprovalConsumed && !consumedHere {
		return store.Lease{}, nil, denied("the approval of job %q was consumed by %s", req.JobID, a.ConsumedBy)
	}
	ttl := min(orDefault(req.TTL), MaxTTL)
	expires := now.Add(ttl)
	t := s.cfg.Tenants[a.Tenant]
	path, what := "", "deploy"
	if req.Purpose == PurposeDeploy {
		if !consumedHere {
			return store.Lease{}, nil, precondition("job_id: the approval of job %q is %s, not consumed", req.JobID, st)
		}
		if end := a.ConsumedAt.Add(MaxTTL); expires.After(end) {
			expires = end
		}
		if !expires.After(now) {
			return store.Lease{}, nil, precondition("job_id: the approval of job %q was consumed more than %v ago", req.JobID, MaxTTL)
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
			end = a.ConsumedAt.Add(MaxTTL)
		}
		if expires.After(end) {
			expires = end
		}
		if !expires.After(now) {
			return store.Lease{}, nil, precondition("job_id: the approval of job %q was consumed more than %v ago", req.JobID, MaxTTL)
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
	return store.Lease{ID: ids.New(), Purpose: req.Purpose, JobID: req.JobID, Resource: req.Resource, Holder: caller.String(),
		IssuedAt: now, ExpiresAt: expires}, secret, nil
}

// Revoke ends a lease. The publisher may revoke the leases it holds, an
// executor the brokered leases it holds; approvers any of their tenants'.
func (s *Service) Revoke(ctx context.Context, caller identity.ID, id, reason string) (store.Lease, error) {
	ev := audit.Event{Kind: audit.KindLeaseRevoked, Caller: caller.String(), Subject: id}
	switch {
	case id == "":
		return store.Lease{}, s.refused(ctx, ev, invalid("lease_id", "required"))
	case len(id) > approvals.MaxIDBytes:
		return store.Lease{}, s.refused(ctx, ev, invalid("lease_id", "at most %d bytes", approvals.MaxIDBytes))
	case len(reason) > approvals.MaxCommentBytes:
		return store.Lease{}, s.refused(ctx, ev, invalid("reason", "at most %d bytes", approvals.MaxCommentBytes))
	}
	l, err := s.cfg.Store.GetLease(ctx, id)
	if err != nil {
		return store.Lease{}, s.refused(ctx, ev, err)
	}
	ev.JobID = l.JobID
	holds := l.Holder == caller.String()
	mayRevoke := holds && (approvals.IsPublisher(caller) || caller.IsExecutor() && l.Purpose == PurposeBrokered)
	if caller.Kind == identity.KindApprover {
		tenant, err := s.tenantOfJob(ctx, l.JobID)
		if err != nil {
			return store.Lease{}, s.refused(ctx, ev, err)
		}
		if !s.cfg.Approvals.ApproverOf(caller, tenant) {
			// As for a lease that does not exist: ids reveal nothing.
			return store.Lease{}, s.refused(ctx, ev, fmt.Errorf("%w: lease %q", errdefs.ErrNotFound, id))
		}
		if l.Purpose == PurposeBrokered && l.RevokedAt.IsZero() {
			// Its value is in the memory of a running job's egress proxy,
			// which this revocation would not reach: what ends it is the
			// job's end, or a policy without its hosts.
			return store.Lease{}, s.refused(ctx, ev, precondition("lease %q is job %s's brokered credential, which ends with the job: cancel the job, or narrow its network policy to drop the credential's hosts", id, l.JobID))
		}
		mayRevoke = true
	}
	if !mayRevoke {
		return store.Lease{}, s.refused(ctx, ev, denied("%s may not revoke lease %q", caller.Principal(), id))
	}
	now := s.now()
	e := ev
	e.Time, e.Outcome, e.Reason = now, audit.OutcomeAllowed, orNone(reason)
	out, err := s.cfg.Store.RevokeLeaseAudited(ctx, id, now, reason, e)
	if err != nil {
		return store.Lease{}, s.refused(ctx, ev, err)
	}
	return out, nil
}

func orDefault(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return DefaultTTL
	}
	return ttl
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// Query selects leases.
type Query struct {
	JobID           string
	IncludeInactive bool
	PageSize        int
	PageToken       string
}

// List returns a page of leases, newest first, only active ones
// unless q.IncludeInactive. Approvers list those of the tenants that list
// them, the publisher those it holds.
func (s *Service) List(ctx context.Context, caller identity.ID, q Query) ([]store.Lease, string, error) {
	if caller.Kind != identity.KindApprover && !approvals.IsPublisher(caller) {
		return nil, "", denied("%s may not list leases", caller.Principal())
	}
	size, err := approvals.PageSize(q.PageSize)
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
	if approvals.IsPublisher(caller) {
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
		if s.cfg.Approvals.ApproverOf(caller, t) {
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

// UseRequest announces the use of a leased credential.
type UseRequest struct {
	LeaseID, JobID, Resource string
}

// Use is what the holder of a lease calls right before it presents
// the credential: it refuses anyone but the holder, a lease for another
// job or resource, and a revoked or expired lease, and records the use.
// A revocation that commits after Use returned ends the lease for the
// next use; the one in flight is on the log before the revocation.
func (s *Service) Use(ctx context.Context, caller identity.ID, req UseRequest) (store.Lease, error) {
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
	e.Time, e.Outcome = now, audit.OutcomeAllowed
	e.Reason = fmt.Sprintf("%s credential used on %s; the lease ends %s", l.Purpose, l.Resource, l.ExpiresAt.Format(time.RFC3339))
	if _, err := s.cfg.Store.AppendAudit(ctx, e); err != nil {
		// A use that is not on the log must not happen.
		return store.Lease{}, fmt.Errorf("leases: record the use of lease %q: %w", l.ID, err)
	}
	return l, nil
}
