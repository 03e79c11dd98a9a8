package runs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
)

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
	// holds, EgressNames all of them summed by name, EgressCredentials
	// its request lines summed by brokered credential. HasEgress is false,
	// and the rest zero, for other jobs.
	Egress, EgressLast []egress.Record
	EgressTotal        int
	EgressNames        []egress.NameSummary
	EgressCredentials  []egress.CredentialSummary
	HasEgress          bool
	// Execs are a session's execs, first to last, and FileWrites its
	// client's uploads; nil for a job.
	Execs      []Exec
	FileWrites []FileWrite
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

// finish records the end of a run and reports it.
func (m *Manager) finish(e *entry, state State, result *Result) {
	result.Message = m.callerText(e, result.Message)
	m.mu.Lock()
	result.Message = e.cancelText(result.Reason, result.Message)
	m.mu.Unlock()
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
		// Counted with the change, so whoever sees the run ended sees it
		// counted.
		m.metrics.runEnded(*r)
	})
	m.report(e.run.JobID)
}

// callerText rewrites text for the caller of run e so it names no host
// path: the sandbox's directories as the job sees them, the executor's own
// as "<executor>" (sandbox.JobText).
func (m *Manager) callerText(e *entry, text string) string {
	if e.sb != nil {
		text = e.sb.JobText(text)
	}
	return strings.ReplaceAll(text, m.cfg.Dir, "<executor>/runs")
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
	rep.Egress, rep.EgressLast, rep.EgressTotal, rep.EgressNames, rep.EgressCredentials, rep.HasEgress = egressOf(filepath.Join(dir, bundle.EgressFile), m.cfg.Logger.With("job_id", jobID))
	rep.Stdout = tailOf(filepath.Join(dir, "stdout.log"), run.Truncated["stdout"])
	rep.Stderr = tailOf(filepath.Join(dir, "stderr.log"), run.Truncated["stderr"])
	m.mu.Lock()
	rep.Execs, rep.FileWrites = e.execRecords(), slices.Clone(e.writes)
	m.mu.Unlock()
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, 10*time.Second) {
		// In the run's trace (its StartJob's), when it has one.
		ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(m.ctx, e.trace), 30*time.Second)
		ctx, span := tracer.Start(ctx, "runs.report")
		err := m.cfg.Authority.ReportResult(ctx, rep)
		span.End()
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
	t.Data, t.Size = readTail(path, reviewTail)
	return t
}

// readTail returns the last n bytes of the file at path and its size;
// nothing for a file it cannot read.
func readTail(path string, n int64) ([]byte, int64) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0
	}
	size := st.Size()
	off := max(0, size-n)
	data := make([]byte, size-off)
	k, _ := f.ReadAt(data, off)
	return data[:k], size
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
