package jobs

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/authority/internal/images"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/source"
)

// What a client asks to run and what the authority grants it, in the
// domain's terms, and the interfaces that sign grants and read sources.

// NetworkMode is which kind of network policy a job asks for.
type NetworkMode int

const (
	// NetworkUnset means the spec gave none: deny-all.
	NetworkUnset NetworkMode = iota
	NetworkDenyAll
	NetworkAllow
	NetworkDomains
)

// String is the mode's name as the API spells it.
func (m NetworkMode) String() string {
	switch m {
	case NetworkDenyAll, NetworkUnset:
		return "deny_all"
	case NetworkAllow:
		return "allow"
	case NetworkDomains:
		return "domains"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// AllowRule permits one CIDR on some ports (none means every port).
type AllowRule struct {
	CIDR  string
	Ports []uint32
}

// Network is a job's network policy.
type Network struct {
	Mode NetworkMode
	// Rules are the allow mode's destinations.
	Rules []AllowRule
	// Domains and DomainPorts are the domains mode's names and ports.
	Domains     []string
	DomainPorts []uint32
}

// PublishTarget is where an approved result may be published.
type PublishTarget struct {
	Repository string
	Branch     string
}

// Spec is what a client asks to run, as the domain reads it.
type Spec struct {
	Repository string
	Revision   string
	Command    []string
	Env        map[string]string
	// Resources with zero fields taking the tenant's defaults.
	Resources policy.Limits
	Network   Network
	// RuntimeClass is a policy runtime class name, or "" for the default.
	RuntimeClass  string
	PublishTarget *PublishTarget
	// Session, if set, makes the job a session: Command is then empty.
	Session *Session
	// Caches names caches of the tenant's policy to mount.
	Caches []string `json:",omitempty"`
	// User is who the job asks to run as; nil is the tenant's default.
	User *runspec.User `json:",omitempty"`
	// Image is the OCI image reference to run on, "" for the tenant's
	// default, policy.HostImage for the host template.
	Image string `json:",omitempty"`
	// With names what to run beside the job in its sandbox
	// (runspec.WithDocker); checked by runspec.CheckWith.
	With []string `json:",omitempty"`
	// Credentials name brokered credentials of the tenant's policy the
	// job's egress proxy adds to its requests; never a value.
	Credentials []string `json:",omitempty"`
}

// Session is what makes a job a session: its sandbox stays up for the
// client's execs. Zero fields take the tenant's defaults (policy.Sessions),
// and none may pass its ceilings.
type Session struct {
	IdleTimeout        time.Duration
	MaxConcurrentExecs int
	// OnIdle is policy.OnIdleEnd or policy.OnIdleSleep; "" takes the
	// tenant's default.
	OnIdle string `json:",omitempty"`
}

// SubmitRequest is one submission.
type SubmitRequest struct {
	Tenant         string
	IdempotencyKey string
	Spec           Spec
	// SpecWire is the spec exactly as submitted, serialized by the caller;
	// it is stored and given back by Get, never interpreted here.
	SpecWire []byte
}

// GrantRequest is everything the authority decided for one job: what the
// Signer turns into a signed grant.
type GrantRequest struct {
	JobID, Tenant, Requester string
	Repository, Commit       string
	Command                  []string
	Env                      map[string]string
	// Limits are the effective limits, defaults filled in.
	Limits policy.Limits
	// Network is the effective policy; its mode is never NetworkUnset.
	Network           Network
	NetworkGeneration int64
	// Generation is 1 for the first grant and one more for every change
	// granted to the running job.
	Generation    int64
	RuntimeClass  string
	PublishTarget *PublishTarget
	// Session is set, defaults filled in, for a session.
	Session *Session
	// HistoryDepth is how many commits of history the job's .git gets.
	HistoryDepth int
	// WarmPool is how many sandboxes of the job's shape the tenant's
	// policy asks each executor to keep ready.
	WarmPool int `json:",omitempty"`
	// Caches are the named caches the job mounts, as the tenant's policy
	// had them at submission.
	Caches []CacheGrant
	// User is who the job runs as.
	User runspec.User
	// Image is the image the job runs on; nil is the host template.
	Image *ImageGrant
	// With is what runs beside the job in its sandbox, as the spec asked.
	With []string
	// Credentials name the brokered credentials the job's egress proxy may
	// lease, as the spec asked; never a value.
	Credentials []string
	// Executor is the SPIFFE ID of the executor the grant is for; every
	// other executor refuses it. "" while the job is placed nowhere: no
	// executor accepts such a grant.
	Executor  string
	IssuedAt  time.Time
	ExpiresAt time.Time
}

// ImageGrant is the image granted to a job: resolved at submission, run
// by digest.
type ImageGrant struct {
	// Name is the reference as asked (or the tenant's default).
	Name string
	// Registry and Repository locate it; Digest is its linux/amd64
	// manifest's, of MediaType.
	Registry, Repository, Digest, MediaType string
	// Size is its config's and compressed layers' bytes.
	Size int64
}

// Reference is "registry/repository@digest".
func (g ImageGrant) Reference() string { return g.Registry + "/" + g.Repository + "@" + g.Digest }

// Images reads tenants' images from their registries (see package images).
type Images interface {
	Resolve(ctx context.Context, p policy.Images, ref string) (images.Resolved, error)
	Manifest(ctx context.Context, p policy.Images, registry, repository, digest string) (images.Resolved, error)
	Blob(ctx context.Context, p policy.Images, registry, repository, digest string) (io.ReadCloser, error)
	CheckBlob(ctx context.Context, p policy.Images, registry, repository, digest string, size int64) error
}

// CacheGrant is one named cache granted to a job.
type CacheGrant struct {
	Name, Path string
	MaxSize    int64
}

// SignedGrant is a signed grant in its wire form.
type SignedGrant struct {
	// Wire is the serialized SignedGrant the executor receives.
	Wire []byte
	// Digest names exactly what was granted.
	Digest string
}

// Signer signs grants with the authority's key, and reads back the ones it
// signed (the stored grant is the record of what a job may do).
type Signer interface {
	Sign(GrantRequest) (SignedGrant, error)
	Decode(wire []byte) (GrantRequest, error)
}

// Source reads tenants' repositories (see package source).
type Source interface {
	Resolve(ctx context.Context, repo policy.Repository, rev string) (source.Revision, error)
	Archive(ctx context.Context, repo policy.Repository, commit string, w io.Writer) error
	// CommitObject returns the commit object of commit, as git stores it.
	CommitObject(ctx context.Context, repo policy.Repository, commit string) ([]byte, error)
	// PlanHistory chooses the history beyond commit a job's .git gets at
	// depth; WritePack writes it as a git pack.
	PlanHistory(ctx context.Context, repo policy.Repository, commit string, depth int) (source.History, error)
	WritePack(ctx context.Context, repo policy.Repository, h source.History, w io.Writer) error
}
