// Package runs owns the executor's runs: it takes a job's grant (a Grant,
// which the adapter made from a grant whose signature it verified), runs it
// at most once per job id, stages its source, runs it in the sandbox behind
// its network policy, puts a newer grant's limits and policy in force while
// it runs, builds and signs its result bundle, reports the outcome to the
// authority, and serves state, output and bundles to the API. Run records
// survive restarts; a run that was in flight when the executor died is
// cleaned up and reported failed. It imports no grpc or proto: the signed
// grant is opaque bytes here. Only the executor's api, convert,
// fleetclient and server packages import it.
package runs

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/provenance"
	"github.com/airlockhq/airlock/services/executor/internal/cache"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
	"github.com/airlockhq/airlock/services/executor/internal/warmpool"
)

// State is where a run is.
type State string

// Run states.
const (
	Staging   State = "staging"
	Running   State = "running"
	Finished  State = "finished"
	Failed    State = "failed"
	Cancelled State = "cancelled"
)

// Terminal reports whether s is an end state.
func (s State) Terminal() bool { return s == Finished || s == Failed || s == Cancelled }

// Reasons beyond the sandbox's own.
const ReasonExecutorRestarted sandbox.Reason = "executor_restarted"

// Result is a run's outcome.
type Result struct {
	Reason          sandbox.Reason `json:"reason"`
	ExitCode        int            `json:"exit_code"`
	Usage           sandbox.Usage  `json:"usage"`
	Class           sandbox.Class  `json:"runtime_class"`
	RuntimeVersion  string         `json:"runtime_version"`
	TemplateVersion string         `json:"template_version"`
	BundleDigest    string         `json:"bundle_digest,omitempty"`
	BundleSize      int64          `json:"bundle_size,omitempty"`
	FilesChanged    int64          `json:"files_changed"`
	Insertions      int64          `json:"insertions"`
	Deletions       int64          `json:"deletions"`
	// PatchSize is the whole patch's size in bytes.
	PatchSize int64  `json:"patch_size"`
	Message   string `json:"message,omitempty"`
	// Caches are the named caches the run used: it did not start clean.
	Caches []CacheUse `json:"caches,omitempty"`
	// Image is the image the run's root was ("registry/repository@digest"),
	// "" for the host template.
	Image string `json:"image,omitempty"`
	// AwakeTime and AsleepTime split the run's time from its start to its
	// end: a session's with its sandbox running, and suspended (asleep,
	// by its client, or across the executor's restart). A job is awake
	// throughout.
	AwakeTime  time.Duration `json:"awake_time,omitempty"`
	AsleepTime time.Duration `json:"asleep_time,omitempty"`
	// NetworkSentBytes and NetworkReceivedBytes are the bytes the job
	// sent and received over its sandbox's network interface (its veth,
	// counted at the host end: netpolicy.Net.Bytes), summed over a
	// session's sandboxes across its suspensions and executor restarts.
	// Whole frames under every policy: a domains job's traffic to the
	// egress proxy and its DNS queries to the executor count too; a
	// deny-all job has no interface and counts nothing.
	NetworkSentBytes     int64 `json:"network_sent_bytes,omitempty"`
	NetworkReceivedBytes int64 `json:"network_received_bytes,omitempty"`
}

// Run is the record of one job's execution.
type Run struct {
	JobID string `json:"job_id"`
	State State  `json:"state"`
	// SignedGrant is the grant in force (Update replaces it) as the
	// authority signed it, and Grant the same grant as runs uses it.
	SignedGrant []byte    `json:"signed_grant"`
	Grant       Grant     `json:"grant"`
	CreatedAt   time.Time `json:"created_at"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	FinishedAt  time.Time `json:"finished_at,omitzero"`
	Result      *Result   `json:"result,omitempty"`
	Reported    bool      `json:"reported"`
	// NetworkUpdatedAt is when the grant's network policy was last put in
	// force; zero until the job's own namespace had it.
	NetworkUpdatedAt time.Time `json:"network_updated_at,omitzero"`
	// NetworkFailure says why the grant's network policy could not be put
	// in force; the job did not run.
	NetworkFailure string `json:"network_failure,omitempty"`
	// Truncated names the output streams that hit their cap.
	Truncated map[string]bool `json:"truncated,omitempty"`
	// Suspended is set while a session is suspended: its sandbox runs
	// nothing, and keeps only its /work changes and /out.
	Suspended   bool      `json:"suspended,omitempty"`
	SuspendedAt time.Time `json:"suspended_at,omitzero"`
	// SuspendReason is why: "" when its client suspended it,
	// ReasonIdleTimeout when it fell asleep (its grant says on_idle
	// sleep), ReasonExecutorRestarted when the executor stopped under it
	// and kept its files.
	SuspendReason sandbox.Reason `json:"suspend_reason,omitempty"`
	// AsleepTime is how long the session's suspensions that have ended
	// lasted (Times adds the current one).
	AsleepTime time.Duration `json:"asleep_time,omitempty"`
	// NetSentBefore and NetReceivedBefore are the network bytes of a
	// session's network namespaces before the executor's restart (each
	// start makes a new one, with new counters): account adds the
	// current one's.
	NetSentBefore     int64 `json:"net_sent_before,omitempty"`
	NetReceivedBefore int64 `json:"net_received_before,omitempty"`
}

// Authority is the executor's view of the authority.
type Authority interface {
	// FetchSource opens the tree of the job's commit.
	FetchSource(ctx context.Context, jobID string) (stage.Header, io.ReadCloser, error)
	// ReportResult records the outcome.
	ReportResult(ctx context.Context, r Report) error
	// FetchImageBlob opens one blob of the job's image (package images).
	images.Fetcher
}

// Signer signs provenance with the executor's identity.
type Signer func(bundleName, digest string, run provenance.Run) ([]byte, error)

// Config is what the manager needs.
type Config struct {
	Dir string // where run records, output and bundles live
	// DecodeGrant makes the Grant of a record written before records kept
	// one, from its signed grant (verified when the run was accepted);
	// nil leaves such a record's Grant zero.
	DecodeGrant func(signed []byte) (Grant, error)
	Sandbox     *sandbox.Manager
	Sources     *stage.Cache
	// Caches keeps the tenants' named caches; nil refuses every grant
	// that names one.
	Caches *cache.Store
	// Images keeps the images jobs run on; nil refuses every grant that
	// names one.
	Images *images.Store
	// Network makes each job's network namespace and enforces its policy.
	Network *netpolicy.Manager
	// Resolver resolves names for jobs with a domains policy (their egress
	// proxy and DNS server); nil is the host's resolver.
	Resolver  Resolver
	Authority Authority
	Sign      Signer
	Executor  string // our SPIFFE ID, for provenance
	// OutputLimit caps each of stdout and stderr; default 4 MiB.
	OutputLimit int64
	// ReviewPatchLimit caps the patch sent to the authority for review;
	// the bundle always has the whole patch. Default 1 MiB.
	ReviewPatchLimit int64
	// ExportTimeout bounds computing a job's patch once it has ended
	// (export.go); default 10 minutes.
	ExportTimeout time.Duration
	// Capacity bounds what the runs not yet ended hold together; a new
	// run or a raised limit beyond it is refused. Zero bounds nothing.
	Capacity Capacity
	// Credentials leases the brokered credentials jobs name
	// (credentials.go); nil refuses every grant that names one.
	Credentials CredentialLeaser
	// Fence, if set, holds new runs in staging, before their sandbox is
	// made, while it says so; nil never does. It pauses the warm pool too.
	Fence Fence
	// WarmPool bounds the sandboxes kept ready for sessions (warm.go).
	WarmPool WarmPool
	// Meter makes the executor's metrics (metrics.go); nil is the global
	// meter provider.
	Meter  metric.MeterProvider
	Logger *slog.Logger
	Now    func() time.Time
}

// Manager runs jobs.
type Manager struct {
	cfg  Config
	mu   sync.Mutex
	runs map[string]*entry
	// unstarted holds, for a while, the jobs cancelled before they had a
	// run here, so a StartJob already on its way when the cancel arrived
	// is refused rather than starting work nobody wants.
	unstarted map[string]time.Time
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	// refused is what the egress proxies refuse, the host's current
	// addresses among it.
	refused refusedCache
	// roots is the jobs' trust store (the sandbox's), which a brokered
	// credential's upstream must chain to unless its lease names a CA.
	roots   *x509.CertPool
	metrics *metrics
	// pool keeps sandboxes ready for sessions (warm.go); nil keeps none.
	// poolShapes are the shapes kept for each tenant, the newest last,
	// under poolMu. shedKick asks the one shedding loop for a pass
	// (shedPool).
	pool       *warmpool.Pool[poolKey, pooled]
	poolMu     sync.Mutex
	poolShapes map[string][]tenantShape
	shedKick   chan struct{}
}

// entry is a run in memory: its record, its output, and how to stop it.
type entry struct {
	run     Run
	stdout  *output
	stderr  *output
	cancel  context.CancelFunc
	changed chan struct{} // closed and replaced on every change

	// updateMu serializes Updates of the run's grant with execute making
	// the sandbox from it and tearing it down, so an update either reaches
	// the live sandbox and namespace or is the grant they are made from.
	updateMu sync.Mutex
	sb       *sandbox.Sandbox // while it exists; guarded by updateMu
	net      *netpolicy.Net   // while it exists; set under updateMu and m.mu, read under either
	// egress is a domains job's proxy and DNS server while its namespace
	// exists; guarded by updateMu. Set only when the job started with a
	// domains policy (the mode it may not leave but for deny_all).
	egress *jobEgress
	// caches are the job's holds on its named caches while its sandbox
	// exists; guarded by updateMu.
	caches []cache.Lease

	// abort, once set (under the manager's mu), is why the job was
	// stopped because its grant could no longer be enforced.
	abort string
	// cancelWhy, once set (under the manager's mu), is why CancelBecause
	// cancelled the run.
	cancelWhy string

	// raising, while an Update puts higher limits in force, is those
	// limits: until the grant in force is theirs, the run holds capacity
	// for both. Set and cleared under the manager's mu.
	raising *sandbox.Limits

	// A session's, under the manager's mu: its execs by id and in order,
	// how many run, when one last started or ended, the sandbox while it
	// takes execs, and, once set, why it is being stopped. execWG counts
	// the exec goroutines.
	execs        map[string]*execEntry
	execOrder    []*execEntry
	lastSeq      int64 // the highest exec seq with a directory, read or not (loadExecs)
	runningExecs int
	lastActive   time.Time
	live         *sandbox.Sandbox
	stopping     sandbox.Reason
	execWG       sync.WaitGroup
	execOutput   int64               // bytes the ended execs' output files hold
	writes       []FileWrite         // the client's uploads, in order (recordWrite)
	writePaths   map[string]struct{} // the paths they went to (reserveWritePath)
	// filesMu is held for reading by each files API call while it uses
	// the sandbox, and for writing once the sandbox stops taking calls
	// (before its patch is taken) and while it is torn down. filesCtx
	// ends when the sandbox stops taking calls; filesActive counts the
	// calls in flight (under the manager's mu).
	filesMu     sync.RWMutex
	filesCtx    context.Context
	filesCancel context.CancelFunc
	filesActive int
	// forwards counts the session's forwarded connections (portforward.go).
	forwards int
	// suspending is set by Suspend (and by the idle watcher putting the
	// session to sleep) until the session runs again, suspendWhy to why
	// (the record's SuspendReason once it is suspended); stopRun stops
	// the sandbox's current Run; resumeAsked, set by Resume of a
	// suspended session, wakes it (Suspend clears it).
	suspending  bool
	suspendWhy  sandbox.Reason
	stopRun     context.CancelFunc
	resumeAsked bool
	// idleChanged is closed and replaced (under the manager's mu) when
	// an Update changes a session's settings, to wake its idle watcher.
	idleChanged chan struct{}
	// kept is set for a session whose sandbox the previous executor
	// process kept (Recover): it is made again on the kept scratch, and
	// waits suspended for its client.
	kept bool
	// trace is the trace its StartJob call was part of, which its spans
	// continue; readySpan, under the manager's mu, is a session's from its
	// sandbox made to it taking execs.
	trace     trace.SpanContext
	readySpan trace.Span
}

// New loads existing run records from cfg.Dir.
func New(cfg Config) (*Manager, error) {
	if cfg.OutputLimit == 0 {
		cfg.OutputLimit = 4 << 20
	}
	if cfg.ReviewPatchLimit == 0 {
		cfg.ReviewPatchLimit = 1 << 20
	}
	if cfg.ExportTimeout <= 0 {
		cfg.ExportTimeout = defaultExportTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{cfg: cfg, runs: map[string]*entry{}, unstarted: map[string]time.Time{}, ctx: ctx, cancel: cancel, poolShapes: map[string][]tenantShape{}}
	if cfg.Sandbox != nil {
		m.roots = trustPool(cfg.Sandbox.TrustedCAs())
	}
	dirs, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(cfg.Dir, d.Name(), "run.json"))
		if err != nil {
			continue // an incomplete directory: no record was ever written
		}
		var r Run
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("runs: %s: %w", d.Name(), err)
		}
		// The grant was verified when the run was accepted; the record is
		// the executor's own.
		r.Grant.Signed = r.SignedGrant
		if r.Grant.JobID == "" && cfg.DecodeGrant != nil {
			if g, err := cfg.DecodeGrant(r.SignedGrant); err == nil {
				r.Grant = g
			}
		}
		e := &entry{run: r, changed: make(chan struct{})}
		if err := m.loadExecs(e); err != nil {
			return nil, err
		}
		m.runs[r.JobID] = e
	}
	if err := m.newPool(); err != nil {
		return nil, fmt.Errorf("runs: warm pool: %w", err)
	}
	if m.metrics, err = newMetrics(cfg.Meter, m); err != nil {
		return nil, fmt.Errorf("runs: metrics: %w", err)
	}
	return m, nil
}

// Recover ends every job that was in flight when a previous executor
// process stopped: the sandbox layer removes what it left, and each such
// job is recorded failed (executor restarted) and reported. A session
// outlives the restart when its files could be kept (the previous process
// stopped gracefully, or died with the host still up): its execs that
// were running end executor_restarted, and it is suspended, reason
// executor_restarted, with its /work changes and /out, for its client to
// resume, finish or cancel; its deadline counts on. Runs that ended but
// were not reported are reported now. ctx ending stops the sandbox
// layer's waits (an executor asked to stop while it starts).
func (m *Manager) Recover(ctx context.Context) error {
	start := time.Now()
	// Progress for a start that waits on a host busy with IO.
	slow := time.AfterFunc(recoverSlow, func() {
		m.cfg.Logger.Warn("still removing the sandboxes a previous executor left", "after", recoverSlow)
	})
	cleaned, err := m.cfg.Sandbox.Recover(ctx, m.keepSession)
	slow.Stop()
	if err != nil {
		return fmt.Errorf("runs: recover sandboxes: %w", err)
	}
	if m.cfg.Caches != nil {
		// Holds of jobs gone with the previous process go; a kept
		// session's stay, for the generation it started with.
		if err := m.cfg.Caches.Recover(m.keepSession); err != nil {
			return fmt.Errorf("runs: recover caches: %w", err)
		}
	}
	if len(cleaned) > 0 {
		m.cfg.Logger.Warn("removed sandboxes left by a previous executor", "jobs", cleaned, "took", time.Since(start))
	}
	kept, err := m.recoverRuns()
	if kept {
		// Outside m.mu: a sync of the whole file system can take a while.
		m.syncRecords()
	}
	if err == nil {
		m.startPool()
	}
	return err
}

// recoverSlow is how long Recover removes what a previous executor left
// before it says it is still at it.
const recoverSlow = 10 * time.Second

// recoverRuns is Recover's pass over the runs, under m.mu; it says whether
// it kept a session.
func (m *Manager) recoverRuns() (kept bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.runs {
		var written time.Time
		if !e.run.State.Terminal() && !e.run.Suspended {
			// Before the records below are written.
			written = lastWrite(m.runDir(e.run.JobID), e.run.StartedAt, m.cfg.Now())
		}
		m.endLeftExecs(e)
		_, _, isSession := e.session()
		switch {
		case e.run.State.Terminal():
		case isSession && m.cfg.Sandbox.Kept(e.run.JobID):
			if err := m.resumeKept(e, written); err != nil {
				return kept, err
			}
			kept = true
			continue
		default:
			e.run.State = Failed
			e.run.FinishedAt = m.cfg.Now()
			// The reason is the whole story; the authority words it.
			e.run.Result = &Result{Reason: ReasonExecutorRestarted, ExitCode: -1}
			if isSession {
				e.run.Result.Message = "the executor restarted and the session's files could not be kept"
			}
			if err := m.persist(&e.run); err != nil {
				return kept, err
			}
			m.metrics.runEnded(e.run)
		}
		if !e.run.Reported {
			m.reportLater(e.run.JobID)
		}
	}
	return kept, nil
}

// syncRecords puts the runs' records on disk. Exec records and in-flight
// run records are written to the page cache only (persistExec, persist):
// enough while the host is up, and a host crash ends a running session
// with its sandbox. A session whose files are kept outlives that, so its
// records are synced when it is kept (Recover, and an executor stopping
// under it).
func (m *Manager) syncRecords() {
	if err := atomicfile.SyncFS(m.cfg.Dir); err != nil {
		m.cfg.Logger.Warn("sync the runs' records of kept sessions", "error", err)
	}
}

// keepSession says which sandboxes Recover keeps the files of: those of
// sessions not ended.
func (m *Manager) keepSession(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[id]
	if !ok || e.run.State.Terminal() {
		return false
	}
	_, _, isSession := e.session()
	return isSession
}

// resumeKept brings back a session whose files the previous executor
// process kept: suspended (for the executor's restart, unless its client
// had suspended it already) until its client resumes it. Callers hold
// m.mu. written is when it last wrote to its records.
func (m *Manager) resumeKept(e *entry, written time.Time) error {
	if !e.run.Suspended {
		// Killed (a stopping executor records its sessions suspended): it
		// stopped running at the latest when it last wrote to its records,
		// so the time down since counts asleep, not awake.
		e.run.Suspended, e.run.SuspendedAt, e.run.SuspendReason = true, written, ReasonExecutorRestarted
	}
	if e.run.StartedAt.IsZero() {
		e.run.StartedAt = m.cfg.Now()
	}
	e.run.State, e.kept = Running, true
	if err := m.persist(&e.run); err != nil {
		return err
	}
	notify := func() { m.mu.Lock(); e.notify(); m.mu.Unlock() }
	var err error
	if e.stdout, err = newOutput(filepath.Join(m.runDir(e.run.JobID), "stdout.log"), m.cfg.OutputLimit, notify); err != nil {
		return err
	}
	if e.stderr, err = newOutput(filepath.Join(m.runDir(e.run.JobID), "stderr.log"), m.cfg.OutputLimit, notify); err != nil {
		return err
	}
	m.cfg.Logger.Info("session kept across the executor's restart; suspended until resumed", "job_id", e.run.JobID)
	m.launch(e)
	return nil
}

// Close stops every run and waits for their goroutines.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
	if err := m.metrics.observed.Unregister(); err != nil {
		m.cfg.Logger.Warn("unregister the run gauges", "error", err)
	}
}

func (m *Manager) runDir(jobID string) string { return filepath.Join(m.cfg.Dir, jobID) }

// persist writes r's record. Only an ended run's record is synced to disk
// before returning: losing a newer in-flight state in a crash changes
// nothing, because Recover fails every run that was not ended, and the
// fsyncs would cost a few milliseconds per state on every job.
func (m *Manager) persist(r *Run) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	d := atomicfile.Fast
	if r.State.Terminal() {
		d = atomicfile.Durable
	}
	return atomicfile.Write(filepath.Join(m.runDir(r.JobID), "run.json"), data, 0o600, d)
}

// notify wakes every watcher of e. Callers hold m.mu.
func (e *entry) notify() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// update changes e's record under the lock, persists it and wakes watchers.
func (m *Manager) update(e *entry, f func(r *Run)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&e.run)
	if err := m.persist(&e.run); err != nil {
		m.cfg.Logger.Error("persist run", "job_id", e.run.JobID, "error", err)
	}
	e.notify()
}

// lastWrite is when a file under dir (a run's record, its execs' records
// and output, its egress record) was last written, within [from, to]; to
// when there is none to tell.
func lastWrite(dir string, from, to time.Time) time.Time {
	var last time.Time
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil //nolint:nilerr // what cannot be read tells nothing
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().After(last) {
			last = fi.ModTime()
		}
		return nil
	})
	if last.IsZero() || last.After(to) {
		return to
	}
	if last.Before(from) {
		return from
	}
	return last
}
