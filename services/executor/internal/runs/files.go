package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// FileWrite records one upload into a session.
type FileWrite struct {
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	SHA256 string    `json:"sha256"`
	At     time.Time `json:"at"`
	// AfterExec is how many execs had started when it was written.
	AfterExec int64 `json:"after_exec"`
}

// Files API bounds: one upload, one read chunk and one listing.
const (
	MaxUploadBytes  = 1 << 30
	fileChunk       = 256 << 10
	MaxListEntries  = 10000
	defaultFileMode = 0o644
)

// sessionFiles runs f with the sandbox of the running session jobID and a
// context that ends when the session stops taking calls: the session's end
// waits for f to return, and f must return soon once ctx ends. A call in
// flight counts as activity for the idle timeout.
func (m *Manager) sessionFiles(jobID string, f func(ctx context.Context, sb *sandbox.Sandbox) error) error {
	m.mu.Lock()
	e, ok := m.runs[jobID]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, _, ok := e.session(); !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: run %s is a job, not a session: its files are in its bundle", errdefs.ErrFailedPrecondition, jobID)
	}
	sb, ctx := e.live, e.filesCtx
	if sb == nil || e.stopping != "" || e.suspending {
		state := e.sessionState()
		m.mu.Unlock()
		return fmt.Errorf("%w: session %s is %s: its files can be read and written only while it runs", errdefs.ErrFailedPrecondition, jobID, state)
	}
	e.filesActive++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		e.filesActive--
		e.lastActive = m.cfg.Now()
		m.mu.Unlock()
	}()
	e.filesMu.RLock()
	defer e.filesMu.RUnlock()
	// The session may have stopped between the check and the lock; its end
	// then waits for no one, so this call must not go on.
	m.mu.Lock()
	still := e.live == sb && ctx.Err() == nil
	m.mu.Unlock()
	if !still {
		return fmt.Errorf("%w: session %s stopped taking calls", errdefs.ErrFailedPrecondition, jobID)
	}
	return f(ctx, sb)
}

// ReadFile sends a regular file of a running session's /work or /out: its
// size first, then its bytes in chunks. A slow receiver does not hold the
// session's end: the file is read beside the sending, and the reading
// stops when the session does.
//
// A file whose apparent size is over the session's disk limit (sparse, or
// hole-punched) is refused before anything is sent, and no more than the
// size sent first is ever read: a file that grows meanwhile (an exec can
// run beside the read) is refused once that size is reached.
func (m *Manager) ReadFile(jobID, path string, header func(size int64) error, chunk func([]byte) error) error {
	chunks := make(chan []byte, 4)
	read := make(chan error, 1)
	opened := make(chan int64, 1)
	go func() {
		read <- m.sessionFiles(jobID, func(ctx context.Context, sb *sandbox.Sandbox) error {
			defer close(chunks)
			f, size, err := sb.OpenFile(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if limit := sb.Limits().DiskBytes; size > limit {
				return fmt.Errorf("%w: path %q: its apparent size of %d bytes is over the session's disk limit of %d bytes (a sparse or hole-punched file counts at its full size); it is not sent",
					errdefs.ErrResourceExhausted, path, size, limit)
			}
			opened <- size
			r := io.LimitReader(f, size)
			for {
				buf := make([]byte, fileChunk)
				n, err := r.Read(buf)
				if n > 0 {
					select {
					case chunks <- buf[:n]:
					case <-ctx.Done():
						return fmt.Errorf("%w: the session stopped while its file was read", errdefs.ErrFailedPrecondition)
					}
				}
				if errors.Is(err, io.EOF) {
					if n, _ := f.Read(make([]byte, 1)); n > 0 {
						return fmt.Errorf("%w: path %q: the file grew past its %d bytes while it was read", errdefs.ErrFailedPrecondition, path, size)
					}
					return nil
				}
				if err != nil {
					return err
				}
			}
		})
	}()
	select {
	case size := <-opened:
		if err := header(size); err != nil {
			return err
		}
	case err := <-read:
		return err
	}
	for c := range chunks {
		if err := chunk(c); err != nil {
			return err
		}
	}
	return <-read
}

// WriteFile replaces a file of a running session's /work or /out with r's
// bytes, atomically; mode 0 is 0644.
func (m *Manager) WriteFile(jobID, path string, mode fs.FileMode, r io.Reader) (int64, error) {
	if mode == 0 {
		mode = defaultFileMode
	}
	var n int64
	h := sha256.New()
	err := m.sessionFiles(jobID, func(ctx context.Context, sb *sandbox.Sandbox) error {
		var err error
		n, err = sb.WriteFile(path, io.TeeReader(&ctxReader{ctx: ctx, r: r}, h), mode, MaxUploadBytes)
		return err
	})
	if err == nil {
		// The record the review keeps of what the client put in, and when:
		// after which exec.
		m.mu.Lock()
		if e := m.runs[jobID]; e != nil && len(e.writes) < MaxExecs {
			e.writes = append(e.writes, FileWrite{Path: path, Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), At: m.cfg.Now(), AfterExec: int64(len(e.execOrder))})
		}
		m.mu.Unlock()
	}
	return n, err
}

// ListFiles lists a directory of a running session's /work or /out.
func (m *Manager) ListFiles(jobID, path string, recursive bool) ([]sandbox.FileInfo, bool, error) {
	var (
		list []sandbox.FileInfo
		cut  bool
	)
	err := m.sessionFiles(jobID, func(_ context.Context, sb *sandbox.Sandbox) error {
		var err error
		list, cut, err = sb.ListFiles(path, recursive, MaxListEntries)
		return err
	})
	return list, cut, err
}

// ctxReader reads r until ctx ends: each Read runs beside the caller, who
// stops waiting for it when ctx does (the read itself ends when r's own
// source does, as a gRPC stream does once its handler returns).
type ctxReader struct {
	ctx  context.Context
	r    io.Reader
	next chan readResult
}

type readResult struct {
	b   []byte
	err error
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if c.next == nil {
		c.next = make(chan readResult, 1)
	}
	go func() {
		buf := make([]byte, len(p))
		n, err := c.r.Read(buf)
		c.next <- readResult{buf[:n], err}
	}()
	select {
	case res := <-c.next:
		return copy(p, res.b), res.err
	case <-c.ctx.Done():
		return 0, fmt.Errorf("%w: the session stopped during the upload", errdefs.ErrFailedPrecondition)
	}
}
