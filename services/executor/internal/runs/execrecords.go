package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
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

// persistExec writes x's record before its command runs, so no restart of
// the executor's process runs it again, and again when it ends. The
// writes are not synced, so they survive the process, not the host. That
// is enough: a host that went down took a running session's sandbox and
// mounted scratch with it, so Recover ends the session and nothing can
// run in it again; a session whose files are kept (the executor stopped
// or was killed under it) has its records synced when they are kept
// (syncRecords); and the authority records every exec's start and end
// itself. (Syncing cost two fsyncs per exec.)
//
// The first record is written in place, as the file is new: a process
// that dies while writing it leaves a record loadExecs skips, for an exec
// whose command never started, so a retry runs it. Later records replace
// it atomically: the old record or the new, never a mix.
func (m *Manager) persistExec(x *Exec, first bool) error {
	data, err := json.MarshalIndent(x, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(m.execDir(x.SessionID, x.Seq), "exec.json")
	if first {
		return os.WriteFile(path, data, 0o600)
	}
	return atomicfile.Write(path, data, 0o600, atomicfile.Fast)
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

// ListExecs returns a session's execs, first to last, and its client's
// uploads among them, in order.
func (m *Manager) ListExecs(jobID string) ([]Exec, []FileWrite, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[jobID]
	if !ok {
		return nil, nil, fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	return e.execRecords(), slices.Clone(e.writes), nil
}

// execRecords are e's exec records in order. Callers hold m.mu.
func (e *entry) execRecords() []Exec {
	out := make([]Exec, len(e.execOrder))
	for i, xe := range e.execOrder {
		out[i] = xe.rec
	}
	return out
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
		// A later exec never takes the directory of one whose record
		// could not be read.
		if seq, err := strconv.ParseInt(d.Name(), 10, 64); err == nil {
			e.lastSeq = max(e.lastSeq, seq)
		}
		data, err := os.ReadFile(filepath.Join(m.runDir(e.run.JobID), "execs", d.Name(), "exec.json"))
		if err != nil {
			continue // made, never recorded: it never ran
		}
		var r Exec
		if err := json.Unmarshal(data, &r); err != nil {
			// Only a host crash leaves a record unreadable (persistExec),
			// and it ended the session: the authority's record stands.
			m.cfg.Logger.Warn("an exec record left unreadable by a crash; skipped", "job_id", e.run.JobID, "exec", d.Name(), "error", err)
			continue
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
