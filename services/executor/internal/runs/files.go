package runs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Files API bounds: one upload, one read chunk and one listing.
const (
	MaxUploadBytes  = 1 << 30
	fileChunk       = 256 << 10
	MaxListEntries  = 10000
	defaultFileMode = 0o644
)

// sessionFiles runs f with the sandbox of the running session jobID, which
// is not torn down until f returns. Every use counts as activity.
func (m *Manager) sessionFiles(jobID string, f func(sb *sandbox.Sandbox) error) error {
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
	sb := e.live
	if sb == nil || e.stopping != "" {
		state := e.sessionState()
		m.mu.Unlock()
		return fmt.Errorf("%w: session %s is %s: its files can be read and written only while it runs", errdefs.ErrFailedPrecondition, jobID, state)
	}
	e.lastActive = m.cfg.Now()
	m.mu.Unlock()
	e.filesMu.RLock()
	defer e.filesMu.RUnlock()
	defer func() { m.mu.Lock(); e.lastActive = m.cfg.Now(); m.mu.Unlock() }()
	return f(sb)
}

// ReadFile sends a regular file of a running session's /work or /out: its
// size first, then its bytes in chunks.
func (m *Manager) ReadFile(jobID, path string, header func(size int64) error, chunk func([]byte) error) error {
	return m.sessionFiles(jobID, func(sb *sandbox.Sandbox) error {
		f, size, err := sb.OpenFile(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := header(size); err != nil {
			return err
		}
		buf := make([]byte, fileChunk)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				if err := chunk(buf[:n]); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
		}
	})
}

// WriteFile replaces a file of a running session's /work or /out with r's
// bytes, atomically; mode 0 is 0644.
func (m *Manager) WriteFile(jobID, path string, mode fs.FileMode, r io.Reader) (int64, error) {
	if mode == 0 {
		mode = defaultFileMode
	}
	var n int64
	err := m.sessionFiles(jobID, func(sb *sandbox.Sandbox) error {
		var err error
		n, err = sb.WriteFile(path, r, mode, MaxUploadBytes)
		return err
	})
	return n, err
}

// ListFiles lists a directory of a running session's /work or /out.
func (m *Manager) ListFiles(jobID, path string, recursive bool) ([]sandbox.FileInfo, bool, error) {
	var (
		list []sandbox.FileInfo
		cut  bool
	)
	err := m.sessionFiles(jobID, func(sb *sandbox.Sandbox) error {
		var err error
		list, cut, err = sb.ListFiles(path, recursive, MaxListEntries)
		return err
	})
	return list, cut, err
}
