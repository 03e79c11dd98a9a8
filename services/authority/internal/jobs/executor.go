package jobs

import (
	"context"
	"io"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/imagecache"
	"github.com/airlockhq/airlock/pkg/tunnel"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
)

// RunState is the executor's view of a run.
type RunState int

const (
	RunUnknown RunState = iota
	RunStaging
	RunRunning
	RunFinished
	RunFailed
	RunCancelled
)

// Stream names an output stream.
type Stream int

const (
	Stdout Stream = iota + 1
	Stderr
)

// Output is a piece of a job's output.
type Output struct {
	Stream    Stream
	Offset    int64
	Data      []byte
	Truncated bool
}

// Offsets are where to resume each output stream (past its end: none of
// it), and, when Egress is set, the run's egress record.
type Offsets struct {
	Stdout, Stderr int64
	// Egress asks for the egress record from the decision at EgressIndex.
	Egress      bool
	EgressIndex int64
}

// EgressEntry is one decision of a running job's egress record, at Index
// (from 0) in the executor's egress.jsonl.
type EgressEntry struct {
	Index  int64
	Record egress.Record
}

// RunEvent is one message of the executor's run stream: a state (with the
// network policy state, "" when not reported) or a piece of output.
type RunEvent struct {
	State        RunState
	NetworkState string
	// GrantGeneration is the generation of the grant the run is under,
	// which NetworkState is about.
	GrantGeneration int64
	Output          *Output
	Egress          *EgressEntry
}

// Executor is every call the authority makes to one executor: runs (jobs
// and sessions alike) through Runs, a session's execs and files through
// Sessions, its caches and its result bundles. It is the only way from the
// authority to an executor, so a real one and the tests' fake both sit
// behind it. Errors wrap pkg/errdefs sentinels: ErrUnavailable for
// anything worth retrying.
type Executor interface {
	Runs
	Sessions
	Caches
	ImageCache
	// OpenArtifact streams the result bundle of jobID named by digest.
	OpenArtifact(ctx context.Context, jobID, digest string) (io.ReadCloser, error)
}

// Executors reaches the executors of the fleet by their SPIFFE IDs.
type Executors interface {
	// For returns the executor with SPIFFE ID id. One the fleet does not
	// know, or cannot reach, answers every call with ErrUnavailable.
	For(id string) Executor
}

// Fleet is the executor fleet as the jobs package uses it: package fleet.
type Fleet interface {
	// Place chooses an executor for job, or says why none fits now.
	Place(ctx context.Context, job string, need fleet.Need) (fleet.Member, string, error)
	// Release drops job's placement reservation.
	Release(job string)
	// Ended frees what job, placed on executor id with need, held there.
	Ended(job, id string, need fleet.Need)
	// Full holds executor name back after it refused a job for room.
	Full(name string)
	// Sweep marks executors lost and returns every lost one.
	Sweep(ctx context.Context, by identity.ID) ([]fleet.Member, error)
	// List returns the whole fleet.
	List(ctx context.Context) ([]fleet.Member, error)
	// Lookup returns the executor with SPIFFE ID id, as recently read;
	// Current as the store holds it now.
	Lookup(ctx context.Context, id string) (fleet.Member, bool, error)
	Current(ctx context.Context, id string) (fleet.Member, bool, error)
}

// ImageCache reaches the executor's image cache, as one tenant sees it.
type ImageCache interface {
	// ListImages lists the images the tenant's jobs used (one, with its
	// layers, when digest is set) and the whole cache's stats.
	ListImages(ctx context.Context, tenant, digest string) (imagecache.List, error)
	// PruneImages drops the tenant's hold on its images (one when digest
	// is set) that none of its jobs runs on.
	PruneImages(ctx context.Context, tenant, digest string) (imagecache.Pruned, error)
}

// Caches reaches a tenant's named caches on the executor.
type Caches interface {
	ListCaches(ctx context.Context, tenant string) ([]CacheInfo, error)
	// ClearCaches wipes the tenant's caches of repository (all if "")
	// named name (all if "") and returns them as they were.
	ClearCaches(ctx context.Context, tenant, repository, name string) ([]CacheInfo, error)
}

// CacheInfo is one named cache an executor keeps.
type CacheInfo struct {
	// Executor is the name of the executor keeping it (each executor
	// keeps its own copy of a tenant's cache).
	Executor         string
	Repository, Name string
	Size             int64
	LastUsed         time.Time
}

// Runs drives runs by their grants.
type Runs interface {
	// Start hands over a signed grant (SignedGrant.Wire); the same job
	// again returns the existing run.
	Start(ctx context.Context, grant []byte) (RunState, error)
	// Watch calls fn with every event of the run's stream, from the given
	// output offsets, until the run has ended and its output is drained
	// (then it returns nil), fn fails, or ctx ends.
	Watch(ctx context.Context, jobID string, from Offsets, fn func(RunEvent) error) error
	// Cancel asks the executor to kill the run.
	Cancel(ctx context.Context, jobID, reason string) error
	// Update hands over a newer grant of a running job and returns once
	// the executor has put it in force (its network rules in the kernel).
	Update(ctx context.Context, grant []byte) error
}

// Sessions reaches into a running session: its state, its execs and its
// files. The executor's refusals come back as they are, so the caller
// sees the executor's own words (and they still wrap the sentinels).
type Sessions interface {
	// RunStatus says whether the session's run is suspended.
	RunStatus(ctx context.Context, jobID string) (RunStatus, error)
	// Finish ends the session: its bundle is made.
	Finish(ctx context.Context, jobID string) error
	Suspend(ctx context.Context, jobID string) error
	Resume(ctx context.Context, jobID string) error

	// StartExec runs spec with stdin, once per exec id: the same id again
	// returns the exec it started (created false).
	StartExec(ctx context.Context, jobID string, spec ExecSpec, stdin []byte) (ExecSeen, bool, error)
	GetExec(ctx context.Context, jobID, execID string) (ExecSeen, error)
	// ListExecs lists the session's last execs and its uploads.
	ListExecs(ctx context.Context, jobID string) (ExecList, error)
	// WatchExec calls fn with the exec's output from the given offsets and
	// its record as it changes, until it has ended and its output is
	// drained, fn fails, or ctx ends.
	WatchExec(ctx context.Context, jobID, execID string, from Offsets, fn func(ExecEvent) error) error
	CancelExec(ctx context.Context, jobID, execID string) (ExecSeen, error)
	// RunExec starts (or attaches to) start's exec, passes what stdin
	// returns on to it until stdin returns io.EOF (stdin closed: passed
	// on) or another error (the call is broken off), and calls fn with
	// every event, until the exec has ended and its output is drained, fn
	// fails, or ctx ends.
	RunExec(ctx context.Context, jobID string, start ExecStart, stdin func() (StdinPart, error), fn func(ExecEvent) error) error

	// ReadFile calls fn with the file's header, then its chunks.
	ReadFile(ctx context.Context, jobID, path string, fn func(FilePart) error) error
	// WriteFile writes what next returns (until io.EOF) to path with mode
	// and returns the size written. An error from next breaks the upload
	// off and is returned as it is.
	WriteFile(ctx context.Context, jobID, path string, mode uint32, next func() ([]byte, error)) (int64, error)
	ListFiles(ctx context.Context, jobID, path string, recursive bool) ([]FileEntry, bool, error)

	// ForwardPort connects to TCP port inside the running session (for
	// forward forwardID, named in the executor's log) and returns the
	// connection's end once the executor has made it: Recv gives the
	// port's bytes (io.EOF at their end), Send takes bytes for it,
	// CloseSend half-closes it. Ending ctx cuts the connection.
	ForwardPort(ctx context.Context, jobID string, port uint32, forwardID string) (tunnel.End, error)
}

// RunStatus is a session's run as the executor holds it.
type RunStatus struct {
	Suspended     bool
	SuspendReason string
	// SuspendedAt is when a suspended session was suspended (zero when
	// the executor does not say).
	SuspendedAt time.Time
}

// ExecStart asks for an exec with streamed stdin (RunExec).
type ExecStart struct {
	Spec  ExecSpec
	Stdin []byte
	// From are the output offsets to send from when attaching.
	From Offsets
}

// StdinKind is what one message after an exec's start carries.
type StdinKind int

const (
	// StdinNone carries nothing: the executor judges it.
	StdinNone StdinKind = iota
	StdinData
	// StdinClose carries close_stdin with the value Close.
	StdinClose
	// StdinRestart is a second start, which the executor refuses.
	StdinRestart
)

// StdinPart is one message after an exec's start.
type StdinPart struct {
	Kind  StdinKind
	Data  []byte
	Close bool
}

// ExecEvent is one event of an exec: its start (Started, with Created
// when this call created it, and Exec), its record (Exec), or a piece of
// its output.
type ExecEvent struct {
	Started bool
	Created bool
	Exec    *ExecSeen
	Output  *Output
}

// FilePart is a file read from a session: its header (Header set, with
// Size) or a chunk.
type FilePart struct {
	Header bool
	Size   int64
	Chunk  []byte
}

// FileEntry is one entry of a session's directory listing.
type FileEntry struct {
	Path, Type string
	Size       int64
	Mode       uint32
	ModifiedAt time.Time
	Target     string
	// RawPath and RawTarget are the bytes of a name that is not UTF-8.
	RawPath, RawTarget []byte
}

// Usage is what an exec used, as the executor measured it.
type Usage struct {
	CPUTime, WallTime          time.Duration
	PeakMemoryBytes, DiskBytes int64
	PeakPids                   int64
}
