// Package config owns the authority's config file: the common server part
// from pkg/config, the executor it dispatches to, the grant-signing key and
// the tenants' policies, validated once into a policy.Tenants the domain
// uses without further checks. Only the authority's main and composition
// root import it.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	"github.com/airlockhq/airlock/services/authority/internal/checkpoints"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// DefaultGrantTTL is how long a grant may wait for an executor to accept
// it when the file does not say.
const DefaultGrantTTL = 10 * time.Minute

// Config is the authority's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Executor is the executor the authority dispatches grants to.
	Executor config.Peer `yaml:"executor"`
	// GrantKey is the Ed25519 PKCS#8 PEM key grants are signed with;
	// default <data_dir>/grant.key, created (0600, with grant.key.pub beside
	// it) when missing. It may instead name an existing directory of *.key
	// files, for a rotation: the last by name signs, and every one's public
	// key is written to <grant_key>.pub for the executors' trusted set.
	GrantKey string `yaml:"grant_key"`
	// GrantTTL is how long a grant may wait before an executor must start
	// it; default 10m.
	GrantTTL time.Duration `yaml:"grant_ttl"`
	// Tenants maps a tenant name to its policy as written.
	Tenants map[string]TenantFile `yaml:"tenants"`
	// Store is where the authority keeps jobs and the audit log; default
	// SQLite in the data directory.
	Store StoreFile `yaml:"store"`
	// Audit says who reads the whole audit log and how its head is
	// anchored outside the database.
	Audit AuditFile `yaml:"audit"`

	// Policy is Tenants, validated, with defaults filled in.
	Policy policy.Tenants `yaml:"-"`

	// base is the config file's directory, for relative paths.
	base string
}

// AuditFile configures the audit log's readers and its checkpoints.
type AuditFile struct {
	// Auditors are approver principals (approver/NAME) who read and verify
	// the whole log; every other approver reads only the entries of the
	// tenants that list it. Default none.
	Auditors []string `yaml:"auditors"`
	// CheckpointKey is the Ed25519 PKCS#8 PEM key checkpoints of the log's
	// head are signed with; it must not live in the database, nor be the
	// grant key. Default <data_dir>/audit-checkpoint.key, created (0600,
	// with audit-checkpoint.key.pub beside it) when missing.
	CheckpointKey string `yaml:"checkpoint_key"`
	// CheckpointFile is the append-only file the signed checkpoints are
	// written to (one JSON line each); default
	// <data_dir>/audit-checkpoints.jsonl.
	CheckpointFile string `yaml:"checkpoint_file"`
	// CheckpointEvery is the most entries between two checkpoints; default
	// 100, between 1 and 100000.
	CheckpointEvery int64 `yaml:"checkpoint_every"`
	// CheckpointInterval is the longest a new entry waits for a
	// checkpoint; default 1m, between 1s and 24h.
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
}

// validate checks the audit section and fills in its defaults.
func (a *AuditFile) validate(c *Config) error {
	auditors, errs := principals("audit.auditors", c.checkedTrustDomain(), identity.KindApprover, a.Auditors)
	a.Auditors = auditors
	for _, f := range []struct {
		field, def string
		v          *string
	}{
		{"audit.checkpoint_key", "audit-checkpoint.key", &a.CheckpointKey},
		{"audit.checkpoint_file", "audit-checkpoints.jsonl", &a.CheckpointFile},
	} {
		if *f.v == "" {
			if c.DataDir != "" {
				*f.v = filepath.Join(c.DataDir, f.def)
			}
			continue
		}
		*f.v = resolve(c.base, *f.v)
	}
	if a.CheckpointKey != "" && a.CheckpointKey == c.GrantKey {
		errs = append(errs, config.Field("audit.checkpoint_key", "%s is the grant key: checkpoints need a key of their own", a.CheckpointKey))
	}
	switch {
	case a.CheckpointEvery == 0:
		a.CheckpointEvery = checkpoints.DefaultEvery
	case a.CheckpointEvery < 1 || a.CheckpointEvery > 100000:
		errs = append(errs, config.Field("audit.checkpoint_every", "%d: must be between 1 and 100000", a.CheckpointEvery))
	}
	switch {
	case a.CheckpointInterval == 0:
		a.CheckpointInterval = checkpoints.DefaultInterval
	case a.CheckpointInterval < time.Second || a.CheckpointInterval > 24*time.Hour:
		errs = append(errs, config.Field("audit.checkpoint_interval", "%v: must be between 1s and 24h", a.CheckpointInterval))
	}
	return errors.Join(errs...)
}

// TenantFile is one tenant as the file writes it.
type TenantFile struct {
	// Clients are principals (client/NAME) who act for the tenant.
	Clients []string `yaml:"clients"`
	// Repositories maps a repository name to where it is.
	Repositories map[string]RepositoryFile `yaml:"repositories"`
	// Limits are the defaults and ceilings of job resources.
	Limits LimitsFile `yaml:"limits"`
	// RuntimeClasses are the allowed runtime classes; the first is the
	// default. Default [runc].
	RuntimeClasses []string `yaml:"runtime_classes"`
	// Egress bounds what allow and domain network policies may name.
	Egress EgressFile `yaml:"egress"`
	// Approvals is who approves the tenant's results, how many approvals a
	// request needs and how long it lives.
	Approvals ApprovalsFile `yaml:"approvals"`
	// DeployCredentials maps a repository name (a publish target) to a file
	// holding its deploy credential, read only when it is leased.
	DeployCredentials map[string]string `yaml:"deploy_credentials"`
	// StartDeadline is how long a job may wait for an executor, from its
	// submission; default 1h, between 1m and 168h.
	StartDeadline time.Duration `yaml:"start_deadline"`
	// Quota bounds the tenant's dispatched, unfinished jobs: how many, and
	// their memory and CPU limits summed; 0 or omitted is no bound. Beyond
	// it a job waits, queued.
	Quota QuotaFile `yaml:"quota"`
	// Publish is what the tenant's approved results may write: checked by
	// the publisher before an approval is spent.
	Publish PublishFile `yaml:"publish"`
	// GitHistoryDepth is how many commits of history a job's /work/.git
	// holds, the base commit included; default 1, between 1 and 1000.
	GitHistoryDepth int `yaml:"git_history_depth"`
	// Sessions bounds the tenant's sessions: a default and a ceiling of
	// their idle timeout and of how many execs run at once.
	Sessions SessionsFile `yaml:"sessions"`
}

// SessionsFile is a tenant's session bounds as the file writes them.
// Omitted fields take built-in values (15m up to 24h idle, 4 up to 16
// execs at once), a default lowered to its ceiling and a ceiling raised to
// its default.
type SessionsFile struct {
	// DefaultIdleTimeout and MaxIdleTimeout: between 1s and 168h.
	DefaultIdleTimeout time.Duration `yaml:"default_idle_timeout"`
	MaxIdleTimeout     time.Duration `yaml:"max_idle_timeout"`
	// DefaultConcurrentExecs and MaxConcurrentExecs: between 1 and 64.
	DefaultConcurrentExecs int `yaml:"default_concurrent_execs"`
	MaxConcurrentExecs     int `yaml:"max_concurrent_execs"`
}

// sessions checks a tenant's session bounds and fills in their defaults.
func sessions(field string, f SessionsFile) (policy.Sessions, []error) {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"default_idle_timeout", f.DefaultIdleTimeout}, {"max_idle_timeout", f.MaxIdleTimeout}} {
		if d.v != 0 && (d.v < policy.MinIdleTimeout || d.v > policy.MaxIdleTimeoutCeiling) {
			errs = append(errs, config.Field(field+"."+d.name, "%v: must be between %v and %v", d.v, policy.MinIdleTimeout, policy.MaxIdleTimeoutCeiling))
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"default_concurrent_execs", f.DefaultConcurrentExecs}, {"max_concurrent_execs", f.MaxConcurrentExecs}} {
		if n.v < 0 || n.v > policy.MaxExecsCeiling {
			errs = append(errs, config.Field(field+"."+n.name, "%d: must be between 1 and %d", n.v, policy.MaxExecsCeiling))
		}
	}
	s := policy.Sessions{DefaultIdleTimeout: f.DefaultIdleTimeout, MaxIdleTimeout: f.MaxIdleTimeout,
		DefaultConcurrentExecs: f.DefaultConcurrentExecs, MaxConcurrentExecs: f.MaxConcurrentExecs}.Filled()
	if s.MaxIdleTimeout < s.DefaultIdleTimeout {
		errs = append(errs, config.Field(field+".max_idle_timeout", "ceiling %v is below the default %v", s.MaxIdleTimeout, s.DefaultIdleTimeout))
	}
	if s.MaxConcurrentExecs < s.DefaultConcurrentExecs {
		errs = append(errs, config.Field(field+".max_concurrent_execs", "ceiling %d is below the default %d", s.MaxConcurrentExecs, s.DefaultConcurrentExecs))
	}
	return s, errs
}

// PublishFile is a tenant's publish policy as the file writes it.
type PublishFile struct {
	// Protected lists path globs protected beyond the built-in
	// .github/workflows/**, CODEOWNERS and .gitleaks*: a result that
	// touches one is refused unless AllowProtected matches it too.
	Protected []string `yaml:"protected"`
	// AllowProtected lists protected path globs results may change.
	AllowProtected []string `yaml:"allow_protected"`
	// MaxFileSize caps each file a result writes; default 10MiB.
	MaxFileSize config.ByteSize `yaml:"max_file_size"`
	// AllowBinary lets results add or change binary files; default false.
	AllowBinary bool `yaml:"allow_binary"`
	// OnMoved is what happens when the branch moved past the job's base:
	// reapply (default: re-apply on the new tip if the patch applies
	// cleanly) or refuse.
	OnMoved string `yaml:"on_moved"`
}

// QuotaFile is a tenant's quota as the file writes it.
type QuotaFile struct {
	RunningJobs int64           `yaml:"running_jobs"`
	Memory      config.ByteSize `yaml:"memory"`
	CPUMillis   int64           `yaml:"cpu_millis"`
	// QueuedJobs bounds the jobs waiting to start; default 1000, at most
	// 100000.
	QueuedJobs int64 `yaml:"queued_jobs"`
}

// ApprovalsFile is the tenant's approval policy as the file writes it.
type ApprovalsFile struct {
	// Approvers are approver/NAME principals; empty means any approver.
	Approvers []string `yaml:"approvers"`
	// Required approvals; default 1, at most the number of approvers listed.
	Required int `yaml:"required"`
	// TTL of a request; default 24h, between 1m and 30 days.
	TTL time.Duration `yaml:"ttl"`
	// Widening is what a request to widen a running job's limits or
	// network policy gets: approve (default: a change approval), allow or
	// deny. Narrowing always applies at once.
	Widening string `yaml:"widening"`
}

// RepositoryFile is one repository as the file writes it.
type RepositoryFile struct {
	// URL is an absolute path, a file:// URL or an https:// URL.
	URL string `yaml:"url"`
	// Credential is a file holding the fetch credential; optional.
	Credential string `yaml:"credential"`
	// CA is a PEM file of the certificate authorities an https URL's
	// server must chain to, for a server whose certificate a private CA
	// issued (the dev stack's git server); optional, only with https.
	CA string `yaml:"ca"`
}

// LimitsFile holds the default and maximum limits.
type LimitsFile struct {
	Default LimitSet `yaml:"default"`
	Max     LimitSet `yaml:"max"`
}

// LimitSet is one set of limits; omitted fields take built-in values.
type LimitSet struct {
	CPUMillis int64           `yaml:"cpu_millis"`
	Memory    config.ByteSize `yaml:"memory"`
	Pids      int64           `yaml:"pids"`
	Disk      config.ByteSize `yaml:"disk"`
	Deadline  time.Duration   `yaml:"deadline"`
}

// EgressFile is the tenant's permitted egress.
type EgressFile struct {
	CIDRs   []string `yaml:"cidrs"`
	Domains []string `yaml:"domains"`
}

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service: it checks everything beyond the
// common part and builds Policy.
func (c *Config) ValidatePeers() error {
	errs := []error{config.ValidatePeer("executor", c.Executor)}
	if c.GrantKey == "" {
		if c.DataDir != "" {
			c.GrantKey = filepath.Join(c.DataDir, "grant.key")
		}
	} else {
		c.GrantKey = resolve(c.base, c.GrantKey)
	}
	switch {
	case c.GrantTTL == 0:
		c.GrantTTL = DefaultGrantTTL
	case c.GrantTTL < 10*time.Second || c.GrantTTL > 24*time.Hour:
		errs = append(errs, config.Field("grant_ttl", "%v: must be between 10s and 24h", c.GrantTTL))
	}
	errs = append(errs, c.Store.Validate("authority.db"), c.Audit.validate(c))
	c.Policy = policy.Tenants{}
	for _, name := range sortedKeys(c.Tenants) {
		t, err := c.tenant(name, c.Tenants[name])
		errs = append(errs, err)
		if err == nil {
			c.Policy[name] = t
		}
	}
	return errors.Join(errs...)
}

func (c *Config) tenant(name string, f TenantFile) (*policy.Tenant, error) {
	field := "tenants." + name
	if err := policy.CheckName(name); err != nil {
		return nil, config.Field(field, "tenant name %v", err)
	}
	var errs []error
	t := &policy.Tenant{Name: name, Repositories: map[string]policy.Repository{}}

	if len(f.Clients) == 0 {
		errs = append(errs, config.Field(field+".clients", "at least one client principal (client/NAME) is required"))
	}
	td := c.checkedTrustDomain()
	clients, cerrs := principals(field+".clients", td, identity.KindClient, f.Clients)
	t.Clients = clients
	errs = append(errs, cerrs...)

	for _, rname := range sortedKeys(f.Repositories) {
		r, err := c.repository(field+".repositories."+rname, name, rname, f.Repositories[rname])
		errs = append(errs, err)
		if err == nil {
			t.Repositories[rname] = r
		}
	}

	def, err := limitSet(field+".limits.default", f.Limits.Default)
	errs = append(errs, err)
	ceil, err := limitSet(field+".limits.max", f.Limits.Max)
	errs = append(errs, err)
	t.Default, t.Max = fillLimits(def, ceil)
	errs = append(errs, checkCeilings(field+".limits", t.Default, t.Max)...)

	t.RuntimeClasses = f.RuntimeClasses
	if len(t.RuntimeClasses) == 0 {
		t.RuntimeClasses = []string{policy.RuntimeRunc}
	}
	for i, rc := range t.RuntimeClasses {
		if !slices.Contains(policy.RuntimeClasses(), rc) {
			errs = append(errs, config.Field(fmt.Sprintf("%s.runtime_classes[%d]", field, i), "%q: want one of %v", rc, policy.RuntimeClasses()))
		} else if slices.Index(t.RuntimeClasses, rc) != i {
			errs = append(errs, config.Field(fmt.Sprintf("%s.runtime_classes[%d]", field, i), "%q is listed twice", rc))
		} else {
			// Defaults and ceilings every allowed class can run with
			// (pkg/runspec), or each job would be refused at submit.
			for _, set := range []struct {
				name string
				l    policy.Limits
			}{{"default", t.Default}, {"max", t.Max}} {
				err := runspec.CheckLimits(rc, runspec.Limits{CPUMillis: set.l.CPUMillis, MemoryBytes: set.l.MemoryBytes, Pids: set.l.Pids,
					DiskBytes: set.l.DiskBytes, Deadline: set.l.Deadline})
				var fe *runspec.FieldError
				if errors.As(err, &fe) {
					// This file's names for the API's fields.
					name := strings.NewReplacer("memory_bytes", "memory", "disk_bytes", "disk").Replace(fe.Field)
					errs = append(errs, config.Field(fmt.Sprintf("%s.limits.%s.%s", field, set.name, name), "%s", fe.Reason))
				}
			}
		}
	}

	for i, s := range f.Egress.CIDRs {
		p, err := egress.ParsePrefix(s)
		if err != nil {
			errs = append(errs, config.Field(fmt.Sprintf("%s.egress.cidrs[%d]", field, i), "%v", err))
			continue
		}
		t.Egress.CIDRs = append(t.Egress.CIDRs, p)
	}
	for i, d := range f.Egress.Domains {
		name, err := egress.NormalizeName(d)
		if err != nil {
			errs = append(errs, config.Field(fmt.Sprintf("%s.egress.domains[%d]", field, i), "%v", err))
			continue
		}
		t.Egress.Domains = append(t.Egress.Domains, name)
	}
	a, aerrs := c.approvals(field+".approvals", td, f.Approvals)
	errs = append(errs, aerrs...)
	t.Approvals = a
	t.Quota = policy.Quota{RunningJobs: f.Quota.RunningJobs, MemoryBytes: f.Quota.Memory.Bytes(), CPUMillis: f.Quota.CPUMillis, QueuedJobs: f.Quota.QueuedJobs}
	switch q := &t.Quota.QueuedJobs; {
	case *q == 0:
		*q = policy.DefaultQueuedJobs
	case *q < 1 || *q > 100000:
		errs = append(errs, config.Field(field+".quota.queued_jobs", "%d: must be between 1 and 100000", *q))
	}
	if err := f.Quota.Memory.Check(field + ".quota.memory"); err != nil {
		errs = append(errs, err)
	}
	for _, q := range []struct {
		name     string
		v, least int64
	}{
		{"running_jobs", t.Quota.RunningJobs, 1},
		{"memory", t.Quota.MemoryBytes, t.Default.MemoryBytes},
		{"cpu_millis", t.Quota.CPUMillis, t.Default.CPUMillis},
	} {
		switch {
		case q.v < 0:
			errs = append(errs, config.Field(field+".quota."+q.name, "%d: must not be negative", q.v))
		case q.v > 0 && q.v < q.least:
			errs = append(errs, config.Field(field+".quota."+q.name, "%d: less than one job at the tenant's default limits needs (%d): no default job could run", q.v, q.least))
		}
	}
	switch t.StartDeadline = f.StartDeadline; {
	case t.StartDeadline == 0:
		t.StartDeadline = policy.DefaultStartDeadline
	case t.StartDeadline < time.Minute || t.StartDeadline > 7*24*time.Hour:
		errs = append(errs, config.Field(field+".start_deadline", "%v: must be between 1m and 168h", t.StartDeadline))
	}
	switch t.GitHistoryDepth = f.GitHistoryDepth; {
	case t.GitHistoryDepth == 0:
		t.GitHistoryDepth = policy.DefaultGitHistoryDepth
	case t.GitHistoryDepth < 1 || t.GitHistoryDepth > policy.MaxGitHistoryDepth:
		errs = append(errs, config.Field(field+".git_history_depth", "%d: must be between 1 and %d", t.GitHistoryDepth, policy.MaxGitHistoryDepth))
	}
	t.DeployCredentials = map[string]string{}
	for _, repo := range sortedKeys(f.DeployCredentials) {
		df := field + ".deploy_credentials." + repo
		if _, ok := t.Repositories[repo]; !ok {
			errs = append(errs, config.Field(df, "%q is not a repository of the tenant", repo))
			continue
		}
		p := f.DeployCredentials[repo]
		if p == "" {
			errs = append(errs, config.Field(df, "a file path is required"))
			continue
		}
		p = resolve(c.base, p)
		if st, err := os.Stat(p); err != nil {
			errs = append(errs, config.Field(df, "%v", err))
		} else if !st.Mode().IsRegular() {
			errs = append(errs, config.Field(df, "%s is not a regular file", p))
		} else {
			t.DeployCredentials[repo] = p
		}
	}
	t.Publish, err = publishPolicy(field+".publish", f.Publish)
	errs = append(errs, err)
	sess, serrs := sessions(field+".sessions", f.Sessions)
	t.Sessions = sess
	errs = append(errs, serrs...)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// publishPolicy checks a tenant's publish policy and fills in its default.
func publishPolicy(field string, f PublishFile) (policy.Publish, error) {
	p := policy.Publish{
		Content: contentcheck.Policy{Protected: f.Protected, AllowProtected: f.AllowProtected, MaxFileBytes: f.MaxFileSize.Bytes(), AllowBinary: f.AllowBinary},
		OnMoved: f.OnMoved,
	}
	if err := f.MaxFileSize.Check(field + ".max_file_size"); err != nil {
		return p, err
	}
	switch p.OnMoved {
	case "":
		p.OnMoved = policy.OnMovedReapply
	case policy.OnMovedReapply, policy.OnMovedRefuse:
	default:
		return p, config.Field(field+".on_moved", "%q: want %s or %s", f.OnMoved, policy.OnMovedReapply, policy.OnMovedRefuse)
	}
	if err := p.Content.Validate(); err != nil {
		// "invalid argument: policy.NAME: REASON" in this file's names.
		msg := strings.TrimPrefix(err.Error(), "invalid argument: policy.")
		name, reason, _ := strings.Cut(msg, ": ")
		if name == "max_file_bytes" {
			name = "max_file_size"
		}
		return p, config.Field(field+"."+name, "%s", reason)
	}
	return p, nil
}

// checkedTrustDomain is the trust domain principals are checked in: a
// placeholder when trust_domain itself is wrong (that error is reported on
// its own), so a name can still be checked.
func (c *Config) checkedTrustDomain() string {
	if identity.ValidateTrustDomain(c.TrustDomain) != nil {
		return "airlock.invalid"
	}
	return c.TrustDomain
}

// principals checks a list of principals ("KIND/NAME") of one kind: each
// well formed, of that kind, and listed once.
func principals(field, td string, kind identity.Kind, list []string) ([]string, []error) {
	var (
		out  []string
		errs []error
	)
	for i, p := range list {
		pf := fmt.Sprintf("%s[%d]", field, i)
		k, name, ok := strings.Cut(p, "/")
		if !ok || k != string(kind) {
			errs = append(errs, config.Field(pf, "%q: want a%s %s principal, %s/NAME", p, article(kind), kind, kind))
			continue
		}
		if _, err := identity.New(td, kind, name); err != nil {
			errs = append(errs, config.Field(pf, "%v", err))
			continue
		}
		if slices.Contains(out, p) {
			errs = append(errs, config.Field(pf, "%q is listed twice", p))
			continue
		}
		out = append(out, p)
	}
	return out, errs
}

func article(k identity.Kind) string {
	if strings.ContainsRune("aeiou", rune(k[0])) {
		return "n"
	}
	return ""
}

// approvals checks a tenant's approval policy and fills in its defaults.
func (c *Config) approvals(field, td string, f ApprovalsFile) (policy.Approvals, []error) {
	var errs []error
	a := policy.Approvals{Required: f.Required, TTL: f.TTL, Widening: f.Widening}
	switch a.Widening {
	case "":
		a.Widening = policy.WidenApprove
	case policy.WidenApprove, policy.WidenAllow, policy.WidenDeny:
	default:
		errs = append(errs, config.Field(field+".widening", "%q: want %s, %s or %s", f.Widening, policy.WidenApprove, policy.WidenAllow, policy.WidenDeny))
	}
	approvers, aerrs := principals(field+".approvers", td, identity.KindApprover, f.Approvers)
	a.Approvers = approvers
	errs = append(errs, aerrs...)
	switch {
	case a.Required == 0:
		a.Required = policy.DefaultRequiredApproval
	case a.Required < 0:
		errs = append(errs, config.Field(field+".required", "%d: must be at least 1", a.Required))
	case len(f.Approvers) > 0 && a.Required > len(f.Approvers):
		errs = append(errs, config.Field(field+".required", "%d: more than the %d approvers listed", a.Required, len(f.Approvers)))
	}
	switch {
	case a.TTL == 0:
		a.TTL = policy.DefaultApprovalTTL
	case a.TTL < time.Minute || a.TTL > 30*24*time.Hour:
		errs = append(errs, config.Field(field+".ttl", "%v: must be between 1m and 720h", a.TTL))
	}
	return a, errs
}

func (c *Config) repository(field, tenant, name string, f RepositoryFile) (policy.Repository, error) {
	if err := policy.CheckName(name); err != nil {
		return policy.Repository{}, config.Field(field, "repository name %v", err)
	}
	r := policy.Repository{Tenant: tenant, Name: name}
	var errs []error
	https := false
	switch u := f.URL; {
	case u == "":
		errs = append(errs, config.Field(field+".url", "required (an absolute path, file:// or https:// URL)"))
	case strings.Contains(u, "://"):
		parsed, err := url.Parse(u)
		switch {
		case err != nil:
			errs = append(errs, config.Field(field+".url", "not a URL: %v", redactURLError(err)))
		case parsed.User != nil:
			// Never echo the URL: its user part may be a password.
			errs = append(errs, config.Field(field+".url", "must not carry a user or password; put the secret in a credential file"))
		case parsed.Scheme == "file" && parsed.Host == "" && parsed.Path != "":
			r.URL = u
		case parsed.Scheme == "https" && parsed.Host != "":
			r.URL, https = u, true
		default:
			errs = append(errs, config.Field(field+".url", "%q: only absolute paths, file:///path and https://host/path are allowed", u))
		}
	case strings.HasPrefix(u, "-"):
		errs = append(errs, config.Field(field+".url", "%q must not start with '-'", u))
	default:
		// A plain path, relative to the config file like every other path.
		r.URL = resolve(c.base, u)
	}
	if f.Credential != "" {
		r.Credential = resolve(c.base, f.Credential)
		if st, err := os.Stat(r.Credential); err != nil {
			errs = append(errs, config.Field(field+".credential", "%v", err))
		} else if !st.Mode().IsRegular() {
			errs = append(errs, config.Field(field+".credential", "%s is not a regular file", r.Credential))
		}
	}
	if f.CA != "" {
		r.CA = resolve(c.base, f.CA)
		if !https {
			errs = append(errs, config.Field(field+".ca", "only an https:// URL has a server certificate to check"))
		} else if _, err := tlsconfig.LoadRoots(r.CA); err != nil {
			errs = append(errs, config.Field(field+".ca", "%v", err))
		}
	}
	return r, errors.Join(errs...)
}

// redactURLError keeps the reason of a URL parse error without the URL,
// which may hold a secret.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return errors.New("malformed")
}

// limitSet checks one written set; unset fields stay zero.
func limitSet(field string, f LimitSet) (policy.Limits, error) {
	errs := []error{f.Memory.Check(field + ".memory"), f.Disk.Check(field + ".disk")}
	for _, v := range []struct {
		name string
		n    int64
	}{{"cpu_millis", f.CPUMillis}, {"pids", f.Pids}, {"memory", f.Memory.Bytes()}, {"disk", f.Disk.Bytes()}, {"deadline", int64(f.Deadline)}} {
		if v.n < 0 {
			errs = append(errs, config.Field(field+"."+v.name, "must not be negative"))
		}
	}
	if f.Memory.IsSet() && f.Memory.Bytes() == 0 {
		errs = append(errs, config.Field(field+".memory", "must be more than 0"))
	}
	if f.Disk.IsSet() && f.Disk.Bytes() == 0 {
		errs = append(errs, config.Field(field+".disk", "must be more than 0"))
	}
	return policy.Limits{
		CPUMillis: f.CPUMillis, MemoryBytes: f.Memory.Bytes(), Pids: f.Pids, DiskBytes: f.Disk.Bytes(), Deadline: f.Deadline,
	}, errors.Join(errs...)
}

// fillLimits completes def and max field by field (policy.CompletePair).
func fillLimits(def, ceil policy.Limits) (policy.Limits, policy.Limits) {
	fill := policy.CompletePair
	fill(&def.CPUMillis, &ceil.CPUMillis, policy.DefaultLimits.CPUMillis, policy.DefaultMax.CPUMillis)
	fill(&def.MemoryBytes, &ceil.MemoryBytes, policy.DefaultLimits.MemoryBytes, policy.DefaultMax.MemoryBytes)
	fill(&def.Pids, &ceil.Pids, policy.DefaultLimits.Pids, policy.DefaultMax.Pids)
	fill(&def.DiskBytes, &ceil.DiskBytes, policy.DefaultLimits.DiskBytes, policy.DefaultMax.DiskBytes)
	d, m := int64(def.Deadline), int64(ceil.Deadline)
	fill(&d, &m, int64(policy.DefaultLimits.Deadline), int64(policy.DefaultMax.Deadline))
	def.Deadline, ceil.Deadline = time.Duration(d), time.Duration(m)
	return def, ceil
}

func checkCeilings(field string, def, ceil policy.Limits) []error {
	var errs []error
	for _, v := range []struct {
		name     string
		def, max int64
		format   func(int64) string
	}{
		{"cpu_millis", def.CPUMillis, ceil.CPUMillis, plain},
		{"memory", def.MemoryBytes, ceil.MemoryBytes, config.FormatByteSize},
		{"pids", def.Pids, ceil.Pids, plain},
		{"disk", def.DiskBytes, ceil.DiskBytes, config.FormatByteSize},
		{"deadline", int64(def.Deadline), int64(ceil.Deadline), func(n int64) string { return time.Duration(n).String() }},
	} {
		if v.max < v.def {
			errs = append(errs, config.Field(field+".max."+v.name, "ceiling %s is below the default %s", v.format(v.max), v.format(v.def)))
		}
	}
	return errs
}

func plain(n int64) string { return fmt.Sprint(n) }

func resolve(base, p string) string {
	if filepath.IsAbs(p) || base == "" {
		return filepath.Clean(p)
	}
	return filepath.Join(base, p)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Load reads and validates the file at path; override applies command-line flags.
func Load(path string, override func(*config.Server)) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c := Config{base: filepath.Dir(abs)}
	if err := config.LoadService(path, &c, override); err != nil {
		return nil, err
	}
	return &c, nil
}

// Check is --check-config: the file at path loaded as Load does, and every
// file it names read as a start would (config.Check), creating nothing: a
// missing key a start would make is a note in the summary.
func Check(path string, override func(*config.Server)) (string, []error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", []error{err}
	}
	return config.Check("authority", path, &Config{base: filepath.Dir(abs)}, override)
}

// CheckFiles implements config.Checker: the grant and checkpoint keys
// parse or can be made, and the checkpoint file can be opened.
func (c *Config) CheckFiles() ([]string, error) {
	var (
		notes []string
		errs  []error
	)
	for _, k := range []struct{ field, path string }{
		{"grant_key", c.GrantKey}, {"audit.checkpoint_key", c.Audit.CheckpointKey},
	} {
		if k.path == "" {
			continue
		}
		note, err := checkKey(k.field, k.path)
		errs = append(errs, err)
		if note != "" {
			notes = append(notes, note)
		}
	}
	if f := c.Audit.CheckpointFile; f != "" {
		// Opened O_CREATE, appended to: its directory must be there, unless
		// it is the data directory, which a start makes.
		if st, err := os.Stat(f); err == nil && !st.Mode().IsRegular() {
			errs = append(errs, config.Field("audit.checkpoint_file", "%s is not a regular file", f))
		} else if dir := filepath.Dir(f); dir != c.DataDir {
			if st, err := os.Stat(dir); err != nil {
				errs = append(errs, config.Field("audit.checkpoint_file", "%v", err))
			} else if !st.IsDir() {
				errs = append(errs, config.Field("audit.checkpoint_file", "%s is not a directory", dir))
			}
		}
	}
	return notes, errors.Join(errs...)
}

// checkKey reads the Ed25519 key a start loads or creates
// (pki.LoadOrCreateEd25519), creating none.
func checkKey(field, path string) (note string, err error) {
	if st, serr := os.Stat(path); serr == nil && st.IsDir() && field == "grant_key" {
		// A directory of signing keys (grant key rotation).
		if err := grant.CheckSigningKeyDir(path); err != nil {
			return "", config.Field(field, "%v", err)
		}
		return "", nil
	}
	_, err = pki.LoadEd25519(path)
	switch {
	case err == nil:
		return "", nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", config.Field(field, "%v", err)
	}
	if err := pki.CanCreateEd25519(path); err != nil {
		return "", config.Field(field, "%v", err)
	}
	return fmt.Sprintf("%s %s will be created", field, path), nil
}

// Summary implements config.Checker.
func (c *Config) Summary() string {
	return fmt.Sprintf("executor %s, store %s, %d tenants", c.Executor.Address, c.Store.Driver, len(c.Policy))
}
