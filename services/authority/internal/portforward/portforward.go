// Package portforward owns the authority's port forwards: a tenant's
// client reaching a TCP port inside one of its running sessions through
// the authority and the session's executor, never through a public port.
// It decides who may open, carry, list and close a forward (the tenant's
// port_forward policy), holds a forward PENDING behind an approval where
// the policy says so, carries each connection (counting its bytes onto
// the record), cuts live connections when a forward closes, and closes
// forwards that expire or whose session ends. Every decision goes to the
// audit log. It imports no gRPC; the authority's api and composition root
// import it.
package portforward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/pkg/tunnel"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// MaxList is the most forwards one List returns.
const MaxList = 500

// Sessions is what the package needs of the jobs package.
type Sessions interface {
	// Session returns session id if caller (a client) acts for its
	// tenant; any other is NotFound.
	Session(ctx context.Context, caller identity.ID, id string) (store.Job, error)
	// ForwardPort connects to port inside running session j at its
	// executor.
	ForwardPort(ctx context.Context, j store.Job, port uint32, forwardID string) (tunnel.End, error)
}

// Config configures a Service.
type Config struct {
	Store    store.Store
	Tenants  policy.Tenants
	Sessions Sessions
	// Refused records a refusal (approvals.Service.Refused: one throttle
	// for every refusal the authority audits); nil appends it directly.
	Refused func(ctx context.Context, e audit.Event, err error) error
	Logger  *slog.Logger
	// Self is the authority's identity, the caller its own closes
	// (expiry, a session's end, a denial) are audited as.
	Self identity.ID
	// Now is the clock; default time.Now.
	Now func() time.Time
	// CheckEvery is how often a live connection reads its forward again,
	// so a close through another replica cuts it too; default 1s.
	CheckEvery time.Duration
	// FlushEvery is how often a live connection's bytes are added to the
	// record; default 5s (and always at its end).
	FlushEvery time.Duration
}

// Service is the port forward logic; safe for concurrent use.
type Service struct {
	cfg Config

	mu sync.Mutex
	// live holds, by forward id, the cut of each connection this replica
	// carries.
	live map[string]map[*liveConn]struct{}
}

// liveConn is one connection this replica carries: cut ends it, and done
// is closed once its bytes are flushed onto the record and it is audited.
type liveConn struct {
	cut  context.CancelCauseFunc
	done chan struct{}
}

// closeWait bounds how long a close waits for its connections here to
// flush their last bytes before it writes the forward's closed event.
const closeWait = 5 * time.Second

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Sessions == nil {
		return nil, errors.New("portforward: store and sessions are required")
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
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = time.Second
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = 5 * time.Second
	}
	return &Service{cfg: cfg, live: map[string]map[*liveConn]struct{}{}}, nil
}

func (s *Service) self() string { return s.cfg.Self.String() }

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

func denied(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrPermissionDenied, fmt.Sprintf(format, args...))
}

func precondition(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, fmt.Sprintf(format, args...))
}

func notFound(id string) error { return fmt.Errorf("%w: port forward %q", errdefs.ErrNotFound, id) }

// refused audits a refusal of caller's request about subject and returns
// err.
func (s *Service) refused(ctx context.Context, caller identity.ID, subject, tenant string, err error) error {
	e := audit.Event{Kind: audit.KindForwardRefused, Caller: caller.String(), Subject: subject, Tenant: tenant}
	if s.cfg.Refused != nil {
		return s.cfg.Refused(ctx, e, err)
	}
	for _, k := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrPermissionDenied,
		errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted} {
		if errors.Is(err, k) {
			e.Outcome, e.Reason, e.Time = audit.OutcomeDenied, err.Error(), s.now()
			if _, aerr := s.cfg.Store.AppendAudit(ctx, e); aerr != nil {
				s.cfg.Logger.ErrorContext(ctx, "audit a port forward refusal", "error", aerr)
			}
			break
		}
	}
	return err
}

// readsTenant reports whether caller may see the tenant's forwards: its
// clients and approvers, and operators.
func (s *Service) readsTenant(caller identity.ID, tenant string) bool {
	t := s.cfg.Tenants[tenant]
	switch caller.Kind {
	case identity.KindOperator:
		return true
	case identity.KindClient:
		return t != nil && t.HasClient(caller.Principal())
	case identity.KindApprover:
		return t != nil && t.Approvals.AllowsApprover(caller.Principal())
	}
	return false
}

// OpenRequest asks for a forward.
type OpenRequest struct {
	SessionID string
	Port      uint32
	// TTL is how long it may stay open; zero is the policy's default.
	TTL time.Duration
}

// Open opens caller's forward into a running session of its tenant: OPEN
// at once, or PENDING with an approval where the tenant's policy says
// approval: required. Refused: anyone but a client of the session's
// tenant (NotFound, as for a session it cannot see), a job or a session
// that is not running, a tenant without a port_forward policy, a port it
// does not list, a ttl above its max_ttl, and a tenant at its max_open.
func (s *Service) Open(ctx context.Context, caller identity.ID, req OpenRequest) (store.PortForward, error) {
	f, err := s.open(ctx, caller, req)
	if err != nil {
		return store.PortForward{}, s.refused(ctx, caller, req.SessionID, f.Tenant, err)
	}
	return f, nil
}

func (s *Service) open(ctx context.Context, caller identity.ID, req OpenRequest) (store.PortForward, error) {
	if caller.Kind != identity.KindClient {
		return store.PortForward{}, denied("%s is not a client; only a tenant's clients open port forwards", caller.Principal())
	}
	switch {
	case req.SessionID == "":
		return store.PortForward{}, invalid("session_id", "required")
	case req.Port == 0 || req.Port > 65535:
		return store.PortForward{}, invalid("port", "%d is not a TCP port (1 to 65535)", req.Port)
	case req.TTL < 0:
		return store.PortForward{}, invalid("ttl", "%v is negative", req.TTL)
	}
	j, err := s.cfg.Sessions.Session(ctx, caller, req.SessionID)
	if err != nil {
		return store.PortForward{}, err
	}
	f := store.PortForward{Tenant: j.Tenant}
	t := s.cfg.Tenants[j.Tenant]
	if t == nil || t.PortForward == nil {
		return f, denied("tenant %q allows no port forwards: its policy has no port_forward", j.Tenant)
	}
	pf := t.PortForward
	if j.State != store.StateRunning {
		return f, precondition("session %s is %s: only a running session's ports are forwarded", j.ID, j.State)
	}
	if !pf.Allows(req.Port) {
		return f, denied("port: %d is not in tenant %q's port_forward.ports (%s)", req.Port, j.Tenant, pf.PortList())
	}
	ttl := req.TTL
	if ttl == 0 {
		ttl = pf.DefaultTTL
	}
	if ttl > pf.MaxTTL {
		return f, invalid("ttl", "%v is above tenant %q's port_forward.max_ttl %v", ttl, j.Tenant, pf.MaxTTL)
	}
	now := s.now()
	f = store.PortForward{ID: ids.New(), SessionID: j.ID, Tenant: j.Tenant, Requester: caller.String(), Port: req.Port,
		State: store.ForwardOpen, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	reason := fmt.Sprintf("port %d of session %s, open until %s", f.Port, f.SessionID, f.ExpiresAt.Format(time.RFC3339))
	if pf.ApprovalRequired {
		// Pending, it lasts as long as its approval may be decided; once
		// approved it opens for ttl from then (resolve).
		f.State, f.ApprovalID, f.ExpiresAt = store.ForwardPending, ids.New(), now.Add(approvalLife(t))
		reason = fmt.Sprintf("port %d of session %s, pending approval %s; it would stay open %v once approved", f.Port, f.SessionID, f.ApprovalID, ttl)
	}
	f, err = s.cfg.Store.CreatePortForwardAudited(ctx, f, pf.MaxOpen, audit.Event{
		Kind: audit.KindForwardOpened, Caller: caller.String(), Subject: f.ID, Time: now, Outcome: audit.OutcomeAllowed, Reason: reason,
	})
	if err != nil {
		return store.PortForward{Tenant: j.Tenant}, err
	}
	if f.State == store.ForwardPending {
		if _, err := s.openApproval(ctx, caller, f, t, ttl); err != nil {
			// Without its approval it can never open: closed, not left
			// pending.
			if _, cerr := s.closeForward(ctx, caller.String(), f.ID, "its approval could not be opened"); cerr != nil {
				s.cfg.Logger.ErrorContext(ctx, "close a forward whose approval failed", "forward", f.ID, "error", cerr)
			}
			return store.PortForward{}, err
		}
	}
	s.cfg.Logger.InfoContext(ctx, "port forward opened", "forward", f.ID, "session", f.SessionID, "port", f.Port, "state", f.State)
	return f, nil
}

// Get returns one forward as caller may see it, its state brought up to
// date (a pending one whose approval was decided).
func (s *Service) Get(ctx context.Context, caller identity.ID, id string) (store.PortForward, error) {
	if id == "" {
		return store.PortForward{}, invalid("forward_id", "required")
	}
	f, err := s.cfg.Store.GetPortForward(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && !s.readsTenant(caller, f.Tenant)) {
		return store.PortForward{}, notFound(id)
	}
	if err != nil {
		return store.PortForward{}, err
	}
	return s.resolve(ctx, f)
}

// ListRequest selects forwards.
type ListRequest struct {
	// SessionID selects a session's forwards; empty, Tenant's.
	SessionID string
	Tenant    string
	OpenOnly  bool
}

// List returns forwards newest first, at most MaxList, each pending one
// brought up to date. A client or approver sees its tenants', an operator
// any; a session or tenant caller may not see is NotFound or refused.
func (s *Service) List(ctx context.Context, caller identity.ID, req ListRequest) ([]store.PortForward, error) {
	filter := store.ForwardFilter{SessionID: req.SessionID, Tenant: req.Tenant, Limit: MaxList}
	if req.OpenOnly {
		filter.States = []store.ForwardState{store.ForwardPending, store.ForwardOpen}
	}
	switch {
	case req.SessionID != "":
		j, err := s.cfg.Store.GetJob(ctx, req.SessionID)
		if errors.Is(err, errdefs.ErrNotFound) || (err == nil && !s.readsTenant(caller, j.Tenant)) {
			return nil, fmt.Errorf("%w: session %q", errdefs.ErrNotFound, req.SessionID)
		}
		if err != nil {
			return nil, err
		}
		filter.Tenant = ""
	case req.Tenant == "":
		return nil, invalid("tenant", "required without session_id")
	case !s.readsTenant(caller, req.Tenant):
		return nil, denied("%s may not see tenant %q's port forwards", caller.Principal(), req.Tenant)
	}
	list, err := s.cfg.Store.ListPortForwards(ctx, filter)
	if err != nil {
		return nil, err
	}
	for i, f := range list {
		if f.State != store.ForwardPending {
			continue
		}
		if list[i], err = s.resolve(ctx, f); err != nil {
			return nil, err
		}
	}
	return list, nil
}

// Close closes a forward at caller's request: a client of its tenant, or
// an operator. Its connections on this replica are cut at once, those on
// others within CheckEvery. Closing a closed forward returns it as it is.
func (s *Service) Close(ctx context.Context, caller identity.ID, id string) (store.PortForward, error) {
	f, err := s.cfg.Store.GetPortForward(ctx, id)
	switch {
	case id == "":
		err = invalid("forward_id", "required")
	case errors.Is(err, errdefs.ErrNotFound):
		err = notFound(id)
	case err != nil:
		return store.PortForward{}, err
	case caller.Kind == identity.KindOperator:
	case caller.Kind != identity.KindClient || !s.readsTenant(caller, f.Tenant):
		err = notFound(id)
	}
	if err != nil {
		return store.PortForward{}, s.refused(ctx, caller, id, f.Tenant, err)
	}
	return s.closeForward(ctx, caller.String(), id, "closed by "+caller.Principal())
}

// closeForward closes forward id (unless it is closed already) with an
// audit entry by by. Its connections here are cut first and their last
// bytes flushed (waiting at most closeWait), so the closed event counts
// them; those on other replicas are cut within CheckEvery and flush
// after it (their port_forward.connection events are exact). A pending
// forward's approval is withdrawn with it, so approvers are not left a
// dead request.
func (s *Service) closeForward(ctx context.Context, by, id, reason string) (store.PortForward, error) {
	s.cutAndWait(ctx, id, reason)
	now := s.now()
	var approval string
	f, err := s.cfg.Store.UpdatePortForwardAudited(ctx, id, func(f *store.PortForward) (*audit.Event, error) {
		if f.State == store.ForwardClosed {
			return nil, nil
		}
		if f.State == store.ForwardPending {
			approval = f.ApprovalID
		}
		f.State, f.ClosedAt, f.CloseReason = store.ForwardClosed, now, reason
		return &audit.Event{Kind: audit.KindForwardClosed, Caller: by, Subject: f.ID, Time: now, Outcome: audit.OutcomeAllowed,
			Reason: fmt.Sprintf("port %d of session %s: %s; %d connection(s), %d byte(s) in, %d byte(s) out (as flushed when it closed)",
				f.Port, f.SessionID, reason, f.Connections, f.BytesIn, f.BytesOut)}, nil
	})
	if err != nil {
		return store.PortForward{}, err
	}
	s.cut(id, reason)
	if approval != "" {
		if _, err := s.cfg.Store.WithdrawApprovalAudited(ctx, approval, func(a store.Approval) audit.Event {
			return audit.Event{Kind: audit.KindApprovalExpired, Caller: by, Subject: a.ID, Time: now, Outcome: audit.OutcomeAllowed,
				Reason: fmt.Sprintf("withdrawn: port forward %s closed while pending (%s)", id, reason)}
		}); err != nil {
			return f, fmt.Errorf("port forward %s closed; withdraw its approval %s: %w", id, approval, err)
		}
	}
	return f, nil
}

// cut ends every connection of forward id this replica carries.
func (s *Service) cut(id, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.live[id] {
		c.cut(precondition("port forward %s was closed: %s", id, why))
	}
}

// cutAndWait cuts forward id's connections here and waits, at most
// closeWait (or until ctx ends), for each to flush its last bytes.
func (s *Service) cutAndWait(ctx context.Context, id, why string) {
	s.mu.Lock()
	var wait []chan struct{}
	for c := range s.live[id] {
		c.cut(precondition("port forward %s was closed: %s", id, why))
		wait = append(wait, c.done)
	}
	s.mu.Unlock()
	if len(wait) == 0 {
		return
	}
	t := time.NewTimer(closeWait)
	defer t.Stop()
	for _, d := range wait {
		select {
		case <-d:
		case <-t.C:
			s.cfg.Logger.WarnContext(ctx, "a forwarded connection did not flush before its forward closed", "forward", id)
			return
		case <-ctx.Done():
			return
		}
	}
}

// approvalLife is how long tenant t's approvals may stay undecided.
func approvalLife(t *policy.Tenant) time.Duration {
	if t.Approvals.TTL > 0 {
		return t.Approvals.TTL
	}
	return policy.DefaultApprovalTTL
}

// policyRefusal says why tenant's current policy no longer allows a
// forward to port, or is "" when it does.
func (s *Service) policyRefusal(tenant string, port uint32) string {
	t := s.cfg.Tenants[tenant]
	if t == nil || t.PortForward == nil || !t.PortForward.Allows(port) {
		return fmt.Sprintf("policy no longer allows port %d", port)
	}
	return ""
}
