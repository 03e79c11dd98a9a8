package runs

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/egressproxy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Brokered credentials: a job names credentials (Grant.Credentials) it
// never holds. When it starts, each is leased from the authority and given
// to its egress proxy alone, in memory, which adds it to the job's requests
// to the credential's hosts; the job sees a placeholder in its environment
// and trusts the proxy's per-job CA. No value is ever written to a file, a
// record, a log or the sandbox. The leases are revoked when the run ends,
// however it ends.

// CredentialLeaser leases brokered credentials from the authority for one
// job, and revokes them (the executor's authority client, behind an
// adapter in package server).
type CredentialLeaser interface {
	// LeaseBrokered leases the credential name for job jobID: how the
	// proxy uses it and its value.
	LeaseBrokered(ctx context.Context, jobID, name string) (BrokeredLease, error)
	// RevokeLease ends a lease; reason is for the authority's audit.
	RevokeLease(ctx context.Context, leaseID, reason string) error
}

// BrokeredLease is one leased brokered credential. Secret is the value:
// the run manager clears it once the proxy's credential is built.
type BrokeredLease struct {
	LeaseID, Name string
	// Hosts are the names the proxy adds it for: exact names and
	// "*.SUFFIX" patterns.
	Hosts []string
	// Header is the header the proxy sets; Format its value with
	// "{value}" for the secret, or BasicUser, when set, makes it
	// "Basic base64(BasicUser:secret)".
	Header, Format, BasicUser string
	// UpstreamCA, if set, is the PEM CAs the hosts' certificates must
	// chain to instead of the executor's trust store.
	UpstreamCA []byte
	Secret     []byte
	Expires    time.Time
}

// ReasonCredentialUnavailable ends a run whose brokered credentials could
// not be leased or put in force: it never ran.
const ReasonCredentialUnavailable sandbox.Reason = "credential_unavailable"

// ErrCredential marks a start that failed on a brokered credential
// (ReasonCredentialUnavailable).
var ErrCredential = errors.New("brokered credential unavailable")

const (
	// placeholderPrefix, the name and a colon, then random characters, is
	// a credential's placeholder: what the job sends where the value goes.
	placeholderPrefix = "airlock-cred:"
	// leaseTimeout bounds leasing one credential, revokeTimeout revoking
	// all of a job's.
	leaseTimeout  = 15 * time.Second
	revokeTimeout = 10 * time.Second
)

// checkCredentials refuses a grant naming brokered credentials that this
// executor cannot give it: none without a leaser, a domains policy (the
// proxy is what adds them) and a class that takes the proxy's CA.
func (m *Manager) checkCredentials(g Grant) error {
	if len(g.Credentials) == 0 {
		return nil
	}
	switch {
	case m.cfg.Credentials == nil:
		return fmt.Errorf("%w: grant credentials: this executor leases no brokered credentials", errdefs.ErrFailedPrecondition)
	case m.cfg.Network == nil || !g.Network.domains():
		// The authority grants credentials only to a domains job; defend.
		return fmt.Errorf("%w: grant credentials: only a job with a domains network policy (its egress proxy adds them) may have brokered credentials", errdefs.ErrFailedPrecondition)
	case g.Class == sandbox.ClassVM:
		return fmt.Errorf("%w: grant credentials: the %s class cannot trust its egress proxy's CA; brokered credentials need runc or runsc", errdefs.ErrFailedPrecondition, g.Class)
	}
	seen := map[string]string{}
	for _, name := range g.Credentials {
		env := credentialEnv(name)
		if other, ok := seen[env]; ok {
			return fmt.Errorf("%w: grant credentials %q and %q: both would be %s", errdefs.ErrInvalidArgument, other, name, env)
		}
		seen[env] = name
	}
	return nil
}

// credentialEnv is the variable holding credential name's placeholder.
func credentialEnv(name string) string { return runspec.CredentialEnv(name) }

// leasedCredential is what a job's egress keeps of a lease to end it.
type leasedCredential struct {
	leaseID, name string
}

// brokered is a job's leased brokered credentials before its egress proxy
// is made with them: the proxy's credentials, the leases to end, and the
// job's variables (each credential's placeholder).
type brokered struct {
	creds  []egressproxy.Credential
	leases []leasedCredential
	env    map[string]string
}

// leaseCredentials leases g's brokered credentials for its egress proxy.
// On an error (ErrCredential) it has revoked what it leased.
func (m *Manager) leaseCredentials(ctx context.Context, g Grant) (_ *brokered, err error) {
	b := &brokered{env: map[string]string{}}
	defer func() {
		if err != nil {
			revokeLeases(m.cfg.Credentials, m.cfg.Logger.With("job_id", g.JobID), b.leases, "the job's start failed")
			for i := range b.creds {
				b.creds[i].Value, b.creds[i].Secret = "", ""
			}
			err = fmt.Errorf("%w: %w", ErrCredential, err)
		}
	}()
	for _, name := range g.Credentials {
		lctx, cancel := context.WithTimeout(ctx, leaseTimeout)
		l, err := m.cfg.Credentials.LeaseBrokered(lctx, g.JobID, name)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%q: lease: %w", name, err)
		}
		if l.LeaseID != "" {
			b.leases = append(b.leases, leasedCredential{leaseID: l.LeaseID, name: name})
		}
		c, err := m.proxyCredential(l, name, g.Network.Names)
		clear(l.Secret)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", name, err)
		}
		b.env[credentialEnv(name)] = c.Placeholder
		b.creds = append(b.creds, c)
		m.cfg.Logger.Info("brokered credential leased", "job_id", g.JobID, "credential", name, "lease_id", l.LeaseID, "hosts", c.Hosts, "expires", c.Expires)
	}
	return b, nil
}

// proxyCredential is lease l of credential name as the proxy uses it. It
// refuses a lease that is not what was asked for or that names a host pol
// does not allow (the authority checks both; defend).
func (m *Manager) proxyCredential(l BrokeredLease, name string, pol egress.Policy) (egressproxy.Credential, error) {
	switch {
	case l.Name != name:
		return egressproxy.Credential{}, fmt.Errorf("the authority leased %q instead", l.Name)
	case l.LeaseID == "":
		return egressproxy.Credential{}, errors.New("the lease has no id")
	case len(l.Secret) == 0:
		return egressproxy.Credential{}, errors.New("the lease has no value")
	case l.Header == "":
		return egressproxy.Credential{}, errors.New("the lease names no header")
	case len(l.Hosts) == 0:
		return egressproxy.Credential{}, errors.New("the lease names no host")
	case l.BasicUser == "" && !strings.Contains(l.Format, "{value}"):
		return egressproxy.Credential{}, errors.New("the lease's format has no {value} and it has no basic user")
	}
	for _, h := range l.Hosts {
		if !pol.AllowsName(h) {
			return egressproxy.Credential{}, fmt.Errorf("host %q is not a name the job's network policy allows", h)
		}
	}
	roots := m.roots
	if len(l.UpstreamCA) > 0 {
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(l.UpstreamCA) {
			return egressproxy.Credential{}, errors.New("the lease's upstream CA holds no PEM certificate")
		}
	}
	value := strings.ReplaceAll(l.Format, "{value}", string(l.Secret))
	if l.BasicUser != "" {
		value = "Basic " + base64.StdEncoding.EncodeToString([]byte(l.BasicUser+":"+string(l.Secret)))
	}
	var nonce [24]byte
	rand.Read(nonce[:]) // never fails (crypto/rand)
	return egressproxy.Credential{
		Name: name, Hosts: l.Hosts, Header: l.Header, Value: value, Secret: string(l.Secret),
		Placeholder: placeholderPrefix + name + ":" + base64.RawURLEncoding.EncodeToString(nonce[:]),
		Roots:       roots, Expires: l.Expires,
	}, nil
}

// trustPool is pem's certificates as a pool, for the upstreams of
// credentials whose lease names no CA; nil (the system's roots) when pem
// is empty.
func trustPool(pem []byte) *x509.CertPool {
	if len(pem) == 0 {
		return nil
	}
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(pem)
	return p
}

// setCredentials puts creds in the proxy and keeps them, in memory only,
// so a narrower policy can drop some (dropCredentials).
func (e *jobEgress) setCredentials(creds []egressproxy.Credential) error {
	if err := e.proxy.SetCredentials(creds); err != nil {
		return err
	}
	e.creds = creds
	return nil
}

// dropCredentials takes out of the proxy the credentials with a host pol
// no longer allows (the proxy's SetPolicy already refuses the host); a
// dropped one is not put back should a later policy allow it again.
func (e *jobEgress) dropCredentials(pol egress.Policy) error {
	var kept []egressproxy.Credential
	var dropped []string
	for _, c := range e.creds {
		ok := true
		for _, h := range c.Hosts {
			ok = ok && pol.AllowsName(h)
		}
		if ok {
			kept = append(kept, c)
		} else {
			dropped = append(dropped, c.Name)
		}
	}
	if len(dropped) == 0 {
		return nil
	}
	if err := e.setCredentials(kept); err != nil {
		return err
	}
	e.log.Info("brokered credentials dropped: the network policy no longer allows their hosts", "credentials", dropped)
	return nil
}

// revoke takes every credential out of the proxy, then revokes each lease
// (revokeLeases).
func (e *jobEgress) revoke(reason string) {
	if e.proxy != nil && e.creds != nil {
		if err := e.proxy.SetCredentials(nil); err != nil {
			e.log.Error("egress proxy: drop brokered credentials", "error", err)
		}
	}
	e.creds = nil
	revokeLeases(e.leaser, e.log, e.leases, reason)
	e.leases = nil
}

// revokeLeases revokes each of leases, best effort within revokeTimeout;
// what fails is logged (the authority ends the leases with the job or the
// executor anyway).
func revokeLeases(leaser CredentialLeaser, log *slog.Logger, leases []leasedCredential, reason string) {
	if len(leases) == 0 || leaser == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
	defer cancel()
	for _, l := range leases {
		if err := leaser.RevokeLease(ctx, l.leaseID, reason); err != nil {
			log.Warn("brokered credential: revoke lease", "credential", l.name, "lease_id", l.leaseID, "error", err)
			continue
		}
		log.Info("brokered credential revoked", "credential", l.name, "lease_id", l.leaseID, "reason", reason)
	}
}
