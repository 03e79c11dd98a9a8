package runs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/execspec"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Session reasons: how a session ends when its client did not cancel it
// and its deadline did not pass.
const (
	ReasonFinished    sandbox.Reason = "finished"
	ReasonIdleTimeout sandbox.Reason = "idle_timeout"
)

// Session defaults, where the grant leaves them zero, and bounds on what
// one exec may carry.
const (
	DefaultIdleTimeout        = 15 * time.Minute
	DefaultMaxConcurrentExecs = 4
	MaxExecStdin              = 1 << 20
	// MaxExecs bounds the execs one session may run in all, and
	// ExecOutputLimit each stream of one, and SessionOutputBudget what
	// they may keep in all: their records and output are kept on the
	// executor's disk, outside the session's disk limit, to the end.
	MaxExecs            = 2000
	ExecOutputLimit     = 1 << 20
	SessionOutputBudget = 256 << 20
	// maxExecArgs and maxExecArgBytes bound an exec's argv and env: each
	// record carries them to the end, and into review.
	maxExecArgs     = 4096
	maxExecArgBytes = 128 << 10
)

// execTail is how much of the end of each stream an exec's record in the
// bundle and the review carries.
const execTail = 2 << 10

// ExecSpec is one command a client runs in a session.
type ExecSpec struct {
	ID      string            `json:"exec_id"`
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Stdin   []byte            `json:"-"`
	Timeout time.Duration     `json:"timeout,omitempty"`
	// StdinStream: stdin comes from the RunExec call that starts the
	// exec (stdin.go), not from Stdin.
	StdinStream bool `json:"stdin_stream,omitempty"`
}

// ExecState is where an exec is.
type ExecState string

// Exec states.
const (
	ExecRunning ExecState = "running"
	ExecEnded   ExecState = "ended"
)

// Exec is the durable record of one exec.
type Exec struct {
	SessionID   string         `json:"session_id"`
	Spec        ExecSpec       `json:"spec"`
	StdinSize   int64          `json:"stdin_size"`
	StdinSHA256 string         `json:"stdin_sha256"`
	Seq         int64          `json:"seq"`
	State       ExecState      `json:"state"`
	Reason      sandbox.Reason `json:"reason,omitempty"`
	ExitCode    int            `json:"exit_code"`
	Message     string         `json:"message,omitempty"`
	StartedAt   time.Time      `json:"started_at"`
	EndedAt     time.Time      `json:"ended_at,omitzero"`
	WallTime    time.Duration  `json:"wall_time,omitempty"`
	CPUTime     time.Duration  `json:"cpu_time,omitempty"`
	// Output: bytes kept, whether each stream hit its cap, the SHA-256 of
	// the bytes kept, and their ends, once ended.
	StdoutSize      int64  `json:"stdout_size"`
	StderrSize      int64  `json:"stderr_size"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	StdoutSHA256    string `json:"stdout_sha256,omitempty"`
	StderrSHA256    string `json:"stderr_sha256,omitempty"`
	StdoutTail      []byte `json:"stdout_tail,omitempty"`
	StderrTail      []byte `json:"stderr_tail,omitempty"`
}

// execEntry is an exec in memory.
type execEntry struct {
	rec            Exec
	stdout, stderr *output
	cancel         context.CancelFunc
	done           chan struct{} // closed once the record says ended
	stdin          *stdinPipe    // a streamed stdin, nil otherwise
}

// sessionOf is e's session spec, nil for a job. Callers hold m.mu.
func (e *entry) session() (idle time.Duration, maxExecs int, ok bool) {
	s := e.run.Grant.Session
	if s == nil {
		return 0, 0, false
	}
	idle, maxExecs = s.IdleTimeout, s.MaxConcurrentExecs
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	if maxExecs <= 0 {
		maxExecs = DefaultMaxConcurrentExecs
	}
	return idle, maxExecs, true
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errdefs.ErrInvalidArgument}, args...)...)
}

// checkExecSpec checks everything about x that needs no session.
func checkExecSpec(x *ExecSpec) error {
	if !runspec.ValidExecID(x.ID) {
		return invalidf("spec.exec_id %q: want 1 to 128 of [A-Za-z0-9._:-]", x.ID)
	}
	if err := sandbox.CheckCommand("spec.argv", "spec.env", x.Argv, x.Env); err != nil {
		return err
	}
	size := 0
	for _, a := range x.Argv {
		size += len(a)
	}
	for k, v := range x.Env {
		size += len(k) + len(v)
	}
	if len(x.Argv) > maxExecArgs || size > maxExecArgBytes {
		return invalidf("spec.argv and spec.env: %d arguments and %d bytes in all, at most %d and %d", len(x.Argv), size, maxExecArgs, maxExecArgBytes)
	}
	if x.Cwd != "" {
		c := path.Clean(x.Cwd)
		if c != x.Cwd || (c != "/work" && !strings.HasPrefix(c, "/work/")) {
			return invalidf("spec.cwd %q: must be /work or a clean path under it", x.Cwd)
		}
	}
	if len(x.Stdin) > MaxExecStdin {
		return invalidf("spec.stdin: %d bytes, at most %d", len(x.Stdin), MaxExecStdin)
	}
	if x.StdinStream && len(x.Stdin) > 0 {
		return invalidf("spec.stdin: %d bytes with spec.stdin_stream set: stdin comes one way or the other", len(x.Stdin))
	}
	if x.Timeout < 0 {
		return invalidf("spec.timeout %s: must not be negative", x.Timeout)
	}
	return nil
}

// differs names the first field ("spec.argv", ...) in which a retried
// spec differs from the recorded one, "" if none (pkg/execspec's rule,
// the authority's too).
func (r *Exec) differs(x *ExecSpec) string {
	recorded, _ := execspec.Spec{Argv: r.Spec.Argv, Env: r.Spec.Env, Cwd: r.Spec.Cwd, Timeout: r.Spec.Timeout,
		StdinStream: r.Spec.StdinStream, StdinSize: r.StdinSize, StdinSHA256: r.StdinSHA256}.Digests()
	return execspec.Differs(recorded, execspec.Spec{Argv: x.Argv, Env: x.Env, Cwd: x.Cwd, Timeout: x.Timeout,
		StdinStream: x.StdinStream, StdinSize: int64(len(x.Stdin)), StdinSHA256: sha256Hex(x.Stdin)})
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func (m *Manager) execDir(jobID string, seq int64) string {
	return filepath.Join(m.runDir(jobID), "execs", strconv.FormatInt(seq, 10))
}

// persistExec writes x's record durably: a started exec is on disk before
// its command runs, so no restart can run it again.
func (m *Manager) persistExec(x *Exec) error {
	data, err := json.MarshalIndent(x, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(m.execDir(x.SessionID, x.Seq), "exec.json"), data, 0o600, atomicfile.Durable)
}

// StartExec starts x in the running session jobID, or returns the exec of
// that id when it was started with the same spec (created false), running
// or ended. The same id with another spec is ErrAlreadyExists naming the
// field. Concurrent calls with one id start it once.
func (m *Manager) StartExec(jobID string, x ExecSpec) (Exec, bool, error) {
	rec, created, _, err := m.startExec(jobID, x, false)
	return rec, created, err
}

// startExec is StartExec; a caller that can feed a streamed stdin (fed)
// may start an exec that takes one, and gets its entry to feed it.
func (m *Manager) startExec(jobID string, x ExecSpec, fed bool) (Exec, bool, *execEntry, error) {
	if err := checkExecSpec(&x); err != nil {
		return Exec{}, false, nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		return Exec{}, false, nil, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); !ok {
		return Exec{}, false, nil, fmt.Errorf("%w: run %s is a job, not a session: it takes no execs", errdefs.ErrFailedPrecondition, jobID)
	}
	if xe, ok := e.execs[x.ID]; ok {
		if f := xe.rec.differs(&x); f != "" {
			return Exec{}, false, nil, fmt.Errorf("%w: spec.exec_id %q: an exec of this id was started with a different %s", errdefs.ErrAlreadyExists, x.ID, f)
		}
		return xe.rec, false, xe, nil
	}
	_, maxExecs, _ := e.session()
	switch {
	case x.StdinStream && !fed:
		return Exec{}, false, nil, fmt.Errorf("%w: spec.stdin_stream: StartExec has no stream to feed stdin from; start the exec with RunExec", errdefs.ErrFailedPrecondition)
	case e.run.State != Running || e.live == nil || e.stopping != "" || e.suspending:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s is %s: it takes no new exec", errdefs.ErrFailedPrecondition, jobID, e.sessionState())
	case e.runningExecs >= maxExecs:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s runs %d execs, its most at once", errdefs.ErrResourceExhausted, jobID, maxExecs)
	case len(e.execs) >= MaxExecs:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s has run %d execs, its most", errdefs.ErrResourceExhausted, jobID, MaxExecs)
	case e.execOutput >= SessionOutputBudget:
		return Exec{}, false, nil, fmt.Errorf("%w: session %s's execs have written %d bytes of output, its most (%d): finish it and start another",
			errdefs.ErrResourceExhausted, jobID, e.execOutput, SessionOutputBudget)
	}
	if x.Cwd != "" {
		// Resolved as the files API resolves paths: a directory the job
		// sees, not one a symlink leads out to.
		if err := e.live.CheckDir("spec.cwd", x.Cwd); err != nil {
			return Exec{}, false, nil, err
		}
	}
	rec := Exec{
		SessionID: jobID, Spec: x, StdinSize: int64(len(x.Stdin)), StdinSHA256: sha256Hex(x.Stdin),
		Seq: int64(len(e.execs)) + 1, State: ExecRunning, ExitCode: -1, StartedAt: m.cfg.Now(),
	}
	rec.Spec.Stdin = nil
	if x.StdinStream {
		rec.StdinSHA256 = "" // known once stdin closes
	}
	dir := m.execDir(jobID, rec.Seq)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Exec{}, false, nil, err
	}
	xe := &execEntry{rec: rec, done: make(chan struct{})}
	if x.StdinStream {
		xe.stdin = newStdinPipe()
	}
	notify := func() { m.mu.Lock(); e.notify(); m.mu.Unlock() }
	var err error
	limit := min(m.cfg.OutputLimit, ExecOutputLimit)
	if xe.stdout, err = newOutput(filepath.Join(dir, "stdout.log"), limit, notify); err != nil {
		return Exec{}, false, nil, err
	}
	if xe.stderr, err = newOutput(filepath.Join(dir, "stderr.log"), limit, notify); err != nil {
		xe.stdout.close()
		return Exec{}, false, nil, err
	}
	if err := m.persistExec(&xe.rec); err != nil {
		xe.stdout.close()
		xe.stderr.close()
		return Exec{}, false, nil, err
	}
	if e.execs == nil {
		e.execs = map[string]*execEntry{}
	}
	e.execs[x.ID] = xe
	m.metrics.execStarted()
	e.execOrder = append(e.execOrder, xe)
	e.runningExecs++
	e.lastActive = m.cfg.Now()
	ctx, cancel := context.WithCancel(context.WithoutCancel(m.ctx))
	xe.cancel = cancel
	sb := e.live
	e.execWG.Add(1)
	go func() {
		defer e.execWG.Done()
		defer cancel()
		m.runExec(ctx, e, xe, sb, x)
	}()
	e.notify()
	return xe.rec, true, xe, nil
}

// runExec runs one exec to its end and records how it ended.
func (m *Manager) runExec(ctx context.Context, e *entry, xe *execEntry, sb *sandbox.Sandbox, x ExecSpec) {
	spec := sandbox.ExecSpec{Argv: x.Argv, Env: x.Env, Cwd: x.Cwd, Timeout: x.Timeout, Stdout: xe.stdout, Stderr: xe.stderr}
	if len(x.Stdin) > 0 {
		spec.Stdin = bytes.NewReader(x.Stdin)
	}
	if xe.stdin != nil {
		spec.Stdin = xe.stdin.r
	}
	res, err := sb.Exec(ctx, spec)
	var stdinSize int64
	var stdinSum, stdinCut string
	if xe.stdin != nil {
		stdinSize, stdinSum, stdinCut = xe.stdin.finish()
	}
	switch {
	case m.ctx.Err() != nil:
		// The executor stopped, and the sandbox with it.
		res.Reason, res.ExitCode, res.Message = ReasonExecutorRestarted, -1, "the executor stopped while the exec ran"
	case errors.Is(err, context.Canceled):
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonCancelled, -1, "the exec was cancelled before it started"
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		// The sandbox stopped (suspended, finished, cancelled) before the
		// command could start.
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonCancelled, -1, "the session's sandbox stopped before the exec started"
	case err != nil:
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonSandboxError, -1, err.Error()
		m.cfg.Logger.Error("exec failed", "job_id", e.run.JobID, "exec_id", x.ID, "error", err)
	}
	xe.stdout.close()
	xe.stderr.close()
	m.endExec(e, xe, func(r *Exec) {
		r.Reason, r.ExitCode, r.Message = res.Reason, res.ExitCode, res.Message
		r.WallTime, r.CPUTime = res.WallTime, res.CPUTime
		if xe.stdin != nil {
			r.StdinSize, r.StdinSHA256 = stdinSize, stdinSum
		}
		if stdinCut != "" {
			r.Message = stdinCut + "; " + r.Message
		}
	})
}

// endExec records xe ended, with its output's sizes, digests and tails.
func (m *Manager) endExec(e *entry, xe *execEntry, f func(*Exec)) {
	dir := m.execDir(e.run.JobID, xe.rec.Seq)
	out := streamSummary(filepath.Join(dir, "stdout.log"))
	errs := streamSummary(filepath.Join(dir, "stderr.log"))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endExecLocked(e, xe, out, errs, f)
	e.runningExecs--
}

// endExecLocked is endExec's record keeping. Callers hold m.mu.
func (m *Manager) endExecLocked(e *entry, xe *execEntry, out, errs summary, f func(*Exec)) {
	r := &xe.rec
	f(r)
	r.State, r.EndedAt = ExecEnded, m.cfg.Now()
	r.StdoutSize, r.StdoutSHA256, r.StdoutTail = out.size, out.sha, out.tail
	r.StderrSize, r.StderrSHA256, r.StderrTail = errs.size, errs.sha, errs.tail
	if xe.stdout != nil {
		_, r.StdoutTruncated = xe.stdout.state()
		_, r.StderrTruncated = xe.stderr.state()
	}
	if err := m.persistExec(r); err != nil {
		m.cfg.Logger.Error("persist exec", "job_id", e.run.JobID, "exec_id", r.Spec.ID, "error", err)
	}
	e.lastActive = m.cfg.Now()
	e.execOutput += r.StdoutSize + r.StderrSize
	close(xe.done)
	e.notify()
}

type summary struct {
	size int64
	sha  string
	tail []byte
}

// streamSummary reads an output file's size, SHA-256 and last execTail bytes.
func streamSummary(p string) summary {
	s := summary{sha: sha256Hex(nil)}
	f, err := os.Open(p)
	if err != nil {
		return s
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err == nil {
		s.sha = hex.EncodeToString(h.Sum(nil))
	}
	s.tail, s.size = readTail(p, execTail)
	return s
}

// sessionState says, for a refusal, where a session is. Callers hold m.mu.
func (e *entry) sessionState() string {
	switch {
	case e.stopping != "" && !e.run.State.Terminal():
		return "ending (" + string(e.stopping) + ")"
	case e.run.Suspended:
		return "suspended (resume it first)"
	case e.suspending:
		return "being suspended"
	case e.run.State == Running && e.live == nil:
		return "starting"
	}
	return string(e.run.State)
}

// runSession runs a session's sandbox until the session ends, and after
// each suspension (Suspend) restarts it, once resumed, on the same /work
// and /out. It says how the session ended as sb.Run says how a job did.
func (m *Manager) runSession(ctx context.Context, e *entry, sb *sandbox.Sandbox) (sandbox.Result, error) {
	m.mu.Lock()
	// A session kept across the executor's restart starts suspended.
	suspended := e.run.Suspended
	m.mu.Unlock()
	res := sb.BaseResult()
	for {
		if !suspended {
			var (
				runErr error
				again  bool
			)
			if res, again, runErr = m.runSessionOnce(ctx, e, sb); !again {
				return res, runErr
			}
		}
		suspended = false
		res, ended := m.waitSuspended(ctx, e, sb, res)
		// One step, under the lock: no Suspend or Resume sees a session
		// half resumed.
		m.update(e, func(r *Run) {
			r.Suspended, r.SuspendedAt, r.SuspendReason = false, time.Time{}, ""
			e.suspending, e.resumeAsked, e.lastActive = false, false, m.cfg.Now()
		})
		if ended {
			return m.sessionEnded(e, res), nil
		}
		m.cfg.Logger.Info("session resumed", "job_id", e.run.JobID)
	}
}

// runSessionOnce runs a session's sandbox until it stops. Suspended (again
// true), it is ready to run again and recorded suspended; otherwise the
// session has ended, as the result says.
func (m *Manager) runSessionOnce(ctx context.Context, e *entry, sb *sandbox.Sandbox) (res sandbox.Result, again bool, err error) {
	runCtx, stopRun := context.WithCancel(ctx)
	filesCtx, stopFiles := context.WithCancel(ctx)
	m.mu.Lock()
	e.stopRun, e.live = stopRun, sb
	e.filesCtx, e.filesCancel = filesCtx, stopFiles
	e.notify()
	m.mu.Unlock()
	res, runErr := sb.Run(runCtx)
	stopRun()
	// The sandbox stopped, so every exec in it ends, and no files call
	// may touch it once the calls in flight (told to stop) return:
	// what the patch and the records take is final.
	m.mu.Lock()
	e.live = nil
	suspend := e.suspending && e.stopping == "" && ctx.Err() == nil && runErr == nil && res.Reason == sandbox.ReasonCancelled
	m.mu.Unlock()
	stopFiles()
	e.filesMu.Lock()
	e.filesMu.Unlock() //nolint:staticcheck // waits for the calls in flight
	e.execWG.Wait()
	if !suspend {
		return m.sessionEnded(e, res), false, runErr
	}
	if err := sb.Restart(); err != nil {
		m.cfg.Logger.Error("suspend a session", "job_id", e.run.JobID, "error", err)
		res.Reason, res.ExitCode, res.Message = sandbox.ReasonSandboxError, -1, "the sandbox could not be suspended: "+err.Error()
		return m.sessionEnded(e, res), false, nil
	}
	m.update(e, func(r *Run) { r.Suspended, r.SuspendedAt, r.SuspendReason = true, m.cfg.Now(), "" })
	m.cfg.Logger.Info("session suspended", "job_id", e.run.JobID)
	return res, true, nil
}

// waitSuspended waits for a suspended session to be resumed (ended false),
// or to end: finished, cancelled, or past its deadline, which counts on.
func (m *Manager) waitSuspended(ctx context.Context, e *entry, sb *sandbox.Sandbox, res sandbox.Result) (sandbox.Result, bool) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		m.mu.Lock()
		asked := e.resumeAsked
		m.mu.Unlock()
		if asked {
			return res, false
		}
		select {
		case <-ctx.Done():
			res.Reason, res.ExitCode, res.Message = sandbox.ReasonCancelled, -1, "the session was cancelled while suspended"
			return res, true
		case <-tick.C:
			m.mu.Lock()
			started := e.run.StartedAt
			m.mu.Unlock()
			if lim := sb.Limits(); m.cfg.Now().Sub(started) >= lim.Deadline {
				res.Reason, res.ExitCode = sandbox.ReasonTimeout, -1
				res.Message = fmt.Sprintf("the deadline of %s passed while the session was suspended", lim.Deadline)
				return res, true
			}
		}
	}
}

// sessionEnded records why a session ended and words its result: one the
// client finished, or that sat idle, was stopped, not cancelled.
func (m *Manager) sessionEnded(e *entry, res sandbox.Result) sandbox.Result {
	m.mu.Lock()
	if e.stopping == "" && m.ctx.Err() == nil {
		// Not when the executor stops: a session it stops under is kept
		// (execute), not ended.
		e.stopping = res.Reason
	}
	stopping := e.stopping
	e.suspending = false
	m.mu.Unlock()
	if res.Reason == sandbox.ReasonCancelled && (stopping == ReasonFinished || stopping == ReasonIdleTimeout) {
		res.Reason, res.ExitCode = stopping, -1
		res.Message = map[sandbox.Reason]string{
			ReasonFinished:    "the client finished the session",
			ReasonIdleTimeout: "no exec ran for longer than the session's idle timeout",
		}[stopping]
	}
	return res
}

// Suspend stops a running session's sandbox: every exec in it ends
// cancelled, every process is gone; its /work changes and /out are kept for
// Resume, and /tmp and $HOME are emptied. Suspending a suspended session
// changes nothing.
func (m *Manager) Suspend(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, err := m.runningSession(jobID)
	if err != nil {
		return Run{}, err
	}
	if e.suspending || e.run.Suspended {
		return e.run, nil
	}
	if e.live == nil || e.stopping != "" {
		return Run{}, fmt.Errorf("%w: session %s is %s: only a running session can be suspended", errdefs.ErrFailedPrecondition, jobID, e.sessionState())
	}
	e.suspending, e.resumeAsked = true, false
	e.stopRun()
	e.notify()
	return e.run, nil
}

// Resume starts a suspended session's sandbox again: a fresh sandbox on
// the same base with the session's /work changes and /out. A suspended
// session holds no memory or CPU of the executor's capacity; one that no
// longer fits beside the runs admitted meanwhile stays suspended
// (ErrResourceExhausted).
func (m *Manager) Resume(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, err := m.runningSession(jobID)
	if err != nil {
		return Run{}, err
	}
	switch {
	case e.run.Suspended && !e.resumeAsked:
		// Its memory and CPU were given back while it was suspended.
		if err := m.cfg.Capacity.admit(m.held(e), e.run.Grant.Limits); err != nil {
			return Run{}, fmt.Errorf("session %s stays suspended: %w", jobID, err)
		}
		e.resumeAsked = true
	case e.suspending:
		return Run{}, fmt.Errorf("%w: session %s is still being suspended; resume it once it is", errdefs.ErrFailedPrecondition, jobID)
	}
	return e.run, nil
}

// runningSession is the session jobID while it has not ended. Callers hold
// m.mu.
func (m *Manager) runningSession(jobID string) (*entry, error) {
	e, ok := m.runs[jobID]
	if !ok {
		return nil, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); !ok {
		return nil, fmt.Errorf("%w: run %s is a job, not a session", errdefs.ErrFailedPrecondition, jobID)
	}
	if e.run.State != Running {
		return nil, fmt.Errorf("%w: session %s is %s", errdefs.ErrFailedPrecondition, jobID, e.run.State)
	}
	return e, nil
}

// lookupExec returns the exec of id in session jobID. Callers hold m.mu.
func (m *Manager) lookupExec(jobID, execID string) (*entry, *execEntry, error) {
	e, ok := m.runs[jobID]
	if !ok {
		return nil, nil, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	xe, ok := e.execs[execID]
	if !ok {
		return nil, nil, fmt.Errorf("%w: session %s has no exec %q", errdefs.ErrNotFound, jobID, execID)
	}
	return e, xe, nil
}

// GetExec returns one exec.
func (m *Manager) GetExec(jobID, execID string) (Exec, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, xe, err := m.lookupExec(jobID, execID)
	if err != nil {
		return Exec{}, err
	}
	return xe.rec, nil
}

// ListExecs returns a session's execs, first to last.
func (m *Manager) ListExecs(jobID string) ([]Exec, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		return nil, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	return e.execRecords(), nil
}

// execRecords are e's exec records in order. Callers hold m.mu.
func (e *entry) execRecords() []Exec {
	out := make([]Exec, len(e.execOrder))
	for i, xe := range e.execOrder {
		out[i] = xe.rec
	}
	return out
}

// CancelExec stops a running exec: SIGTERM to its process group, SIGKILL
// after the grace period. An ended exec is returned as it is.
func (m *Manager) CancelExec(jobID, execID string) (Exec, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, xe, err := m.lookupExec(jobID, execID)
	if err != nil {
		return Exec{}, err
	}
	if xe.rec.State == ExecRunning && xe.cancel != nil {
		xe.cancel()
	}
	return xe.rec, nil
}

// ExecEvent is one message of an exec watch: output, or the ended exec.
type ExecEvent struct {
	Exec   *Exec
	Stream string
	Offset int64
	Data   []byte
	Cut    bool
}

// WatchExec sends an exec's output from the given offsets as it comes,
// and once it has ended and all of its output was sent, its record.
func (m *Manager) WatchExec(ctx context.Context, jobID, execID string, stdoutOffset, stderrOffset int64, send func(ExecEvent) error) error {
	if stdoutOffset < 0 || stderrOffset < 0 {
		return invalidf("offsets must not be negative")
	}
	m.mu.Lock()
	e, xe, err := m.lookupExec(jobID, execID)
	m.mu.Unlock()
	if err != nil {
		return err
	}
	dir := m.execDir(jobID, xe.rec.Seq)
	offsets := map[string]int64{"stdout": stdoutOffset, "stderr": stderrOffset}
	cutSent := map[string]bool{}
	for {
		m.mu.Lock()
		rec, changed := xe.rec, e.changed
		m.mu.Unlock()
		for _, s := range []struct {
			name string
			o    *output
			cut  bool
		}{{"stdout", xe.stdout, rec.StdoutTruncated}, {"stderr", xe.stderr, rec.StderrTruncated}} {
			err := sendStream(filepath.Join(dir, s.name+".log"), s.name, s.o, s.cut, offsets, cutSent, func(ev Event) error {
				return send(ExecEvent{Stream: ev.Stream, Offset: ev.Offset, Data: ev.Data, Cut: ev.Cut})
			})
			if err != nil {
				return err
			}
		}
		if rec.State == ExecEnded {
			return send(ExecEvent{Exec: &rec})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Finish ends a running session: its sandbox stops, its running execs
// end cancelled, and its bundle is built and reported with reason
// finished. Finishing an ended session changes nothing; a job is refused.
func (m *Manager) Finish(jobID string) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		return Run{}, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); !ok {
		return Run{}, fmt.Errorf("%w: run %s is a job, not a session: it ends when its command does", errdefs.ErrFailedPrecondition, jobID)
	}
	m.stopSession(e, ReasonFinished)
	return e.run, nil
}

// stopSession stops e's sandbox for reason, once. Callers hold m.mu.
func (m *Manager) stopSession(e *entry, reason sandbox.Reason) {
	if e.run.State.Terminal() || e.stopping != "" {
		return
	}
	e.stopping = reason
	if e.cancel != nil {
		e.cancel()
	}
	e.notify()
}

// watchIdle ends session e once it has had no exec running for longer than
// its idle timeout, until ctx ends.
func (m *Manager) watchIdle(ctx context.Context, e *entry) {
	m.mu.Lock()
	idle, _, _ := e.session()
	e.lastActive = m.cfg.Now()
	if e.idleChanged == nil {
		e.idleChanged = make(chan struct{})
	}
	changed := e.idleChanged
	m.mu.Unlock()
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
			// An Update may have changed the idle timeout: it counts
			// from the last activity as the new one from now on.
		}
		m.mu.Lock()
		idle, _, _ = e.session()
		changed = e.idleChanged
		if e.run.Suspended || e.suspending || e.filesActive > 0 {
			// Suspended is not idle (the deadline alone bounds it), nor
			// is a session whose files are being read or written.
			e.lastActive = m.cfg.Now()
		}
		left := idle - m.cfg.Now().Sub(e.lastActive)
		if e.runningExecs == 0 && left <= 0 {
			m.cfg.Logger.Info("session idle; ending it", "job_id", e.run.JobID, "idle_timeout", idle)
			m.stopSession(e, ReasonIdleTimeout)
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		if left <= 0 {
			left = idle
		}
		t.Reset(left)
	}
}

// loadExecs reads a session's exec records from disk (New). An exec that
// was running when the executor stopped is ended executor_restarted.
func (m *Manager) loadExecs(e *entry) error {
	dirs, err := os.ReadDir(filepath.Join(m.runDir(e.run.JobID), "execs"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var recs []*execEntry
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(m.runDir(e.run.JobID), "execs", d.Name(), "exec.json"))
		if err != nil {
			continue // made, never recorded: it never ran
		}
		var r Exec
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("runs: %s exec %s: %w", e.run.JobID, d.Name(), err)
		}
		xe := &execEntry{rec: r, done: make(chan struct{})}
		if r.State == ExecEnded {
			close(xe.done)
		}
		recs = append(recs, xe)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].rec.Seq < recs[j].rec.Seq })
	e.execs = map[string]*execEntry{}
	for _, xe := range recs {
		e.execOutput += xe.rec.StdoutSize + xe.rec.StderrSize
		e.execs[xe.rec.Spec.ID] = xe
		e.execOrder = append(e.execOrder, xe)
	}
	return nil
}

// endLeftExecs ends, after a restart, every exec still recorded running.
// Callers hold m.mu.
func (m *Manager) endLeftExecs(e *entry) {
	for _, xe := range e.execOrder {
		if xe.rec.State != ExecRunning {
			continue
		}
		dir := m.execDir(e.run.JobID, xe.rec.Seq)
		m.endExecLocked(e, xe, streamSummary(filepath.Join(dir, "stdout.log")), streamSummary(filepath.Join(dir, "stderr.log")), func(r *Exec) {
			r.Reason, r.ExitCode, r.Message = ReasonExecutorRestarted, -1, "the executor restarted while the exec ran"
		})
	}
}
