package runs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
)

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

// Event is one message of a watch: a run state, output, or a decision of
// the egress record.
type Event struct {
	Run    *Run
	Stream string // "stdout" or "stderr"
	Offset int64
	Data   []byte
	Cut    bool // the stream was truncated at its cap after this chunk
	// Egress is the record's decision at EgressIndex (from 0).
	Egress      *egress.Record
	EgressIndex int64
}

// WatchFrom is where a watch starts: each output stream's byte offset
// (past its end: none of it), and, when Egress is set, the egress record's
// index.
type WatchFrom struct {
	Stdout, Stderr int64
	Egress         bool
	EgressIndex    int64
}

// Watch sends the run's current state, then output from the given offsets
// (and the egress record, when from asks for it) and every change of
// state or grant, until the run has ended and its output is drained, or
// ctx ends.
func (m *Manager) Watch(ctx context.Context, jobID string, from WatchFrom, send func(Event) error) error {
	stdoutOffset, stderrOffset := from.Stdout, from.Stderr
	m.mu.Lock()
	e, ok := m.runs[jobID]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if stdoutOffset < 0 || stderrOffset < 0 || from.EgressIndex < 0 {
		return fmt.Errorf("%w: offsets must not be negative", errdefs.ErrInvalidArgument)
	}
	var records *egressTail
	if from.Egress {
		records = &egressTail{path: filepath.Join(m.runDir(jobID), bundle.EgressFile), from: from.EgressIndex}
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
		for _, s := range []struct {
			name string
			o    *output
		}{{"stdout", e.stdout}, {"stderr", e.stderr}} {
			path := filepath.Join(m.runDir(e.run.JobID), s.name+".log")
			if err := sendStream(path, s.name, s.o, run.Truncated[s.name], offsets, cutSent, send); err != nil {
				return err
			}
		}
		if records != nil {
			if err := records.send(send); err != nil {
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

// sendStream sends what the stream's file at path holds past its offset,
// then, once the stream was cut at its cap (as recorded, or as o, while it
// is written, says) and everything before the cut was sent, one empty
// event that says so.
func sendStream(path, stream string, o *output, recordedCut bool, offsets map[string]int64, cutSent map[string]bool, send func(Event) error) error {
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
	cut := recordedCut
	if o != nil {
		size, c := o.state()
		cut = cut || (c && offsets[stream] >= size)
	}
	if cut && !cutSent[stream] {
		cutSent[stream] = true
		return send(Event{Stream: stream, Offset: offsets[stream], Cut: true})
	}
	return nil
}
