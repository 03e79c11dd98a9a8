package config

import (
	"time"

	"github.com/airlockhq/airlock/pkg/config"
)

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
	// WarmPool is how many sandboxes of the tenant's job shape (runtime
	// class, user, disk limit, memory) each executor keeps started and
	// ready, so a session's first exec, or a job, starts at once: between
	// 0 (the default: none) and 16. An executor keeps at most its own
	// warm_pool bounds.
	WarmPool int `yaml:"warm_pool"`
	// Sessions bounds the tenant's sessions: a default and a ceiling of
	// their idle timeout and of how many execs run at once.
	Sessions SessionsFile `yaml:"sessions"`
	// Caches are the named caches the tenant's jobs may ask for (--cache
	// NAME), by name.
	Caches map[string]CacheFile `yaml:"caches"`
	// User is who the tenant's jobs run as unless one asks (--user):
	// "agent" (1000:1000, the non-root user new tenants should take),
	// "root", "UID" or "UID:GID". Omitted is root, as before the field
	// existed, so a policy written for root-owned jobs (caches below
	// /root) keeps working.
	User string `yaml:"user"`
	// AllowRoot lets a job ask to run as root when User is not root.
	AllowRoot bool `yaml:"allow_root"`
	// Images is which OCI images the tenant's jobs may run on (--image),
	// and how the authority reaches their registries. Omitted, jobs run
	// on the executor's host template only.
	Images ImagesFile `yaml:"images"`
	// Credentials are the brokered credentials the tenant's jobs may ask
	// for (--credential NAME), by name: the job's egress proxy adds one to
	// requests to its hosts, and the job never holds it.
	Credentials map[string]CredentialFile `yaml:"credentials"`
	// Metering is the tenant's monthly budget (metering.go).
	Metering TenantMeteringFile `yaml:"metering"`
	// PortForward lets the tenant's clients reach TCP ports inside its
	// sessions (airlock session port-forward); omitted, they may not.
	PortForward *PortForwardFile `yaml:"port_forward"`
}

// ImagesFile is a tenant's image policy as the file writes it.
type ImagesFile struct {
	// Default is the image a job that names none runs on: a reference
	// HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST] that Allowed covers, or
	// "host" (the default) for the executor's host template.
	Default string `yaml:"default"`
	// Allowed are the images a job may name, each HOST[:PORT]/REPOSITORY
	// (any tag or digest), HOST[:PORT]/PATH/* (every repository below
	// PATH), HOST[:PORT]/* (the whole registry), or
	// HOST[:PORT]/REPOSITORY@sha256:DIGEST (only that manifest, or that
	// multi-arch index).
	Allowed []string `yaml:"allowed"`
	// MaxSize bounds an image's config and compressed layers; default 4GiB.
	MaxSize config.ByteSize `yaml:"max_size"`
	// Registries maps a registry host ("host[:port]") to how the
	// authority reaches it.
	Registries map[string]RegistryFile `yaml:"registries"`
}

// RegistryFile is how the authority reaches one registry for a tenant.
type RegistryFile struct {
	// Credential is a file holding "USERNAME:PASSWORD" (one line); optional.
	// It stays in the authority: executors get the image's bytes only.
	Credential string `yaml:"credential"`
	// CA is a PEM file of the certificate authorities the registry's
	// certificate must chain to; optional (the system's roots).
	CA string `yaml:"ca"`
}

// CacheFile is one named cache as the file writes it.
type CacheFile struct {
	// Path is where a job sees it: a clean absolute path below /home,
	// /root (root's jobs only) or /tmp.
	Path string `yaml:"path"`
	// MaxSize is the size past which the cache is wiped after a commit;
	// required, between 4KiB and 1TiB.
	MaxSize config.ByteSize `yaml:"max_size"`
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
	// DefaultOnIdle is what a session idle past its timeout does when it
	// does not say: end (the default) or sleep. AllowSleep (default
	// true) false refuses sessions that ask to sleep.
	DefaultOnIdle string `yaml:"default_on_idle"`
	AllowSleep    *bool  `yaml:"allow_sleep"`
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
