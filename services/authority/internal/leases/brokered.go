package leases

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// DefaultBrokeredTTL bounds a brokered lease whose credential's policy
// sets no max_ttl (the tenant configuration fills one in; this is the
// floor under a policy built without it).
const DefaultBrokeredTTL = time.Hour

// JobGrant is what a brokered lease needs of a job's stored grant.
type JobGrant struct {
	// Credentials are the names of the brokered credentials the job asked
	// for, as its submission checked them.
	Credentials []string
	// Deadline is how long the job may run, counted from its dispatch; 0
	// for no bound.
	Deadline time.Duration
}

// Brokered is how a job's egress proxy uses a brokered credential: the
// hosts it is added for and the header it is set in. Never the value.
type Brokered struct {
	Name      string
	Hosts     []string
	Header    string
	Format    string
	BasicUser string
	// UpstreamCA is the PEM bundle the hosts' certificates must chain to;
	// nil for the executor's roots.
	UpstreamCA []byte
}

// checkBrokered admits a lease of brokered credential req.Resource for
// job req.JobID, and reads its value. Only the executor the job is placed
// on (its grant names it) may lease it, only while the job is staging or
// running, only a credential the job asked for and its tenant's policy
// holds. The lease ends at the earliest of the TTL asked (the
// credential's MaxTTL when none is), the credential's MaxTTL and the
// job's deadline.
func (s *Service) checkBrokered(ctx context.Context, caller identity.ID, cert *x509.Certificate, req Request, ev *audit.Event) (store.Lease, []byte, *Brokered, error) {
	fail := func(err error) (store.Lease, []byte, *Brokered, error) { return store.Lease{}, nil, nil, err }
	if !caller.IsExecutor() {
		return fail(denied("only the executor a job runs on leases its brokered credentials"))
	}
	if err := checkRequest(caller, cert, req, "the brokered credential's name"); err != nil {
		return fail(err)
	}
	if len(req.JobID) > approvals.MaxIDBytes || len(req.Resource) > approvals.MaxIDBytes {
		return fail(invalid("job_id, resource", "at most %d bytes each", approvals.MaxIDBytes))
	}
	j, err := s.cfg.Store.GetJob(ctx, req.JobID)
	if err != nil {
		return fail(err)
	}
	ev.Tenant = j.Tenant
	name := req.Resource
	switch {
	case j.Executor != caller.String():
		// As the job's source: only the executor it is placed on.
		return fail(denied("job %q is not placed on %s", j.ID, caller.Principal()))
	case j.State.Terminal():
		return fail(precondition("job_id: job %q ended (%s)", j.ID, j.State))
	case j.State != store.StateStaging && j.State != store.StateRunning:
		return fail(precondition("job_id: job %q is %s, not started", j.ID, j.State))
	case s.cfg.Grants == nil:
		return fail(precondition("resource: this authority leases no brokered credentials"))
	}
	g, err := s.cfg.Grants(j.Grant)
	if err != nil {
		return fail(fmt.Errorf("leases: the grant of job %q: %w", j.ID, err))
	}
	if !slices.Contains(g.Credentials, name) {
		return fail(denied("resource: job %q did not ask for the brokered credential %q", j.ID, name))
	}
	var c policy.Credential
	ok := false
	if t := s.cfg.Tenants[j.Tenant]; t != nil {
		c, ok = t.Credentials[name]
	}
	if !ok {
		return fail(precondition("resource: tenant %q has no brokered credential %q", j.Tenant, name))
	}
	now := s.now()
	expires := now.Add(brokeredTTL(req.TTL, c.MaxTTL))
	if g.Deadline > 0 && !j.DispatchedAt.IsZero() {
		end := j.DispatchedAt.Add(g.Deadline)
		if !end.After(now) {
			return fail(precondition("job_id: job %q is past its deadline (%s)", j.ID, end.Format(time.RFC3339)))
		}
		if expires.After(end) {
			expires = end
		}
	}
	secret, err := s.brokeredValue(ctx, j.Tenant, c)
	if err != nil {
		return fail(err)
	}
	b := &Brokered{Name: name, Hosts: slices.Clone(c.Hosts), Header: c.Header, Format: c.Format, BasicUser: c.BasicUser}
	if c.UpstreamCA != "" {
		if b.UpstreamCA, err = s.cfg.ReadFile(c.UpstreamCA); err != nil {
			clear(secret)
			s.cfg.Logger.ErrorContext(ctx, "read brokered credential's upstream CA", "tenant", j.Tenant, "credential", name, "error", err)
			return fail(fmt.Errorf("%w: the upstream CA of the brokered credential %s cannot be read", errdefs.ErrUnavailable, name))
		}
	}
	l := store.Lease{ID: ids.New(), Purpose: PurposeBrokered, JobID: j.ID, Resource: name, Holder: caller.String(), IssuedAt: now, ExpiresAt: expires}
	return l, secret, b, nil
}

// brokeredTTL is a brokered lease's length: asked (or the credential's
// max), never more than the credential's max.
func brokeredTTL(asked, maxTTL time.Duration) time.Duration {
	if maxTTL <= 0 {
		maxTTL = DefaultBrokeredTTL
	}
	if asked <= 0 {
		return maxTTL
	}
	return min(asked, maxTTL)
}

// brokeredValue reads credential c's value from its file or the
// authority's environment. Neither the value nor the file's path goes to
// the caller; the path goes to the log.
func (s *Service) brokeredValue(ctx context.Context, tenant string, c policy.Credential) ([]byte, error) {
	var (
		v   []byte
		err error
	)
	switch {
	case c.File != "":
		v, err = s.cfg.ReadFile(c.File)
	case c.Env != "":
		v = []byte(s.cfg.Getenv(c.Env))
	default:
		err = errors.New("neither a file nor an environment variable")
	}
	if err == nil {
		// A file written by an editor or `echo` ends in a newline that no
		// header value may hold: one line ending is not the value.
		v = bytes.TrimSuffix(bytes.TrimSuffix(v, []byte("\n")), []byte("\r"))
	}
	if err == nil && len(strings.TrimSpace(string(v))) == 0 {
		err = errors.New("empty")
	}
	if err != nil {
		clear(v)
		s.cfg.Logger.ErrorContext(ctx, "read brokered credential", "tenant", tenant, "credential", c.Name, "file", c.File, "env", c.Env, "error", err)
		return nil, fmt.Errorf("%w: the brokered credential %s cannot be read", errdefs.ErrUnavailable, c.Name)
	}
	return v, nil
}

// RevokeRestarted ends the active brokered leases executor id (named
// name in the fleet) holds that were issued before startedAt, when it
// last started: they belonged to the process that stopped, whose proxies
// are gone. Each ends on the log, by caller (the authority itself).
func (s *Service) RevokeRestarted(ctx context.Context, caller identity.ID, id, name string, startedAt time.Time) (int, error) {
	now := s.now()
	reason := fmt.Sprintf("executor %s restarted", name)
	r := store.LeaseRevocation{Purpose: PurposeBrokered, At: now, Holder: id, IssuedBefore: startedAt}
	return approvals.Drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.RevokeLeasesAudited(ctx, r, batch, func(l store.Lease, _ store.State) audit.Event {
			return revoked(caller, l, now, reason)
		})
		return len(list), err
	})
}

// OnRestart returns the fleet's restart hook (fleet.Fleet.OnRestart):
// RevokeRestarted by caller, the authority itself.
func (s *Service) OnRestart(caller identity.ID) func(ctx context.Context, id, name string, startedAt time.Time) error {
	return func(ctx context.Context, id, name string, startedAt time.Time) error {
		n, err := s.RevokeRestarted(ctx, caller, id, name, startedAt)
		if n > 0 {
			s.cfg.Logger.InfoContext(ctx, "revoked the brokered leases of a restarted executor", "executor", name, "count", n)
		}
		return err
	}
}

// revokeEnded ends the active brokered leases of jobs that ended.
func (s *Service) revokeEnded(ctx context.Context, caller identity.ID, now time.Time) (int, error) {
	r := store.LeaseRevocation{Purpose: PurposeBrokered, At: now, JobEnded: true}
	return approvals.Drain(func(batch int) (int, error) {
		list, err := s.cfg.Store.RevokeLeasesAudited(ctx, r, batch, func(l store.Lease, st store.State) audit.Event {
			return revoked(caller, l, now, fmt.Sprintf("job %s ended (%s)", l.JobID, st))
		})
		return len(list), err
	})
}

func revoked(caller identity.ID, l store.Lease, at time.Time, reason string) audit.Event {
	return audit.Event{Kind: audit.KindLeaseRevoked, Caller: caller.String(), Subject: l.ID, JobID: l.JobID, Time: at,
		Outcome: audit.OutcomeAllowed, Reason: reason}
}
