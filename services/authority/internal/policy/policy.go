// Package policy owns a tenant's policy as the authority enforces it: who
// acts for the tenant, which repositories it may use and how to reach them,
// its resource defaults and ceilings, the runtime classes and the egress its
// jobs may ask for. The authority's config package builds it from the file;
// the jobs package checks every job against it. It imports nothing of gRPC.
package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// Limits bound one job. In a Tenant they are complete (no zero fields).
type Limits struct {
	CPUMillis   int64
	MemoryBytes int64
	Pids        int64
	DiskBytes   int64
	Deadline    time.Duration
}

// Built-in defaults and ceilings, used for whatever a tenant's policy leaves
// out. They are modest on purpose: a tenant that needs more says so.
var (
	DefaultLimits = Limits{CPUMillis: 1000, MemoryBytes: 512 << 20, Pids: 256, DiskBytes: 1 << 30, Deadline: 10 * time.Minute}
	DefaultMax    = Limits{CPUMillis: 2000, MemoryBytes: 2 << 30, Pids: 1024, DiskBytes: 4 << 30, Deadline: time.Hour}
)

// The runtime classes this build knows, by their config names.
const (
	RuntimeRunc  = "runc"
	RuntimeRunsc = "runsc"
	RuntimeVM    = "vm"
)

// RuntimeClasses returns every known runtime class, in a fixed order.
func RuntimeClasses() []string { return []string{RuntimeRunc, RuntimeRunsc, RuntimeVM} }

// Repository is one repository a tenant may run jobs on.
type Repository struct {
	// Tenant and Name identify it; the name is what a job spec says.
	Tenant, Name string
	// URL is an absolute local path, a file:// URL or an https:// URL.
	URL string
	// Credential is the path of a file holding the fetch credential, or "".
	// Only the source package reads it, and only to hand it to git.
	Credential string
	// CA is the path of a PEM bundle of the certificate authorities git
	// trusts for an https URL (its http.sslCAInfo), or "" for git's default.
	CA string
}

// IsLocal reports whether the repository is a local path used in place
// rather than a URL fetched into a mirror.
func (r Repository) IsLocal() bool { return strings.HasPrefix(r.URL, "/") }

// Egress is what a tenant's jobs may be allowed to reach.
type Egress struct {
	// CIDRs an allow-list rule must fall within.
	CIDRs []netip.Prefix
	// Domains a domain-list entry must match; "*.example.com" covers one label.
	Domains []string
}

// ceiling is e in pkg/egress's terms: every port of its prefixes and names.
func (e Egress) ceiling() egress.Policy {
	var c egress.Policy
	for _, p := range e.CIDRs {
		c.Rules = append(c.Rules, egress.Rule{Prefix: p})
	}
	for _, d := range e.Domains {
		c.Names = append(c.Names, egress.Name{Name: d})
	}
	return c
}

// AllowsPrefix reports whether every address of p lies within one of the
// tenant's CIDRs.
func (e Egress) AllowsPrefix(p netip.Prefix) bool { return e.ceiling().AllowsPrefix(p) }

// AllowsDomain reports whether d (a name or a "*." wildcard) is covered by
// one of the tenant's domains: equal to it, or one label below a wildcard.
// A wildcard request is covered only by the same wildcard.
func (e Egress) AllowsDomain(d string) bool { return e.ceiling().AllowsName(d) }

// Tenant is one tenant's whole policy.
type Tenant struct {
	Name string
	// Clients are the principals ("client/NAME") who act for the tenant.
	Clients []string
	// Repositories by name.
	Repositories map[string]Repository
	// Default fills a job's zero limits; Max is the ceiling no job may pass.
	Default, Max Limits
	// RuntimeClasses allowed, the first being the default.
	RuntimeClasses []string
	// Egress bounds what allow and domain policies may name.
	Egress Egress
	// Approvals says who approves the tenant's results and how.
	Approvals Approvals
	// DeployCredentials maps a publish target repository name to the path of
	// a file holding its deploy credential. Only the approvals package
	// reads it, when it leases the credential; it is never stored or logged.
	DeployCredentials map[string]string
	// StartDeadline is how long a job may wait for an executor to accept
	// it, from its submission; its grant is renewed until then.
	StartDeadline time.Duration
	// Quota bounds what the tenant's jobs hold at once.
	Quota Quota
	// Publish is what the tenant's approved results may write.
	Publish Publish
	// GitHistoryDepth is how many commits of the repository's own history
	// a job's .git holds, counted as git clone --depth counts: 1 is the
	// base commit alone.
	GitHistoryDepth int
	// Sessions bounds the tenant's sessions.
	Sessions Sessions
	// WarmPool is how many sandboxes of the tenant's job shape each
	// executor is asked to keep ready (0 to runspec.MaxWarmPool).
	WarmPool int
	// Caches are the named caches its jobs may ask for, by name.
	Caches map[string]Cache
	// User is who a job runs as when its spec names no one.
	User runspec.User
	// AllowRoot lets a job ask to run as root (uid 0) when User is not
	// root; any other user's ids may be asked for (runspec.CheckUser).
	AllowRoot bool
	// Images is which OCI images its jobs may run on, and how the
	// authority reaches their registries.
	Images Images
	// Credentials are the brokered credentials its jobs may ask for, by
	// name: used by a job's egress proxy on its hosts, never held by the
	// job.
	Credentials map[string]Credential
	// PortForward is how its clients may reach ports inside its sessions;
	// nil, they may not.
	PortForward *PortForward
}

// Credential is a brokered credential: a secret the authority holds that
// the egress proxy of a job that asks for it by name adds to the job's
// requests to its hosts, so the job uses it without ever holding it.
type Credential struct {
	// Name is its name in the tenant's policy, what a job asks for.
	Name string
	// Hosts are the names it is added for: exact names and "*.SUFFIX"
	// patterns (one or more labels), normalised (egress.NormalizeName).
	Hosts []string
	// Header is the header the proxy sets, replacing any the job sent
	// ("Authorization" by default).
	Header string
	// Format is the header's value, "{value}" standing for the secret
	// ("Bearer {value}" by default); unused with BasicUser.
	Format string
	// BasicUser, when set, makes the header "Basic base64(user:value)".
	BasicUser string
	// File is the path of a file holding the secret, or Env the name of
	// the authority's environment variable holding it: exactly one is
	// set. Only the leases package reads them.
	File, Env string
	// ApprovalRequired holds a job that asks for it until an approver
	// (never the requester) approves its start.
	ApprovalRequired bool
	// MaxTTL bounds a lease of it; a job's lease also ends with the job.
	MaxTTL time.Duration
	// UpstreamCA is the path of a PEM bundle the hosts' certificates must
	// chain to, or "" for the executor's roots.
	UpstreamCA string
}

// HostImage is the name of the executor's host template (the host's /usr,
// read-only) where a job names an image.
const HostImage = "host"

// Images is a tenant's image policy. With no Allowed patterns its jobs run
// on the host template only.
type Images struct {
	// Default is the image a job that names none runs on: a reference, or
	// HostImage ("" is HostImage too).
	Default string
	// Allowed are the images a job may name; the host template is always
	// allowed.
	Allowed []ImagePattern
	// MaxBytes bounds an image's size (config and compressed layers); 0 is
	// DefaultMaxImageBytes.
	MaxBytes int64
	// Registries are how to reach each registry host ("host[:port]"): its
	// CA and the tenant's credential for it. A registry missing here is
	// reached with the system's roots and no credential.
	Registries map[string]Registry
}

// DefaultMaxImageBytes bounds an image's size where the policy names no
// max_size.
const DefaultMaxImageBytes = 4 << 30

// ImagePattern allows images of one registry: one repository, every
// repository below a path (Prefix), and optionally only one digest.
type ImagePattern struct {
	// Registry is "host[:port]"; Repository is a path within it, ""
	// with Prefix for every repository of the registry.
	Registry, Repository string
	// Prefix allows every repository below Repository ("team/*").
	Prefix bool
	// Digest, if set, is the only manifest digest allowed (pinned): the
	// platform manifest's, or the multi-arch index's it was picked from.
	Digest string
}

// String is the pattern as the policy file writes it.
func (p ImagePattern) String() string {
	s := p.Registry
	if p.Repository != "" {
		s += "/" + p.Repository
	}
	if p.Prefix {
		s += "/*"
	}
	if p.Digest != "" {
		s += "@" + p.Digest
	}
	return s
}

// Matches reports whether the pattern allows repository repo of registry
// reg (any digest; Digest is checked once the reference is resolved).
func (p ImagePattern) Matches(reg, repo string) bool {
	if reg != p.Registry {
		return false
	}
	if !p.Prefix {
		return repo == p.Repository
	}
	return p.Repository == "" || strings.HasPrefix(repo, p.Repository+"/")
}

// Registry is how the authority reaches one registry for a tenant.
type Registry struct {
	// Credential is the path of a file holding "USERNAME:PASSWORD" for the
	// registry's basic or token authentication, or "". Only the images
	// package reads it, for each request; it never leaves the authority.
	Credential string
	// CA is the path of a PEM bundle of the certificate authorities the
	// registry's certificate must chain to, or "" for the system's.
	CA string
}

// UserAllowed says why t's jobs may not run as u, "" when they may.
func (t *Tenant) UserAllowed(u runspec.User) string {
	if u.IsRoot() && !t.User.IsRoot() && !t.AllowRoot {
		return fmt.Sprintf("tenant %q runs jobs as %s (%s) and does not allow root (its policy's allow_root)", t.Name, t.User.Name(), t.User)
	}
	return ""
}

// Cache is one named cache a tenant's jobs may mount: kept by the
// executor per (tenant, repository, name), seen by the job at Path, wiped
// once a commit leaves it above MaxSize bytes.
type Cache struct {
	Path    string
	MaxSize int64
}

// Sessions bounds a tenant's sessions: how long one may sit with no exec
// running, and how many execs may run in it at once. A session that names
// neither takes the default; none may ask for more than the ceiling, at
// submission or by a change while it runs. DefaultOnIdle is what one that
// does not say does once idle past its timeout (OnIdleEnd or
// OnIdleSleep); ForbidSleep refuses OnIdleSleep.
type Sessions struct {
	DefaultIdleTimeout, MaxIdleTimeout         time.Duration
	DefaultConcurrentExecs, MaxConcurrentExecs int
	DefaultOnIdle                              string
	ForbidSleep                                bool
}

// What a session idle past its timeout does: it ends, or it sleeps
// (suspended, its files kept, until its next exec or file call wakes it).
const (
	OnIdleEnd   = "end"
	OnIdleSleep = "sleep"
)

// DefaultSessions are the session defaults and ceilings where a tenant's
// policy leaves them out.
var DefaultSessions = Sessions{DefaultIdleTimeout: 15 * time.Minute, MaxIdleTimeout: 24 * time.Hour, DefaultConcurrentExecs: 4, MaxConcurrentExecs: 16,
	DefaultOnIdle: OnIdleEnd}

// Bounds on what a tenant's policy may set for its sessions.
const (
	MinIdleTimeout        = time.Second
	MaxIdleTimeoutCeiling = 7 * 24 * time.Hour
	MaxExecsCeiling       = 64
)

// Filled is s with each zero field completed as CompletePair completes
// one from the built-in DefaultSessions.
func (s Sessions) Filled() Sessions {
	di, mi := int64(s.DefaultIdleTimeout), int64(s.MaxIdleTimeout)
	CompletePair(&di, &mi, int64(DefaultSessions.DefaultIdleTimeout), int64(DefaultSessions.MaxIdleTimeout))
	de, me := int64(s.DefaultConcurrentExecs), int64(s.MaxConcurrentExecs)
	CompletePair(&de, &me, int64(DefaultSessions.DefaultConcurrentExecs), int64(DefaultSessions.MaxConcurrentExecs))
	return Sessions{DefaultIdleTimeout: time.Duration(di), MaxIdleTimeout: time.Duration(mi), DefaultConcurrentExecs: int(de), MaxConcurrentExecs: int(me),
		DefaultOnIdle: cmp.Or(s.DefaultOnIdle, OnIdleEnd), ForbidSleep: s.ForbidSleep}
}

// CompletePair completes a default and its ceiling, either of which a
// policy may leave out (zero): an omitted default is the built-in one,
// lowered to the ceiling; an omitted ceiling is the built-in one, raised
// to the default. So writing only one side never gives a default above
// its ceiling.
func CompletePair(def, ceil *int64, builtinDef, builtinMax int64) {
	switch {
	case *def == 0 && *ceil == 0:
		*def, *ceil = builtinDef, builtinMax
	case *def == 0:
		*def = min(builtinDef, *ceil)
	case *ceil == 0:
		*ceil = max(builtinMax, *def)
	}
}

// Publish is a tenant's publish policy: the content rules the publisher
// applies before it spends an approval, and what it does when the target
// branch moved past a job's base.
type Publish struct {
	Content contentcheck.Policy
	// OnMoved is OnMovedReapply (the default) or OnMovedRefuse.
	OnMoved string
}

// What the publisher does when the target branch moved past a job's base.
const (
	OnMovedReapply = "reapply"
	OnMovedRefuse  = "refuse"
)

// Digest names the policy: sha256 of its content rules' canonical digest
// and OnMoved. The publisher records it on each deployment.
func (p Publish) Digest() string {
	sum := sha256.Sum256([]byte("airlock.publish.policy.v1\n" + p.Content.Digest() + "\n" + p.OnMoved + "\n"))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Quota bounds the jobs a tenant has dispatched and not yet ended: how
// many, and their memory and CPU limits summed. Zero is no bound. A job
// beyond it waits, queued, until one of the tenant's jobs ends; a job that
// could never fit is refused at submission.
type Quota struct {
	RunningJobs int64
	MemoryBytes int64
	CPUMillis   int64
	// QueuedJobs bounds the tenant's jobs waiting to start; a submission
	// beyond it is refused. Default DefaultQueuedJobs.
	QueuedJobs int64
}

// DefaultQueuedJobs is how many jobs a tenant may have queued at once when
// its policy does not say.
const DefaultQueuedJobs = 1000

// A job's git history depth: the base commit alone unless the tenant's
// policy says more, and never more than MaxGitHistoryDepth, which bounds
// the commits the authority walks and packs for one job.
const (
	DefaultGitHistoryDepth = 1
	MaxGitHistoryDepth     = 1000
)

// Default approval settings.
const (
	DefaultApprovalTTL      = 24 * time.Hour
	DefaultRequiredApproval = 1
	DefaultStartDeadline    = time.Hour
)

// Approvals is a tenant's approval policy.
type Approvals struct {
	// Approvers are principals ("approver/NAME"); empty means any approver.
	Approvers []string
	// Required is how many approvals a request needs; at least 1.
	Required int
	// TTL is how long a request may wait to be decided and consumed.
	TTL time.Duration
	// Widening says what happens when a client asks to widen a running
	// job's limits or network policy (within the tenant's ceilings and
	// egress): WidenApprove (the default), WidenAllow or WidenDeny.
	// Narrowing is never gated.
	Widening string
}

// What a tenant's policy does with a request to widen a running job.
const (
	// WidenApprove opens a change approval; the change applies once
	// approved.
	WidenApprove = "approve"
	// WidenAllow applies it at once (audited).
	WidenAllow = "allow"
	// WidenDeny refuses it; the job must be resubmitted.
	WidenDeny = "deny"
)

// AllowsApprover reports whether principal ("approver/NAME") may decide the
// tenant's requests.
func (a Approvals) AllowsApprover(principal string) bool {
	return len(a.Approvers) == 0 || slices.Contains(a.Approvers, principal)
}

// HasClient reports whether principal ("client/NAME") acts for the tenant.
func (t *Tenant) HasClient(principal string) bool { return slices.Contains(t.Clients, principal) }

// Tenants is every tenant by name.
type Tenants map[string]*Tenant

// CheckName checks a tenant or repository name: lower-case letters, digits,
// '.', '-' and '_', starting with a letter or digit, at most 63 characters.
// Names end up in file names and log lines, so they are kept plain.
func CheckName(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if len(s) > 63 {
		return fmt.Errorf("%q is longer than 63 characters", s)
	}
	for i, r := range s {
		ok := ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || (i > 0 && (r == '.' || r == '-' || r == '_'))
		if !ok {
			return fmt.Errorf("%q: use lower-case letters, digits, '.', '-' and '_', starting with a letter or digit", s)
		}
	}
	return nil
}
