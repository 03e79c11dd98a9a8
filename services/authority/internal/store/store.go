// Package store owns the authority's persistent records — jobs and the
// hash-chained audit log — and the one interface every storage backend
// implements: the embedded SQLite store in store/sqlite and PostgreSQL for
// replicated authorities in store/postgres, both held to the same
// conformance suite in store/storetest. It knows nothing of job policy; the
// jobs package decides what may change and calls Update.
package store

import (
	"context"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
)

// State is where a job is in its life. The values are what the database
// holds, so they never change.
type State string

// Job states: queued → staging → running → finished, with failed and
// cancelled reachable from any state before the end.
const (
	StateQueued    State = "queued"
	StateStaging   State = "staging"
	StateRunning   State = "running"
	StateFinished  State = "finished"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
)

// Terminal reports whether nothing more happens to a job in state s.
func (s State) Terminal() bool {
	return s == StateFinished || s == StateFailed || s == StateCancelled
}

// Valid reports whether s is one of the states above.
func (s State) Valid() bool {
	switch s {
	case StateQueued, StateStaging, StateRunning, StateFinished, StateFailed, StateCancelled:
		return true
	}
	return false
}

// Job is the authority's record of one job. Byte fields hold serialized
// protobuf messages the store does not interpret.
type Job struct {
	// ID is assigned by the caller of CreateJob and never changes.
	ID string
	// Tenant, Requester (a SPIFFE ID), IdempotencyKey and Repository are
	// fixed at submission. (Tenant, IdempotencyKey) is unique.
	Tenant         string
	Requester      string
	IdempotencyKey string
	Repository     string
	// Spec is the airlock.authority.v1.JobSpec as submitted; SpecDigest
	// identifies its content, so a retry with a different spec is caught.
	Spec       []byte
	SpecDigest string
	// Commit and TreeHash are what the revision resolved to at submission.
	Commit   string
	TreeHash string

	// State and Message change over the job's life; UpdatedAt with them.
	State   State
	Message string
	// NetworkState is the network policy's state as last known:
	// "pending", "applied" or "failed".
	NetworkState string

	// Grant is the serialized airlock.types.v1.SignedGrant, empty for a job
	// refused before it was granted; GrantExpiresAt is its expiry.
	Grant          []byte
	GrantExpiresAt time.Time
	// DispatchedAt is when a StartJob for the grant was first attempted;
	// zero while the grant has never left the authority.
	DispatchedAt time.Time

	// Result is the serialized airlock.types.v1.RunResult the executor
	// reported, with the rest of its report; empty until then.
	Result       []byte
	BundleDigest string
	Patch        []byte
	OutputTail   []byte
	Provenance   []byte

	CreatedAt time.Time
	UpdatedAt time.Time
	// Version increases by one with every stored change.
	Version int64
}

// ListOptions selects jobs for List.
type ListOptions struct {
	// Tenant is required.
	Tenant string
	// States filters by state; empty means all.
	States []State
	// Limit is the page size; the store caps nothing, the caller does.
	Limit int
	// PageToken continues from a previous page; "" starts at the newest.
	PageToken string
}

// AuditFilter selects audit events for ListAudit; zero fields select all.
type AuditFilter struct {
	JobID  string
	Tenant string
	Caller string
	Kind   string
	// Since (inclusive) and Until (exclusive) bound the events' Time.
	Since time.Time
	Until time.Time
	// AfterSequence continues a listing after the last event of the
	// previous page.
	AfterSequence int64
	// Limit is the page size and must be positive.
	Limit int
}

// Store is the authority's storage. Every method is safe for concurrent use,
// also by several Store values on one database (replicas). Errors wrap
// pkg/errdefs sentinels where the caller can act on them (ErrNotFound,
// ErrInvalidArgument for a bad page token, filter or audit event); anything
// else is internal.
type Store interface {
	// CreateJob records j unless (j.Tenant, j.IdempotencyKey) already
	// exists, in which case it returns the existing job and created=false.
	// The store sets Version; the caller sets everything else.
	CreateJob(ctx context.Context, j Job) (stored Job, created bool, err error)
	// GetJob returns one job, or an error wrapping errdefs.ErrNotFound.
	GetJob(ctx context.Context, id string) (Job, error)
	// JobByIdempotencyKey returns the job submitted with key to tenant, or
	// an error wrapping errdefs.ErrNotFound.
	JobByIdempotencyKey(ctx context.Context, tenant, key string) (Job, error)
	// ListJobs returns a page of a tenant's jobs, newest first, and the
	// token of the next page ("" on the last).
	ListJobs(ctx context.Context, opts ListOptions) (jobs []Job, next string, err error)
	// JobsInStates returns every job in one of states, oldest first; the
	// authority uses it at start-up to resume work.
	JobsInStates(ctx context.Context, states ...State) ([]Job, error)
	// UpdateJob reads job id, lets update change it, and writes it back
	// atomically with Version incremented: no other update of the job
	// interleaves. If update returns an error nothing is written and the
	// error is returned. Identity fields (ID, Tenant, Requester,
	// IdempotencyKey, Repository, Spec, SpecDigest, CreatedAt) are not
	// written even if update changes them.
	UpdateJob(ctx context.Context, id string, update func(*Job) error) (Job, error)

	// CreateJobAudited is CreateJob that also appends e to the audit log in
	// the same transaction: both take effect or neither. When the
	// idempotency key already exists nothing is written, e included. e's
	// JobID and Tenant default to the job's.
	CreateJobAudited(ctx context.Context, j Job, e audit.Event) (stored Job, created bool, err error)
	// UpdateJobAudited is UpdateJob whose update also returns the audit
	// event recording the change; the changed job and the event are
	// written in one transaction, or, on any error (the update's own, an
	// invalid event or state, a failed write), neither is. The event's
	// JobID and Tenant default to the job's.
	UpdateJobAudited(ctx context.Context, id string, update func(*Job) (audit.Event, error)) (Job, error)
	// AppendAudit adds e to the end of the audit log and returns it as
	// stored: the store assigns Sequence (one more than the last entry's),
	// PrevHash (the last entry's Hash) and Hash, and Time when it is zero
	// (a given Time is normalized to UTC microseconds). Appends are
	// serialized, across replicas too, so the log is one unbroken chain.
	// An event audit.Event.Validate refuses wraps ErrInvalidArgument.
	AppendAudit(ctx context.Context, e audit.Event) (audit.Event, error)
	// ListAudit returns up to f.Limit events matching f, oldest (lowest
	// sequence) first.
	ListAudit(ctx context.Context, f AuditFilter) ([]audit.Event, error)

	// Close releases the store.
	Close() error
}
