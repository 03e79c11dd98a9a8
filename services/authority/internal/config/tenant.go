package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	"github.com/airlockhq/airlock/services/authority/internal/images"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

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
	forbidSleep := f.AllowSleep != nil && !*f.AllowSleep
	switch f.DefaultOnIdle {
	case "", policy.OnIdleEnd:
	case policy.OnIdleSleep:
		if forbidSleep {
			errs = append(errs, config.Field(field+".default_on_idle", "sleep, but allow_sleep is false"))
		}
	default:
		errs = append(errs, config.Field(field+".default_on_idle", "%q: want %s or %s", f.DefaultOnIdle, policy.OnIdleEnd, policy.OnIdleSleep))
	}
	s := policy.Sessions{DefaultIdleTimeout: f.DefaultIdleTimeout, MaxIdleTimeout: f.MaxIdleTimeout,
		DefaultConcurrentExecs: f.DefaultConcurrentExecs, MaxConcurrentExecs: f.MaxConcurrentExecs,
		DefaultOnIdle: f.DefaultOnIdle, ForbidSleep: forbidSleep}.Filled()
	if s.MaxIdleTimeout < s.DefaultIdleTimeout {
		errs = append(errs, config.Field(field+".max_idle_timeout", "ceiling %v is below the default %v", s.MaxIdleTimeout, s.DefaultIdleTimeout))
	}
	if s.MaxConcurrentExecs < s.DefaultConcurrentExecs {
		errs = append(errs, config.Field(field+".max_concurrent_execs", "ceiling %d is below the default %d", s.MaxConcurrentExecs, s.DefaultConcurrentExecs))
	}
	return s, errs
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
				pids := set.l.Pids
				if set.name == "max" && rc == runspec.ClassRunsc {
					// A ceiling above what runsc takes still serves
					// runc: a runsc job asking for more is refused at
					// submission, naming pids.
					pids = min(pids, runspec.MaxRunscPids)
				}
				err := runspec.CheckLimits(rc, runspec.Limits{CPUMillis: set.l.CPUMillis, MemoryBytes: set.l.MemoryBytes, Pids: pids,
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
	if t.WarmPool = f.WarmPool; t.WarmPool < 0 || t.WarmPool > runspec.MaxWarmPool {
		errs = append(errs, config.Field(field+".warm_pool", "%d: must be between 0 and %d", t.WarmPool, runspec.MaxWarmPool))
	}
	errs = append(errs, serrs...)
	caches, cerrs := cachesOf(field+".caches", f.Caches)
	t.Caches = caches
	errs = append(errs, cerrs...)
	t.AllowRoot = f.AllowRoot
	if f.User != "" {
		u, err := runspec.ParseUser(f.User)
		if err != nil {
			errs = append(errs, config.Field(field+".user", "%v", err))
		}
		t.User = u
	}
	creds, crerrs := c.credentials(field+".credentials", t.Egress, f.Credentials)
	t.Credentials = creds
	errs = append(errs, crerrs...)
	pf, pferrs := portForward(field+".port_forward", f.PortForward)
	t.PortForward = pf
	errs = append(errs, pferrs...)
	imgs, ierrs := c.images(field+".images", f.Images)
	t.Images = imgs
	errs = append(errs, ierrs...)
	if f.AllowRoot && t.User.IsRoot() {
		errs = append(errs, config.Field(field+".allow_root", "the tenant's jobs run as root already (user omitted or root): allow_root is for a tenant whose user is not root"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// images checks a tenant's image policy.
func (c *Config) images(field string, f ImagesFile) (policy.Images, []error) {
	var errs []error
	out := policy.Images{Registries: map[string]policy.Registry{}}
	for i, a := range f.Allowed {
		af := fmt.Sprintf("%s.allowed[%d]", field, i)
		pat, err := imagePattern(a)
		if err != nil {
			errs = append(errs, config.Field(af, "%q: %v", a, err))
			continue
		}
		out.Allowed = append(out.Allowed, pat)
	}
	if err := f.MaxSize.Check(field + ".max_size"); err != nil {
		errs = append(errs, err)
	}
	out.MaxBytes = f.MaxSize.Bytes()
	switch d := f.Default; {
	case d == "" || d == policy.HostImage:
		out.Default = policy.HostImage
	default:
		ref, err := images.Parse(d)
		if err != nil {
			errs = append(errs, config.Field(field+".default", "%v", err))
			break
		}
		if _, ok := images.Allowed(out, ref); !ok {
			errs = append(errs, config.Field(field+".default", "%q is not covered by %s.allowed", d, field))
			break
		}
		out.Default = d
	}
	for _, host := range sortedKeys(f.Registries) {
		rf, r := f.Registries[host], field+".registries."+host
		if _, err := images.Parse(host + "/x"); err != nil || strings.ContainsAny(host, "/@") {
			errs = append(errs, config.Field(r, "%q is not a registry host (HOST or HOST:PORT)", host))
			continue
		}
		var reg policy.Registry
		if rf.Credential != "" {
			reg.Credential = resolve(c.base, rf.Credential)
			if err := images.CheckCredentialFile(reg.Credential); err != nil {
				errs = append(errs, config.Field(r+".credential", "%s %v", reg.Credential, err))
			}
		}
		if rf.CA != "" {
			reg.CA = resolve(c.base, rf.CA)
			if _, err := tlsconfig.LoadRoots(reg.CA); err != nil {
				errs = append(errs, config.Field(r+".ca", "%v", err))
			}
		}
		out.Registries[host] = reg
	}
	return out, errs
}

// imagePattern parses one entry of a tenant's images.allowed.
func imagePattern(s string) (policy.ImagePattern, error) {
	var p policy.ImagePattern
	rest, digest, pinned := strings.Cut(s, "@")
	if pinned {
		if err := images.CheckDigest(digest); err != nil {
			return p, err
		}
		p.Digest = digest
	}
	if r, ok := strings.CutSuffix(rest, "/*"); ok {
		p.Prefix, rest = true, r
		if pinned {
			return p, errors.New("a pinned digest names one repository, not a pattern")
		}
	}
	host, repo, _ := strings.Cut(rest, "/")
	if !p.Prefix && repo == "" {
		return p, errors.New("want HOST[:PORT]/REPOSITORY, HOST[:PORT]/PATH/*, HOST[:PORT]/* or HOST[:PORT]/REPOSITORY@sha256:DIGEST")
	}
	probe := rest
	if repo == "" {
		probe = host + "/x"
	}
	ref, err := images.Parse(probe)
	if err != nil {
		return p, err
	}
	if _, tagged := ref.(interface{ TagStr() string }); tagged && strings.Contains(strings.TrimPrefix(probe, host), ":") {
		return p, errors.New("a pattern names repositories, not tags: drop the tag (or pin a digest with @sha256:...)")
	}
	p.Registry, p.Repository = ref.Context().RegistryStr(), repo
	if repo != "" && ref.Context().RepositoryStr() != repo {
		return p, fmt.Errorf("repository %q is not in its canonical form %q", repo, ref.Context().RepositoryStr())
	}
	return p, nil
}

// cachesOf checks a tenant's named caches (pkg/runspec's rules, which the
// executor applies to every grant too).
func cachesOf(field string, f map[string]CacheFile) (map[string]policy.Cache, []error) {
	out := map[string]policy.Cache{}
	var errs []error
	names := sortedKeys(f)
	for i, name := range names {
		cf, c := f[name], field+"."+name
		if err := runspec.CheckCacheName(name); err != nil {
			errs = append(errs, config.Field(c, "cache name %v", err))
			continue
		}
		ok := true
		if err := runspec.CheckCachePath(cf.Path); err != nil {
			errs = append(errs, config.Field(c+".path", "%v", err))
			ok = false
		}
		if !cf.MaxSize.IsSet() {
			errs = append(errs, config.Field(c+".max_size", "required (say 1GiB)"))
			ok = false
		} else if r := runspec.CacheSizeReason(cf.MaxSize.Bytes()); r != "" {
			errs = append(errs, config.Field(c+".max_size", "%s", r))
			ok = false
		}
		for _, other := range names[:i] {
			if o, seen := out[other]; seen && runspec.CachePathsOverlap(o.Path, cf.Path) {
				errs = append(errs, config.Field(c+".path", "%q overlaps cache %s's path %q", cf.Path, other, o.Path))
				ok = false
			}
		}
		if ok {
			out[name] = policy.Cache{Path: cf.Path, MaxSize: cf.MaxSize.Bytes()}
		}
	}
	return out, errs
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
