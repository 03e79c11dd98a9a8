// Package store owns the authority's persistent records — jobs, a session's
// execs, approvals, credential leases and the hash-chained audit log — and
// the one interface every storage backend
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
	// Executor is the SPIFFE ID of the executor the job is placed on (its
	// grant names it), set when it is placed and changed only when it is
	// placed anew; only it may fetch the job's source and report its
	// result. Empty while the job waits for a place.
	Executor string

	// ClaimedBy names the authority replica that drives the job, until
	// ClaimExpiresAt; another replica takes the job up only after that
	// (ClaimJobs). Written by CreateJob, ClaimJobs, RenewClaims and
	// ReleaseClaims only: UpdateJob leaves both as they are. A claim is
	// not a change of the job: those three leave Version and UpdatedAt as
	// they are.
	ClaimedBy      string
	ClaimExpiresAt time.Time

	// Result is the serialized airlock.types.v1.RunResult the executor
	// reported, with the rest of its report; empty until then.
	Result       []byte
	BundleDigest string
	Patch        []byte
	// Review is the serialized airlock.authority.v1.ReviewDetail: the
	// complete file list, the patch's size and the output tails.
	Review     []byte
	Provenance []byte

	CreatedAt time.Time
	UpdatedAt time.Time
	// StartedAt and EndedAt are set by the store, never by the caller.
	// StartedAt is UpdatedAt the first time the job is written staging or
	// running (when its run began: not its dispatch, which a start refused
	// for room leaves waiting); a job that ends with a result having been
	// seen in neither takes its DispatchedAt. EndedAt is UpdatedAt the
	// first time the job is written in an end state, and again when a
	// result is recorded on a job that had ended without one (a late
	// result), so a reader of the jobs ended since a time reads it again.
	// Zero until then. Metering reads them.
	StartedAt time.Time
	EndedAt   time.Time
	// Version increases by one with every stored change.
	Version int64
}

// UsageFilter selects the jobs UsageJobs returns: those that started
// before Until and had not ended by Since (ended after it, or not yet).
type UsageFilter struct {
	// Tenants to read; empty is every tenant.
	Tenants      []string
	Since, Until time.Time
	// Limit is the most records returned, the newest start first; 0 is
	// no limit.
	Limit int
}

// UsageRecord is what metering reads of one job: the grant (limits,
// runtime class), the result (usage) and its times.
type UsageRecord struct {
	ID, Tenant         string
	State              State
	Grant, Result      []byte
	StartedAt, EndedAt time.Time
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
	// UsageJobs returns, in one query, the usage records of the jobs f
	// selects, newest start first.
	UsageJobs(ctx context.Context, f UsageFilter) ([]UsageRecord, error)
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
	// AuditHead returns the log's last entry as the head row records it:
	// its Sequence and Hash only (0 and GenesisHash for an empty log).
	AuditHead(ctx context.Context) (sequence int64, hash string, err error)

	ApprovalStore
	ExecStore
	FleetStore
	ForwardStore

	// Close releases the store.
	Close() error
}

// ApprovalState is where an approval request is. The values are what the
// database holds, so they never change.
type ApprovalState string

// Approval states: pending → approved → consumed, or pending → denied;
// pending or approved past the expiry reads as expired.
const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDenied   ApprovalState = "denied"
	ApprovalConsumed ApprovalState = "consumed"
	ApprovalExpired  ApprovalState = "expired"
)

// Decisions a vote records.
const (
	DecisionApprove = "approve"
	DecisionDeny    = "deny"
)

// Vote is one approver's recorded decision.
type Vote struct {
	// Approver is a SPIFFE ID; one vote per approver and approval.
	Approver  string
	Decision  string
	Comment   string
	DecidedAt time.Time
}

// ApprovalKind is what an approval is about. The values are what the
// database holds, so they never change.
type ApprovalKind string

// Approval kinds: publishing a job's bundle (one per job), a change that
// widens a running job (any number per job), or starting a queued job
// that asks for a brokered credential whose policy requires it.
const (
	KindPublish ApprovalKind = "publish"
	KindChange  ApprovalKind = "change"
	KindStart   ApprovalKind = "start"
)

// Approval is a request to publish one bundle of one job to one target, or
// to widen one running job.
type Approval struct {
	ID    string
	Kind  ApprovalKind
	JobID string
	// Tenant is the job's; Requester is whoever asked (the job's submitter
	// for a publish request, the change's requester for a change).
	Tenant    string
	Requester string
	// BundleDigest is what a decision must name: the bundle's digest, or
	// for a change the digest of Change.
	BundleDigest string
	// Change is the requested change, or for a start request what the job
	// asks to start with, serialized by the jobs package; nil for publish
	// requests.
	Change       []byte
	TargetRepo   string
	TargetBranch string
	State        ApprovalState
	// Required is how many approve votes reach ApprovalApproved.
	Required   int
	CreatedAt  time.Time
	ExpiresAt  time.Time
	ConsumedAt time.Time
	ConsumedBy string
	// Version increases by one with every stored change.
	Version int64
	// Votes in the order they were cast.
	Votes []Vote
}

// ApprovalFilter selects approvals for ListApprovals.
type ApprovalFilter struct {
	// Tenant, if set, selects one tenant's approvals.
	Tenant string
	// Kind, if set, selects one kind.
	Kind ApprovalKind
	// JobID, if set, selects one job's approvals.
	JobID string
	// States filters by stored state; empty means all.
	States []ApprovalState
	// Limit is the page size and must be positive.
	Limit     int
	PageToken string
}

// ConsumeRequest is what ConsumeApprovalAudited must find to consume.
type ConsumeRequest struct {
	// Kind defaults to KindPublish; a request of another kind is never
	// consumed.
	Kind                                              ApprovalKind
	ID, JobID, BundleDigest, TargetRepo, TargetBranch string
	// By is the consumer's SPIFFE ID; At is now, which must be before the
	// approval's expiry.
	By string
	At time.Time
}

// Lease is a short-lived credential grant; the secret is never stored.
type Lease struct {
	ID           string
	Purpose      string
	JobID        string
	Resource     string
	Holder       string
	IssuedAt     time.Time
	ExpiresAt    time.Time
	RevokedAt    time.Time
	RevokeReason string
}

// Active reports whether the lease is neither revoked nor expired at now.
func (l Lease) Active(now time.Time) bool {
	return l.RevokedAt.IsZero() && now.Before(l.ExpiresAt)
}

// LeaseFilter selects leases for ListLeases.
type LeaseFilter struct {
	// JobID, if set, selects one job's leases.
	JobID string
	// ActiveAt, if set, selects only leases active at that time.
	ActiveAt time.Time
	// Limit is the page size and must be positive.
	Limit     int
	PageToken string
}

// ApprovalStore is the part of Store that keeps approvals and leases.
// Every change is written with its audit event in one transaction.
type ApprovalStore interface {
	// CreateApprovalAudited records a. A publish request is not recorded
	// when the job already has one: that one is returned with
	// created=false and nothing is written, e included. Change requests
	// are always recorded.
	CreateApprovalAudited(ctx context.Context, a Approval, e audit.Event) (stored Approval, created bool, err error)
	// GetApproval returns one approval with its votes, or ErrNotFound.
	GetApproval(ctx context.Context, id string) (Approval, error)
	// ApprovalForJob returns the job's publish approval, or ErrNotFound.
	ApprovalForJob(ctx context.Context, jobID string) (Approval, error)
	// ListApprovals returns a page of approvals, newest first.
	ListApprovals(ctx context.Context, f ApprovalFilter) ([]Approval, string, error)
	// DecideApprovalAudited locks approval id, lets decide change its
	// State and return the vote to add and the audit event, and writes
	// all three in one transaction; on any error (decide's own, or a
	// second vote by the same approver, which wraps ErrAlreadyExists)
	// nothing is written.
	DecideApprovalAudited(ctx context.Context, id string, decide func(*Approval) (Vote, audit.Event, error)) (Approval, error)
	// ConsumeApprovalAudited turns approval r.ID from approved to consumed
	// if, and only if, its job, digest and target are r's and it has not
	// expired at r.At, in one conditional update, appending e with it.
	// Anything else wraps ErrFailedPrecondition and writes nothing.
	ConsumeApprovalAudited(ctx context.Context, r ConsumeRequest, e audit.Event) (Approval, error)
	// ApplyChangeAudited consumes change request r (as
	// ConsumeApprovalAudited does, with r.Kind KindChange) and updates its
	// job with update, appending consumed and the event update returns, all
	// in one transaction: the change takes effect exactly when the
	// approval is spent. On any error nothing is written.
	ApplyChangeAudited(ctx context.Context, r ConsumeRequest, consumed audit.Event, update func(*Job) (audit.Event, error)) (Approval, Job, error)
	// CreateLeaseAudited records l with e.
	CreateLeaseAudited(ctx context.Context, l Lease, e audit.Event) (Lease, error)
	// GetLease returns one lease, or ErrNotFound.
	GetLease(ctx context.Context, id string) (Lease, error)
	// RevokeLeaseAudited sets the revocation of lease id, if it is not
	// yet revoked, with e; an already revoked lease wraps
	// ErrFailedPrecondition.
	RevokeLeaseAudited(ctx context.Context, id string, at time.Time, reason string, e audit.Event) (Lease, error)
	// ListLeases returns a page of leases, newest first.
	ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, string, error)
	// ExpireApprovalsAudited rewrites up to limit pending or approved
	// approvals whose expiry is at or before now as expired, each in its
	// own transaction with the event event returns for it, and returns
	// those it rewrote. An approval decided or consumed meanwhile (by a
	// replica, say) is left alone.
	ExpireApprovalsAudited(ctx context.Context, now time.Time, limit int, event func(Approval) audit.Event) ([]Approval, error)
	// WithdrawApprovalAudited rewrites approval id as expired, with the
	// event event returns for it, if it is still pending or approved (its
	// request was withdrawn), and reports whether it did.
	WithdrawApprovalAudited(ctx context.Context, id string, event func(Approval) audit.Event) (bool, error)
	// ExpireChangesOfEndedJobsAudited rewrites up to limit pending or
	// approved change and start approvals whose job has ended (finished, failed or
	// cancelled) as expired, each with its event: such a change can no
	// longer apply. It returns those it rewrote.
	ExpireChangesOfEndedJobsAudited(ctx context.Context, limit int, event func(Approval) audit.Event) ([]Approval, error)
	// ExpireLeasesAudited ends up to limit unrevoked leases whose expiry is
	// at or before now — revoked at their expiry, reason "expired" — each
	// with its event, and returns them.
	ExpireLeasesAudited(ctx context.Context, now time.Time, limit int, event func(Lease) audit.Event) ([]Lease, error)
	// RevokeLeasesAudited ends up to limit of the leases r selects, each
	// in its own transaction with the event event returns for it (given
	// the state of the lease's job, "" when the job is gone), whose Reason
	// is the lease's revoke reason, and returns those it ended. A lease
	// ended meanwhile (by a replica, say) is left alone.
	RevokeLeasesAudited(ctx context.Context, r LeaseRevocation, limit int, event func(l Lease, job State) audit.Event) ([]Lease, error)
}

// LeaseRevocation selects the leases RevokeLeasesAudited ends: the active
// ones at At (not revoked, expiring after At) of Purpose, narrowed by the
// rest of its fields that are set.
type LeaseRevocation struct {
	// Purpose and At are required; At is also the revocation's time.
	Purpose string
	At      time.Time
	// Holder selects the leases one identity (a SPIFFE ID) holds.
	Holder string
	// IssuedBefore selects the leases issued before it.
	IssuedBefore time.Time
	// JobEnded selects the leases whose job has ended (finished, failed
	// or cancelled).
	JobEnded bool
}

// ExpiredReason is the revoke reason of a lease that ran out.
const ExpiredReason = "expired"

// ExecState is where an exec is, as the authority last knew it. The values
// are what the database holds, so they never change.
type ExecState string

// Exec states: requested (recorded, not yet seen at the executor) →
// running → ended. A record never moves back.
const (
	ExecRequested ExecState = "requested"
	ExecRunning   ExecState = "running"
	ExecEnded     ExecState = "ended"
)

// Exec is the authority's own record of one exec of a session: what was
// asked, by whom, and what the executor last said of it. The executor's
// record is the fuller one; this one answers when the executor cannot.
type Exec struct {
	// SessionID and ExecID name it; together they are unique.
	SessionID, ExecID string
	// Seq is its place in the session, 0 until the executor said.
	Seq int64
	// SpecDigest identifies the whole spec (stdin by its digest), so a
	// retry with another spec is caught; "" when the authority never saw
	// the whole spec (a record learnt from a cut-down listing).
	SpecDigest string
	// Summary is the jobs package's bounded summary of the spec; the store
	// does not interpret it.
	Summary []byte
	State   ExecState
	// Reason names how it ended ("exited", "timeout", ...); ExitCode is
	// its status when it exited, otherwise -1; Message is a sentence.
	Reason   string
	ExitCode int32
	Message  string
	// RequestedBy is the caller's SPIFFE ID, "" for a record learnt from
	// the executor.
	RequestedBy string
	RequestedAt time.Time
	StartedAt   time.Time
	EndedAt     time.Time
	// Output kept at the executor, once known: sizes, whether each stream
	// was cut, and the SHA-256 (hex) of the bytes kept.
	StdoutSize, StderrSize           int64
	StdoutTruncated, StderrTruncated bool
	StdoutSHA256, StderrSHA256       string
	UpdatedAt                        time.Time
	// Version increases by one with every stored change.
	Version int64
}

// ExecStore is the part of Store that keeps a session's execs.
type ExecStore interface {
	// CreateExecAudited records x unless (x.SessionID, x.ExecID) already
	// exists, and appends the audit event event returns, in one
	// transaction. event is called with nil when x is new and with the
	// stored record otherwise; an error from it writes nothing and is
	// returned. created says whether x was recorded.
	CreateExecAudited(ctx context.Context, x Exec, event func(existing *Exec) (audit.Event, error)) (stored Exec, created bool, err error)
	// UpdateExec reads the exec, lets update change it, and writes it back
	// atomically with Version incremented; when there is none, update gets
	// a record holding only the two ids and found false, and what it makes
	// of it is created. update returning an error writes nothing. The ids
	// are not written even if update changes them.
	UpdateExec(ctx context.Context, sessionID, execID string, update func(x *Exec, found bool) error) (Exec, error)
	// GetExec returns one exec, or an error wrapping ErrNotFound.
	GetExec(ctx context.Context, sessionID, execID string) (Exec, error)
	// ListExecs returns a session's last execs, at most last of them,
	// oldest first by RequestedAt (for a record learnt from the executor,
	// when it started) then ExecID, and how many the session has in all.
	ListExecs(ctx context.Context, sessionID string, last int) ([]Exec, int64, error)
}

// ExecutorState is an executor's health in the fleet. The values are what
// the database holds, so they never change.
type ExecutorState string

// Executor states: up while its heartbeats arrive, lost once they stopped
// for longer than the fleet's bound, up again when one arrives.
const (
	ExecutorUp   ExecutorState = "up"
	ExecutorLost ExecutorState = "lost"
)

// Executor is one member of the executor fleet as the authority keeps it.
type Executor struct {
	// Name is its name in the fleet (its certificate's instance), unique;
	// ID its SPIFFE ID, unique too.
	Name string
	ID   string
	// Address is the host:port the authority reaches it at.
	Address string
	// Report is its last report, serialized by the fleet package; the
	// store does not interpret it.
	Report []byte
	State  ExecutorState
	// Draining, with who asked, when and why: no new work goes to it.
	Draining    bool
	DrainedBy   string
	DrainedAt   time.Time
	DrainReason string
	// JoinedAt is its first heartbeat; LastSeen its last.
	JoinedAt time.Time
	LastSeen time.Time
	// Version increases by one with every stored change.
	Version int64
}

// Placement counts the jobs (and sessions) of one tenant placed on one
// executor that have not ended.
type Placement struct {
	// Executor is the executor's SPIFFE ID, as Job.Executor holds it.
	Executor string
	Tenant   string
	Jobs     int64
}

// FleetStore is the part of Store that keeps the executor fleet and the
// replicas' claims on unfinished jobs.
type FleetStore interface {
	// UpdateExecutorAudited reads executor name (found false and a record
	// holding only the name when there is none), lets update change it
	// and return an audit event or nil, and writes the record, and the
	// event when there is one, in one transaction, Version incremented.
	// An error from update writes nothing and is returned. Two updates of
	// one executor never interleave, across replicas too; the name is not
	// written even if update changes it.
	UpdateExecutorAudited(ctx context.Context, name string, update func(e *Executor, found bool) (*audit.Event, error)) (Executor, error)
	// GetExecutor returns one executor, or an error wrapping ErrNotFound.
	GetExecutor(ctx context.Context, name string) (Executor, error)
	// ListExecutors returns the whole fleet, by name.
	ListExecutors(ctx context.Context) ([]Executor, error)
	// Placements counts the jobs in a state that has not ended (queued,
	// staging, running) per executor and tenant; jobs placed nowhere are
	// not counted.
	Placements(ctx context.Context) ([]Placement, error)
	// JobsOnExecutor returns up to limit jobs placed on executor (a SPIFFE
	// ID) in one of states (all unfinished ones when none), oldest first.
	JobsOnExecutor(ctx context.Context, executor string, limit int, states ...State) ([]Job, error)

	// ClaimJobs takes up to limit unfinished jobs whose claim has expired
	// at now (or that have none), oldest first, for owner until until,
	// and returns them as now stored. Two replicas claiming at once never
	// take the same job: each skips rows the other holds locked.
	ClaimJobs(ctx context.Context, owner string, now, until time.Time, limit int) ([]Job, error)
	// RenewClaims extends to until the claims owner still holds on
	// unfinished jobs, and returns the ids of those jobs: a job missing
	// from them was taken by another replica (or has ended).
	RenewClaims(ctx context.Context, owner string, until time.Time) ([]string, error)
	// ReleaseClaims ends owner's claims (on a clean stop), so another
	// replica takes the jobs up at once; the jobs are then claimed by no
	// one (ClaimedBy "", ClaimExpiresAt zero).
	ReleaseClaims(ctx context.Context, owner string) error
}
