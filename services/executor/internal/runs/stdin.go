package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// MaxExecStdinStream bounds a streamed stdin: what an exec was given is
// summed into its record, and a client that sends more has its exec
// cancelled rather than run on input cut short.
const MaxExecStdinStream = 64 << 20

var errExecEnded = errors.New("the exec has ended")

// stdinPipe carries an exec's streamed stdin from the one call that feeds
// it to the sandbox, which copies it into the command's pipe. io.Pipe
// hands each chunk over only as the command reads, so nothing queues here
// beyond the chunk in hand: a command that reads slowly slows its client.
type stdinPipe struct {
	r *io.PipeReader
	w *io.PipeWriter

	mu     sync.Mutex // serializes Write, Close and Abort; guards below
	size   int64
	hash   hash.Hash
	closed bool   // by the client (end of file) or by the exec's end
	ended  bool   // the exec ended: what it was given is final
	cut    string // why the exec was cancelled over its stdin
}

func newStdinPipe() *stdinPipe {
	r, w := io.Pipe()
	return &stdinPipe{r: r, w: w, hash: sha256.New()}
}

// finish is called once the exec has ended: a write still blocked is
// released, later ones are dropped, and what the exec was given is summed
// (size, SHA-256 and, when it was cancelled over its stdin, why).
func (p *stdinPipe) finish() (int64, string, string) {
	p.r.CloseWithError(errExecEnded)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended, p.closed = true, true
	return p.size, hex.EncodeToString(p.hash.Sum(nil)), p.cut
}

// ExecStdin is the streamed stdin of one exec, held by the RunExec call
// that started it and by nothing else.
type ExecStdin struct {
	m  *Manager
	xe *execEntry
}

// Write gives p to the command, blocking until the sandbox has taken it
// (the command reads, or its pipe has room). Stdin past
// MaxExecStdinStream is refused and the exec cancelled; stdin after the
// exec has ended is dropped, as a pipe's reader that exited drops it;
// stdin after Close is refused.
func (s *ExecStdin) Write(b []byte) error {
	p := s.xe.stdin
	p.mu.Lock()
	defer p.mu.Unlock()
	id := s.xe.rec.Spec.ID // set once, before the exec was shared
	switch {
	case p.ended:
		return nil
	case p.closed:
		return fmt.Errorf("%w: exec %q: its stdin was closed; no more stdin is taken", errdefs.ErrFailedPrecondition, id)
	case p.size+int64(len(b)) > MaxExecStdinStream:
		p.cut = fmt.Sprintf("its streamed stdin passed %d bytes, the most an exec takes", MaxExecStdinStream)
		s.xe.cancel()
		return fmt.Errorf("%w: exec %q: stdin: more than %d bytes, the most a streamed stdin may carry; the exec is cancelled",
			errdefs.ErrResourceExhausted, id, MaxExecStdinStream)
	}
	n, err := p.w.Write(b)
	p.hash.Write(b[:n])
	p.size += int64(n)
	if err != nil && !errors.Is(err, errExecEnded) {
		return err
	}
	return nil
}

// Close ends the command's stdin (it reads end of file) and records its
// size and SHA-256, so the exec's record says what it was given. Closing
// again, or after the exec ended, changes nothing.
func (s *ExecStdin) Close() {
	p := s.xe.stdin
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.w.Close()
	size, sum := p.size, hex.EncodeToString(p.hash.Sum(nil))
	s.m.mu.Lock()
	s.xe.rec.StdinSize, s.xe.rec.StdinSHA256 = size, sum
	s.m.mu.Unlock()
}

// Abort is for a call that broke off with stdin still open: the exec is
// cancelled, its stdin left open until it has ended, so the command cannot
// take the cut input for the whole and end as if it had all of it.
func (s *ExecStdin) Abort(why string) {
	p := s.xe.stdin
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cut != "" {
		return
	}
	p.cut = why
	s.xe.cancel()
}

// RunExec is StartExec for a caller that stays attached: an exec it starts
// with a streamed stdin (spec.StdinStream) comes with that stdin, which
// nothing else can feed. Any other exec, and one it attaches to, comes
// with nil.
func (m *Manager) RunExec(ctx context.Context, jobID string, x ExecSpec) (Exec, bool, *ExecStdin, error) {
	rec, created, xe, err := m.startWaking(ctx, jobID, x, true)
	if err != nil || !created || xe.stdin == nil {
		return rec, created, nil, err
	}
	return rec, created, &ExecStdin{m: m, xe: xe}, nil
}
