package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// FileWrite records an upload into a session, or several uploads of one
// path folded into one record.
type FileWrite struct {
	Path string `json:"path"`
	// Size, SHA256 and At are the (last) upload's.
	Size   int64     `json:"size"`
	SHA256 string    `json:"sha256"`
	At     time.Time `json:"at"`
	// AfterExec is how many execs had started when it was (last) written.
	AfterExec int64 `json:"after_exec"`
	// Count, when more than 1, is how many uploads of Path the record
	// stands for, and FirstAfterExec how many execs had started at the
	// first of them. Uploads of one path with no exec started between them
	// are always folded; uploads with execs between them only once a
	// session has more than MaxWriteRecords records (FoldWrites).
	Count          int64 `json:"count,omitempty"`
	FirstAfterExec int64 `json:"first_after_exec,omitempty"`
}

// Uploads is how many uploads w stands for.
func (w *FileWrite) Uploads() int64 { return max(w.Count, 1) }

// fold makes w stand for itself and then the uploads of v, a later
// record of the same path.
func (w *FileWrite) fold(v FileWrite) {
	first := w.AfterExec
	if w.Count > 1 {
		first = w.FirstAfterExec
	}
	count := w.Uploads() + v.Uploads()
	*w = v
	w.Count, w.FirstAfterExec = count, first
}

// FoldWrites bounds a sequence of upload records to at most max without
// losing an upload: when there are more, each path's records become one,
// placed where its last upload was (what it holds from there on), counting
// them all and saying when the first was. When there are still more paths
// than max, the records of the first quarter and of the last paths are
// kept, and the second value is how many uploads the ones left out stand
// for. ws is not changed.
func FoldWrites(ws []FileWrite, max int) ([]FileWrite, int64) {
	if len(ws) <= max {
		return ws, 0
	}
	type folded struct {
		w    FileWrite
		last int
	}
	byPath := map[string]*folded{}
	for i, w := range ws {
		if f := byPath[w.Path]; f != nil {
			f.w.fold(w)
			f.last = i
			continue
		}
		byPath[w.Path] = &folded{w: w, last: i}
	}
	all := make([]*folded, 0, len(byPath))
	for _, f := range byPath {
		all = append(all, f)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].last < all[j].last })
	out := make([]FileWrite, 0, min(len(all), max))
	var cut int64
	head := max / 4
	for i, f := range all {
		if i < head || i >= len(all)-(max-head) {
			out = append(out, f.w)
		} else {
			cut += f.w.Uploads()
		}
	}
	return out, cut
}

// Files API bounds: one upload, one read chunk and one listing; and the
// paths one session may upload to (each keeps a record to the end).
const (
	MaxUploadBytes  = 1 << 30
	MaxWriteRecords = 10000
	fileChunk       = 256 << 10
	MaxListEntries  = 10000
	defaultFileMode = 0o644
)

// sessionFiles runs f with the sandbox of the running session jobID and a
// context that ends when the session stops taking calls: the session's end
// waits for f to return, and f must return soon once ctx ends. A call in
// flight counts as activity for the idle timeout. An asleep session is
// woken first, and waited for (Wake) within ctx.
func (m *Manager) sessionFiles(ctx context.Context, jobID string, f func(ctx context.Context, sb *sandbox.Sandbox) error) error {
	_, err := waking(ctx, m, jobID, func() (struct{}, error) { return struct{}{}, m.sessionFilesOnce(jobID, f) })
	return err
}

// sessionFilesOnce is sessionFiles but for the waking: errAsleep when the
// session is asleep.
func (m *Manager) sessionFilesOnce(jobID string, f func(ctx context.Context, sb *sandbox.Sandbox) error) error {
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
	if e.wakeable() {
		m.mu.Unlock()
		return errAsleep
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
func (m *Manager) ReadFile(ctx context.Context, jobID, path string, header func(size int64) error, chunk func([]byte) error) error {
	chunks := make(chan []byte, 4)
	read := make(chan error, 1)
	opened := make(chan int64, 1)
	go func() {
		read <- m.sessionFiles(ctx, jobID, func(ctx context.Context, sb *sandbox.Sandbox) error {
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
	if testHookReadFileSelect != nil {
		testHookReadFileSelect()
	}
	var size int64
	select {
	case size = <-opened:
	case err := <-read:
		select {
		case size = <-opened:
			// A small file is opened and read whole before this select
			// may run: both are ready, and select picks either. Its
			// bytes are in chunks; they are sent.
			read <- err
		default:
			return err
		}
	}
	if err := header(size); err != nil {
		return err
	}
	for c := range chunks {
		if err := chunk(c); err != nil {
			return err
		}
	}
	return <-read
}

// testHookReadFileSelect, set by a test, runs in ReadFile before it waits
// for the file's opening: to let a small file be read whole first.
var testHookReadFileSelect func()

// WriteFile replaces a file of a running session's /work or /out with r's
// bytes, atomically; mode 0 is 0644.
func (m *Manager) WriteFile(ctx context.Context, jobID, path string, mode fs.FileMode, r io.Reader) (int64, error) {
	if mode == 0 {
		mode = defaultFileMode
	}
	var n int64
	h := sha256.New()
	err := m.sessionFiles(ctx, jobID, func(ctx context.Context, sb *sandbox.Sandbox) error {
		if err := m.reserveWritePath(jobID, path); err != nil {
			return err
		}
		var err error
		n, err = sb.WriteFile(path, io.TeeReader(&ctxReader{ctx: ctx, r: r}, h), mode, MaxUploadBytes)
		return err
	})
	if err == nil {
		// The record the review keeps of what the client put in, and when:
		// after which exec.
		m.mu.Lock()
		if e := m.runs[jobID]; e != nil {
			e.recordWrite(FileWrite{Path: path, Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), At: m.cfg.Now(), AfterExec: int64(len(e.execOrder))})
		}
		m.mu.Unlock()
	}
	return n, err
}

// reserveWritePath counts path among the paths session jobID has
// uploaded to, or refuses it when it would be one more than
// MaxWriteRecords: so the session's upload records, one per path at
// most, always fit and none is ever dropped.
func (m *Manager) reserveWritePath(jobID, path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.runs[jobID]
	if e == nil {
		return fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	}
	if _, ok := e.writePaths[path]; ok {
		return nil
	}
	if len(e.writePaths) >= MaxWriteRecords {
		return fmt.Errorf("%w: path %q: session %s has uploaded to %d paths, its most: upload to one of them, or finish the session and start another",
			errdefs.ErrResourceExhausted, path, jobID, MaxWriteRecords)
	}
	if e.writePaths == nil {
		e.writePaths = map[string]struct{}{}
	}
	e.writePaths[path] = struct{}{}
	return nil
}

// recordWrite adds an upload to e's records: folded into the last one
// when it is the same path with no exec started between, and every
// path's folded into one once there are more than MaxWriteRecords (which
// reserveWritePath keeps the paths within). Callers hold m.mu.
func (e *entry) recordWrite(w FileWrite) {
	if n := len(e.writes); n > 0 && e.writes[n-1].Path == w.Path && e.writes[n-1].AfterExec == w.AfterExec {
		e.writes[n-1].fold(w)
		return
	}
	e.writes, _ = FoldWrites(append(e.writes, w), MaxWriteRecords)
}

// ListFiles lists a directory of a running session's /work or /out.
func (m *Manager) ListFiles(ctx context.Context, jobID, path string, recursive bool) ([]sandbox.FileInfo, bool, error) {
	var (
		list []sandbox.FileInfo
		cut  bool
	)
	err := m.sessionFiles(ctx, jobID, func(_ context.Context, sb *sandbox.Sandbox) error {
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
