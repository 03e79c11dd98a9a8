// Package runs owns the executor's runs: it accepts a job only with a valid
// grant the authority signed, runs it at most once per job id, stages its
// source, runs it in the sandbox behind its network policy, puts a newer
// grant's limits and policy in force while it runs, builds and signs its
// result bundle, reports the outcome to the authority, and serves state,
// output and bundles to the API. Run records survive restarts; a run that was in
// flight when the executor died is cleaned up and reported failed. Only the
// executor's api and server packages import it.
package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/provenance"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
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
}

// Run is the record of one job's execution.
type Run struct {
	JobID       string    `json:"job_id"`
	State       State     `json:"state"`
	SignedGrant []byte    `json:"signed_grant"` // the grant in force (Update replaces it), a serialized typesv1.SignedGrant
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
}

// Grant returns the run's signed grant.
func (r *Run) Grant() (*typesv1.SignedGrant, error) {
	sg := &typesv1.SignedGrant{}
	return sg, proto.Unmarshal(r.SignedGrant, sg)
}

// Report is what the authority is told when a run ends.
type Report struct {
	JobID  string
	Result Result
	// Patch is the patch's first ReviewPatchLimit bytes (Result.PatchSize
	// is the whole patch's size).
	Patch []byte
	// Files is every file of the patch, from the bundle's file list; nil
	// when that list cannot be read (Result.FilesChanged still counts them).
	Files          []bundle.FileChange
	Stdout, Stderr Tail
	Provenance     []byte
	// Egress and EgressLast are a domains job's first and last decisions
	// (at most reviewEgress in all), EgressTotal how many its egress.jsonl
	// holds, EgressNames all of them summed by name. HasEgress is false,
	// and the rest zero, for other jobs.
	Egress, EgressLast []egress.Record
	EgressTotal        int
	EgressNames        []egress.NameSummary
	HasEgress          bool
}

// Tail is the end of one output stream, for reviewers.
type Tail struct {
	Data []byte
	// Size is how many bytes were recorded; Capped, that the stream hit
	// OutputLimit and the rest was never recorded.
	Size   int64
	Capped bool
}

// reviewTail is how much of each stream's end a report carries.
const reviewTail = 8 << 10

// Authority is the executor's view of the authority.
type Authority interface {
	// FetchSource opens the tree of the job's commit.
	FetchSource(ctx context.Context, jobID string) (stage.Header, io.ReadCloser, error)
	// ReportResult records the outcome.
	ReportResult(ctx context.Context, r Report) error
}

// Signer signs provenance with the executor's identity.
type Signer func(bundleName, digest string, run provenance.Run) ([]byte, error)

// Config is what the manager needs.
type Config struct {
	Dir      string // where run records, output and bundles live
	Verifier *grant.Verifier
	Sandbox  *sandbox.Manager
	Sources  *stage.Cache
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
	// Capacity bounds what the runs not yet ended hold together; a new
	// run or a raised limit beyond it is refused. Zero bounds nothing.
	Capacity Capacity
	Logger   *slog.Logger
	Now      func() time.Time
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
}

// entry is a run in memory: its record, its output, and how to stop it.
type entry struct {
	run     Run
	grant   *typesv1.Grant // the grant in force; written under both locks
	stdout  *output
	stderr  *output
	cancel  context.CancelFunc
	changed chan struct{} // closed and replaced on every change

	// updateMu serializes Updates of the run's grant with execute making
	// the sandbox from it and tearing it down, so an update either reaches
	// the live sandbox and namespace or is the grant they are made from.
	updateMu sync.Mutex
	sb       *sandbox.Sandbox // while it exists; guarded by updateMu
	net      *netpolicy.Net   // while it exists; guarded by updateMu
	// egress is a domains job's proxy and DNS server while its namespace
	// exists; guarded by updateMu. Set only when the job started with a
	// domains policy (the mode it may not leave but for deny_all).
	egress *jobEgress

	// abort, once set (under the manager's mu), is why the job was
	// stopped because its grant could no longer be enforced.
	abort string

	// raising, while an Update puts higher limits in force, is those
	// limits: until the grant in force is theirs, the run holds capacity
	// for both. Set and cleared under the manager's mu.
	raising *sandbox.Limits
}

var jobIDFormat = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// New loads existing run records from cfg.Dir.
func New(cfg Config) (*Manager, error) {
	if cfg.OutputLimit == 0 {
		cfg.OutputLimit = 4 << 20
	}
	if cfg.ReviewPatchLimit == 0 {
		cfg.ReviewPatchLimit = 1 << 20
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
	m := &Manager{cfg: cfg, runs: map[string]*entry{}, unstarted: map[string]time.Time{}, ctx: ctx, cancel: cancel}
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
		m.runs[r.JobID] = &entry{run: r, changed: make(chan struct{})}
	}
	return m, nil
}

// Recover ends every run that was in flight when a previous executor
// process stopped: the sandbox layer removes what it left, and each such
// run is recorded failed (executor restarted) and reported. Runs that ended
// but were not reported are reported now.
func (m *Manager) Recover(ctx context.Context) error {
	cleaned, err := m.cfg.Sandbox.Recover(ctx)
	if err != nil {
		return fmt.Errorf("runs: recover sandboxes: %w", err)
	}
	if len(cleaned) > 0 {
		m.cfg.Logger.Warn("removed sandboxes left by a previous executor", "jobs", cleaned)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.runs {
		if !e.run.State.Terminal() {
			e.run.State = Failed
			e.run.FinishedAt = m.cfg.Now()
			// The reason is the whole story; the authority words it.
			e.run.Result = &Result{Reason: ReasonExecutorRestarted, ExitCode: -1}
			if err := m.persist(&e.run); err != nil {
				return err
			}
		}
		if !e.run.Reported {
			m.reportLater(e.run.JobID)
		}
	}
	return nil
}

// Close stops every run and waits for their goroutines.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
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

// Start verifies sg and starts its run, or returns the existing run for the
// job id (created false). A grant with a bad signature, an unknown key or
// past its expiry is refused even for a known job id. A new run whose
// limits do not fit beside those of the runs not yet ended is refused
// (Config.Capacity).
func (m *Manager) Start(sg *typesv1.SignedGrant) (Run, bool, error) {
	g, err := m.verify(sg)
	if err != nil {
		return Run{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.runs[g.GetJobId()]; ok {
		return e.run, false, nil
	}
	if _, ok := m.unstarted[g.GetJobId()]; ok {
		return Run{}, false, fmt.Errorf("%w: job %s was cancelled before it started", errdefs.ErrFailedPrecondition, g.GetJobId())
	}
	class := sandbox.Class(classOf(g.GetRuntimeClass()))
	if st, ok := m.cfg.Sandbox.Available(class); !ok {
		return Run{}, false, fmt.Errorf("%w: runtime_class %s is not available on this executor: %s", errdefs.ErrFailedPrecondition, class, st.Reason)
	}
	if _, err := m.policyOf(g.GetNetworkPolicy()); err != nil {
		return Run{}, false, err
	}
	// The first policy is generation 1 (the authority's first grant says
	// so); without one, a later change could not be told from it. A
	// generation of 0 is taken as 1, as the authority does.
	if gen := g.GetNetworkPolicyGeneration(); gen < 1 {
		return Run{}, false, fmt.Errorf("%w: grant network_policy_generation %d: must be at least 1", errdefs.ErrInvalidArgument, gen)
	}
	if gen := g.GetGeneration(); gen < 0 {
		return Run{}, false, fmt.Errorf("%w: grant generation %d: must not be negative", errdefs.ErrInvalidArgument, gen)
	}
	if err := m.cfg.Capacity.admit(m.held(nil), limitsOf(g.GetLimits())); err != nil {
		return Run{}, false, err
	}
	raw, err := proto.Marshal(sg)
	if err != nil {
		return Run{}, false, err
	}
	if err := os.MkdirAll(m.runDir(g.GetJobId()), 0o700); err != nil {
		return Run{}, false, err
	}
	e := &entry{
		run:     Run{JobID: g.GetJobId(), State: Staging, SignedGrant: raw, CreatedAt: m.cfg.Now()},
		grant:   g,
		changed: make(chan struct{}),
	}
	notify := func() { m.mu.Lock(); e.notify(); m.mu.Unlock() }
	if e.stdout, err = newOutput(filepath.Join(m.runDir(e.run.JobID), "stdout.log"), m.cfg.OutputLimit, notify); err != nil {
		return Run{}, false, err
	}
	if e.stderr, err = newOutput(filepath.Join(m.runDir(e.run.JobID), "stderr.log"), m.cfg.OutputLimit, notify); err != nil {
		return Run{}, false, err
	}
	if err := m.persist(&e.run); err != nil {
		return Run{}, false, err
	}
	ctx, cancel := context.WithCancel(m.ctx)
	e.cancel = cancel
	m.runs[e.run.JobID] = e
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		m.execute(ctx, e)
	}()
	return e.run, true, nil
}

// verify checks sg's signature, format and expiry and returns its grant.
func (m *Manager) verify(sg *typesv1.SignedGrant) (*typesv1.Grant, error) {
	g, err := m.cfg.Verifier.Verify(sg, m.cfg.Now())
	if err != nil {
		// The verifier's errors begin "grant: ".
		switch {
		case errors.Is(err, grant.ErrExpired):
			return nil, fmt.Errorf("%w: %v", errdefs.ErrFailedPrecondition, err)
		default:
			return nil, fmt.Errorf("%w: %v", errdefs.ErrPermissionDenied, err)
		}
	}
	if !jobIDFormat.MatchString(g.GetJobId()) {
		return nil, fmt.Errorf("%w: grant job_id %q: want 1-64 of [A-Za-z0-9_-]", errdefs.ErrInvalidArgument, g.GetJobId())
	}
	return g, nil
}

func classOf(c typesv1.RuntimeClass) string {
	if c == typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC {
		return string(sandbox.ClassRunsc)
	}
	return string(sandbox.ClassRunc)
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

// execute runs one job from staging to report.
func (m *Manager) execute(ctx context.Context, e *entry) {
	// What identifies the job never changes; limits and network policy
	// are read from the grant in force when the sandbox is made.
	m.mu.Lock()
	g := e.grant
	m.mu.Unlock()
	log := m.cfg.Logger.With("job_id", g.GetJobId(), "tenant", g.GetTenant())
	// Closed on every path; the bundle reads the files by name, not these handles.
	defer e.stdout.close()
	defer e.stderr.close()
	fail := func(err error) {
		state, reason := Failed, sandbox.Reason("sandbox_error")
		if ctx.Err() != nil {
			state, reason = Cancelled, sandbox.Reason("cancelled")
		}
		log.Error("run failed", "error", err)
		m.finish(e, state, &Result{Reason: reason, ExitCode: -1, Message: err.Error()})
	}
	src, err := m.cfg.Sources.Get(ctx, stage.Key{Tenant: g.GetTenant(), Repository: g.GetRepository(), Commit: g.GetCommit()},
		func(ctx context.Context) (stage.Header, io.ReadCloser, error) {
			return m.cfg.Authority.FetchSource(ctx, g.GetJobId())
		})
	if err != nil {
		fail(fmt.Errorf("stage source: %w", err))
		return
	}
	sb, err := m.makeSandbox(ctx, e, src.Dir)
	if err != nil {
		fail(err)
		return
	}
	defer func() {
		e.updateMu.Lock()
		defer e.updateMu.Unlock()
		if err := sb.Destroy(); err != nil {
			log.Error("destroy sandbox", "error", err)
		}
		if e.egress != nil {
			e.egress.close()
		}
		if e.net != nil {
			m.closeNet(e.net)
		}
		e.sb, e.net, e.egress = nil, nil, nil
	}()
	m.update(e, func(r *Run) { r.State = Running; r.StartedAt = m.cfg.Now() })
	res, runErr := sb.Run(ctx)
	// The job is gone: its egress record is complete once the proxy and
	// DNS server have stopped, before the bundle takes it.
	e.updateMu.Lock()
	if e.egress != nil {
		e.egress.close()
	}
	e.updateMu.Unlock()
	m.mu.Lock()
	abort := e.abort
	m.mu.Unlock()
	if abort != "" {
		// Update stopped the job: say why, not that someone cancelled it.
		res.Reason, res.ExitCode, res.Message, runErr = sandbox.ReasonSandboxError, -1, abort, nil
	}
	if runErr != nil && res.Reason == "" {
		fail(fmt.Errorf("run: %w", runErr))
		return
	}
	if m.ctx.Err() != nil && abort == "" {
		// The executor is shutting down, not the caller cancelling: say so,
		// and leave the report to the next start's Recover.
		m.finish(e, Failed, &Result{Reason: ReasonExecutorRestarted, ExitCode: -1, Class: res.Class, Usage: res.Usage,
			RuntimeVersion: res.RuntimeVersion, TemplateVersion: res.TemplateVersion, Message: "the executor shut down while this job was running"})
		return
	}
	result := &Result{
		Reason: res.Reason, ExitCode: res.ExitCode, Usage: res.Usage, Class: res.Class,
		RuntimeVersion: res.RuntimeVersion, TemplateVersion: res.TemplateVersion, Message: res.Message,
	}
	// The patch and bundle are built even for a cancelled or timed-out run:
	// reviewers and operators may want to see what it did.
	patch, stat, err := src.Repo.DiffUpper(context.WithoutCancel(ctx), src.TreeHash, src.Index, sb.WorkDir(), sb.UpperDir())
	if err != nil {
		fail(fmt.Errorf("compute patch: %w", err))
		return
	}
	result.FilesChanged, result.Insertions, result.Deletions = stat.FilesChanged, stat.Insertions, stat.Deletions
	result.PatchSize = int64(len(patch))
	if len(stat.GitPaths) > 0 {
		note := fmt.Sprintf("left out of the patch: %d .git entries (%s)", len(stat.GitPaths), strings.Join(stat.GitPaths, ", "))
		result.Message = strings.TrimPrefix(result.Message+"; "+note, "; ")
	}
	if err := m.writeBundle(e, g, result, patch, stat.Files, sb.OutDir()); err != nil {
		fail(fmt.Errorf("bundle: %w", err))
		return
	}
	state := Finished
	switch {
	case res.Reason == sandbox.ReasonCancelled:
		state = Cancelled
	case res.Reason == sandbox.ReasonSandboxError:
		state = Failed
	}
	m.finish(e, state, result)
}

// makeSandbox makes the job's network namespace and sandbox from the grant
// in force, which no Update changes meanwhile.
func (m *Manager) makeSandbox(ctx context.Context, e *entry, source string) (*sandbox.Sandbox, error) {
	e.updateMu.Lock()
	defer e.updateMu.Unlock()
	m.mu.Lock()
	g := e.grant
	m.mu.Unlock()
	spec := sandbox.Spec{
		ID:      g.GetJobId(),
		Class:   sandbox.Class(classOf(g.GetRuntimeClass())),
		Source:  source,
		Command: g.GetCommand(),
		Env:     g.GetEnv(),
		Limits:  limitsOf(g.GetLimits()),
		Stdout:  e.stdout,
		Stderr:  e.stderr,
	}
	var (
		n  *netpolicy.Net
		eg *jobEgress
	)
	if m.cfg.Network != nil {
		p, err := policyFromProto(g.GetNetworkPolicy())
		if err == nil {
			opts := append(netOptions(spec.Class, p), netpolicy.Generation(g.GetNetworkPolicyGeneration()))
			n, err = m.cfg.Network.Create(ctx, g.GetJobId(), p.net, opts...)
		}
		if err == nil && p.domains() {
			// Fail closed: a domains job whose proxy or DNS server cannot
			// serve does not start.
			if eg, err = m.startEgress(g.GetJobId(), n, p.names); err != nil {
				m.closeNet(n)
				n = nil
			}
		}
		if err != nil {
			m.update(e, func(r *Run) { r.NetworkFailure = err.Error() })
			return nil, fmt.Errorf("network policy: %w", err)
		}
		m.update(e, func(r *Run) { r.NetworkUpdatedAt = m.cfg.Now() })
		spec.NetNS = n.Path()
		if eg != nil {
			env := maps.Clone(spec.Env)
			if env == nil {
				env = map[string]string{}
			}
			maps.Copy(env, eg.env())
			spec.Env = env
			spec.Nameservers = eg.addrs[:1]
		}
	}
	sb, err := m.cfg.Sandbox.Create(ctx, spec)
	if err != nil {
		if eg != nil {
			eg.close()
		}
		if n != nil {
			m.closeNet(n)
		}
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	e.sb, e.net, e.egress = sb, n, eg
	return sb, nil
}

// closeNet removes a job's network namespace. Should that fail, it keeps
// trying in the background until it works or the executor stops (the next
// start's netpolicy Recover then removes what is left): netpolicy releases
// the job's addresses only once everything of it is gone.
func (m *Manager) closeNet(n *netpolicy.Net) {
	err := n.Close()
	if err == nil {
		return
	}
	log := m.cfg.Logger.With("job_id", n.ID())
	log.Error("remove network namespace; retrying in the background", "error", err)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for delay := 200 * time.Millisecond; ; delay = min(delay*2, 30*time.Second) {
			select {
			case <-m.ctx.Done():
				log.Error("network namespace not removed before the executor stopped; the next start removes it", "error", err)
				return
			case <-time.After(delay):
			}
			if err = n.Close(); err == nil {
				log.Info("network namespace removed after a retry")
				return
			}
			log.Warn("remove network namespace", "error", err, "retry_in", min(delay*2, 30*time.Second))
		}
	}()
}

func limitsOf(l *typesv1.ResourceLimits) sandbox.Limits {
	return sandbox.Limits{
		CPUMillis: l.GetCpuMillis(), MemoryBytes: l.GetMemoryBytes(), Pids: l.GetPids(),
		DiskBytes: l.GetDiskBytes(), Deadline: l.GetDeadline().AsDuration(),
	}
}

// bundleMeta is result.json inside a bundle.
type bundleMeta struct {
	JobID           string   `json:"job_id"`
	Tenant          string   `json:"tenant"`
	Repository      string   `json:"repository"`
	Commit          string   `json:"commit"`
	GrantDigest     string   `json:"grant_digest"`
	Command         []string `json:"command"`
	Result          *Result  `json:"result"`
	StdoutTruncated bool     `json:"stdout_truncated"`
	StderrTruncated bool     `json:"stderr_truncated"`
	SkippedOut      []string `json:"skipped_out,omitempty"`
}

func (m *Manager) writeBundle(e *entry, g *typesv1.Grant, result *Result, patch []byte, files []bundle.FileChange, outDir string) error {
	// The grant in force at the end: the one the run's last limits and
	// network policy came from.
	m.mu.Lock()
	run := e.run
	m.mu.Unlock()
	sg, err := run.Grant()
	if err != nil {
		return err
	}
	_, outCut := e.stdout.state()
	_, errCut := e.stderr.state()
	dir := m.runDir(e.run.JobID)
	meta := bundleMeta{
		JobID: g.GetJobId(), Tenant: g.GetTenant(), Repository: g.GetRepository(), Commit: g.GetCommit(),
		GrantDigest: grant.Digest(sg), Command: g.GetCommand(), Result: result,
		StdoutTruncated: outCut, StderrTruncated: errCut,
	}
	// The whole signed grant (body, signature, key id), so whoever holds
	// the bundle can check the authority signed what it says.
	signedGrant, err := proto.MarshalOptions{Deterministic: true}.Marshal(sg)
	if err != nil {
		return err
	}
	in := bundle.Input{
		Meta: &meta, Grant: signedGrant, Files: files, Patch: patch,
		StdoutPath: filepath.Join(dir, "stdout.log"), StderrPath: filepath.Join(dir, "stderr.log"),
		OutDir: outDir,
	}
	if _, err := os.Stat(filepath.Join(dir, bundle.EgressFile)); err == nil {
		in.EgressPath = filepath.Join(dir, bundle.EgressFile)
	}
	res, err := bundle.Write(filepath.Join(dir, "bundle.tar"), in)
	if err != nil {
		return err
	}
	result.BundleDigest, result.BundleSize = res.Digest, res.Size
	env, err := m.cfg.Sign("bundle.tar", res.Digest, provenance.Run{
		JobID: g.GetJobId(), Tenant: g.GetTenant(), Requester: g.GetRequester(), Repository: g.GetRepository(),
		BaseCommit: g.GetCommit(), GrantDigest: grant.Digest(sg), Executor: m.cfg.Executor,
		RuntimeClass: string(result.Class), RuntimeVersion: result.RuntimeVersion, TemplateVersion: result.TemplateVersion,
		Reason: string(result.Reason), ExitCode: result.ExitCode, StartedOn: run.StartedAt, FinishedOn: m.cfg.Now(),
	})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, "provenance.json"), env, 0o600, atomicfile.Durable); err != nil {
		return err
	}
	review := patch
	if int64(len(review)) > m.cfg.ReviewPatchLimit {
		review = review[:m.cfg.ReviewPatchLimit]
	}
	// Derived from the bundle, which is synced: no need to sync it again.
	return atomicfile.Write(filepath.Join(dir, "review.patch"), review, 0o600, atomicfile.Fast)
}

// finish records the end of a run and reports it.
func (m *Manager) finish(e *entry, state State, result *Result) {
	m.update(e, func(r *Run) {
		r.State = state
		r.FinishedAt = m.cfg.Now()
		r.Result = result
		for name, o := range map[string]*output{"stdout": e.stdout, "stderr": e.stderr} {
			if o == nil {
				continue
			}
			if _, cut := o.state(); cut {
				if r.Truncated == nil {
					r.Truncated = map[string]bool{}
				}
				r.Truncated[name] = true
			}
		}
	})
	m.report(e.run.JobID)
}

// reportLater reports a run in the background. Callers hold m.mu.
func (m *Manager) reportLater(jobID string) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.report(jobID)
	}()
}

// report tells the authority how a run ended, retrying until it is
// recorded or the executor stops.
func (m *Manager) report(jobID string) {
	m.mu.Lock()
	e := m.runs[jobID]
	run := e.run
	m.mu.Unlock()
	dir := m.runDir(jobID)
	rep := Report{JobID: jobID, Result: *run.Result}
	rep.Patch, _ = os.ReadFile(filepath.Join(dir, "review.patch"))
	rep.Provenance, _ = os.ReadFile(filepath.Join(dir, "provenance.json"))
	if run.Result.BundleDigest != "" {
		// The bundle is the record: the list comes from it, so a report
		// sent again after a restart says exactly what the first said. A
		// bundle without one (written before it existed) is reported with
		// no list, and the review says how many files it cannot show.
		files, err := bundleFiles(filepath.Join(dir, "bundle.tar"))
		if err != nil {
			m.cfg.Logger.Warn("the bundle has no readable file list", "job_id", jobID, "error", err)
		}
		rep.Files = files
	}
	rep.Egress, rep.EgressLast, rep.EgressTotal, rep.EgressNames, rep.HasEgress = egressOf(filepath.Join(dir, bundle.EgressFile), m.cfg.Logger.With("job_id", jobID))
	rep.Stdout = tailOf(filepath.Join(dir, "stdout.log"), run.Truncated["stdout"])
	rep.Stderr = tailOf(filepath.Join(dir, "stderr.log"), run.Truncated["stderr"])
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, 10*time.Second) {
		ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
		err := m.cfg.Authority.ReportResult(ctx, rep)
		cancel()
		if err == nil {
			m.update(e, func(r *Run) { r.Reported = true })
			return
		}
		m.cfg.Logger.Warn("report result", "job_id", jobID, "error", err, "retry_in", delay)
		if errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrNotFound) {
			return // the authority will never take it; retrying changes nothing
		}
		select {
		case <-m.ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// tailOf returns the last reviewTail bytes of an output file.
func tailOf(path string, capped bool) Tail {
	t := Tail{Capped: capped}
	f, err := os.Open(path)
	if err != nil {
		return t
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return t
	}
	t.Size = st.Size()
	off := max(0, t.Size-reviewTail)
	t.Data = make([]byte, t.Size-off)
	n, _ := f.ReadAt(t.Data, off)
	t.Data = t.Data[:n]
	return t
}

// bundleFiles reads a bundle's file list. A bundle written before the list
// existed has none: its patch's files are then unknown, which is an error.
func bundleFiles(path string) ([]bundle.FileChange, error) {
	data, err := bundle.ReadEntry(path, bundle.FilesFile)
	if err != nil {
		return nil, err
	}
	return bundle.ParseFiles(data)
}

// Get returns the run of jobID.
func (m *Manager) Get(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		return Run{}, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	return e.run, nil
}

// List returns every run, newest first.
func (m *Manager) List() []Run {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Run, 0, len(m.runs))
	for _, e := range m.runs {
		out = append(out, e.run)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out
}

// Cancel stops a run. Cancelling an ended run changes nothing.
func (m *Manager) Cancel(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		m.forgetUnstarted()
		m.unstarted[jobID] = m.cfg.Now()
		return Run{}, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if !e.run.State.Terminal() && e.cancel != nil {
		e.cancel()
	}
	return e.run, nil
}

// unstartedKeep is how long a cancel of a job with no run here refuses its
// StartJob, and unstartedMax how many such jobs are remembered: the race
// it closes lasts one StartJob attempt, so both are generous.
const (
	unstartedKeep = time.Hour
	unstartedMax  = 1 << 16
)

// forgetUnstarted drops the cancels older than unstartedKeep and, past
// unstartedMax, the oldest. Called with m.mu held.
func (m *Manager) forgetUnstarted() {
	now := m.cfg.Now()
	var oldest string
	for id, at := range m.unstarted {
		if now.Sub(at) > unstartedKeep {
			delete(m.unstarted, id)
		} else if oldest == "" || at.Before(m.unstarted[oldest]) {
			oldest = id
		}
	}
	if len(m.unstarted) >= unstartedMax {
		delete(m.unstarted, oldest)
	}
}

// Artifact is a finished run's bundle.
type Artifact struct {
	Path       string
	Digest     string
	Size       int64
	Provenance []byte
}

// Artifact returns the bundle of jobID if its digest is digest.
func (m *Manager) Artifact(jobID, digest string) (*Artifact, error) {
	run, err := m.Get(jobID)
	if err != nil {
		return nil, err
	}
	if run.Result == nil || run.Result.BundleDigest == "" {
		return nil, fmt.Errorf("%w: run %s has no bundle (state %s)", errdefs.ErrFailedPrecondition, jobID, run.State)
	}
	if digest != run.Result.BundleDigest {
		return nil, fmt.Errorf("%w: bundle_digest %s does not match run %s's bundle", errdefs.ErrFailedPrecondition, digest, jobID)
	}
	dir := m.runDir(jobID)
	// Recompute: a bundle altered on disk must never be served under its
	// recorded name.
	got, size, err := bundle.Digest(filepath.Join(dir, "bundle.tar"))
	if err != nil {
		return nil, err
	}
	if got != digest {
		m.cfg.Logger.Error("a bundle on disk does not have its recorded digest", "job_id", jobID, "digest", got, "recorded", digest)
		return nil, fmt.Errorf("%w: the bundle of run %s on the executor's disk is not the one it recorded (%s): it was altered", errdefs.ErrDataLoss, jobID, digest)
	}
	prov, err := os.ReadFile(filepath.Join(dir, "provenance.json"))
	if err != nil {
		return nil, err
	}
	return &Artifact{Path: filepath.Join(dir, "bundle.tar"), Digest: got, Size: size, Provenance: prov}, nil
}

// Event is one message of a watch: a run state, or output.
type Event struct {
	Run    *Run
	Stream string // "stdout" or "stderr"
	Offset int64
	Data   []byte
	Cut    bool // the stream was truncated at its cap after this chunk
}

// Watch sends the run's current state, then output from the given offsets
// and every change of state or grant, until the run has ended and its
// output is drained, or ctx ends.
func (m *Manager) Watch(ctx context.Context, jobID string, stdoutOffset, stderrOffset int64, send func(Event) error) error {
	m.mu.Lock()
	e, ok := m.runs[jobID]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if stdoutOffset < 0 || stderrOffset < 0 {
		return fmt.Errorf("%w: offsets must not be negative", errdefs.ErrInvalidArgument)
	}
	offsets := map[string]int64{"stdout": stdoutOffset, "stderr": stderrOffset}
	cutSent := map[string]bool{}
	var lastState State
	var lastGrant []byte
	for {
		m.mu.Lock()
		run, changed := e.run, e.changed
		m.mu.Unlock()
		// A new grant (Update) is news too: its limits and network
		// policy are now in force.
		if run.State != lastState || !bytes.Equal(run.SignedGrant, lastGrant) {
			if err := send(Event{Run: &run}); err != nil {
				return err
			}
			lastState, lastGrant = run.State, run.SignedGrant
		}
		for _, stream := range []string{"stdout", "stderr"} {
			if err := m.sendOutput(e, &run, stream, offsets, cutSent, send); err != nil {
				return err
			}
		}
		if run.State.Terminal() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

const chunkSize = 64 << 10

// sendOutput sends what stream holds past its offset, then, once the
// stream was cut at its cap and everything before the cut was sent, one
// empty event that says so.
func (m *Manager) sendOutput(e *entry, run *Run, stream string, offsets map[string]int64, cutSent map[string]bool, send func(Event) error) error {
	path := filepath.Join(m.runDir(e.run.JobID), stream+".log")
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, chunkSize)
	for {
		n, err := f.ReadAt(buf, offsets[stream])
		if n > 0 {
			if err := send(Event{Stream: stream, Offset: offsets[stream], Data: append([]byte(nil), buf[:n]...)}); err != nil {
				return err
			}
			offsets[stream] += int64(n)
		}
		if errors.Is(err, io.EOF) || n == 0 {
			break
		}
		if err != nil {
			return err
		}
	}
	// The flag is read after the bytes: a cut that happens while we read
	// is caught on the next wake-up, never lost.
	cut := run.Truncated[stream]
	if o := map[string]*output{"stdout": e.stdout, "stderr": e.stderr}[stream]; o != nil {
		size, c := o.state()
		cut = cut || (c && offsets[stream] >= size)
	}
	if cut && !cutSent[stream] {
		cutSent[stream] = true
		return send(Event{Stream: stream, Offset: offsets[stream], Cut: true})
	}
	return nil
}
