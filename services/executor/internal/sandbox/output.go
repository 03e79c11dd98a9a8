package sandbox

import (
	"io"
	"os"
	"sync"
	"time"
)

// outputPipes carry a runtime's (and so the job's or the exec's) stdout
// and stderr to writers.
type outputPipes struct {
	outR, outW, errR, errW *os.File
	copies                 sync.WaitGroup
}

func newOutputPipes() (*outputPipes, error) {
	p := &outputPipes{}
	var err error
	if p.outR, p.outW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if p.errR, p.errW, err = os.Pipe(); err != nil {
		p.outR.Close()
		p.outW.Close()
		return nil, err
	}
	return p, nil
}

// started closes our copies of the write ends, once the runtime holds its
// own (or failed to start: then ok is false and the read ends close too).
func (p *outputPipes) started(ok bool) {
	p.outW.Close()
	p.errW.Close()
	if !ok {
		p.outR.Close()
		p.errR.Close()
	}
}

// copy copies each stream to its writer (nil discards) in the background.
// A failing writer must not stall the job on a full pipe: the rest is
// read and dropped.
func (p *outputPipes) copy(stdout, stderr io.Writer) {
	for _, c := range []struct {
		r *os.File
		w io.Writer
	}{{p.outR, stdout}, {p.errR, stderr}} {
		w := c.w
		if w == nil {
			w = io.Discard
		}
		p.copies.Add(1)
		go func(r *os.File) {
			defer p.copies.Done()
			if _, err := io.Copy(w, r); err != nil {
				_, _ = io.Copy(io.Discard, r)
			}
		}(c.r)
	}
}

// drain waits up to grace for every writer to close its end, then closes
// ours and waits for the copies. It reports whether the streams ended by
// themselves; a process still holding a write end (one outside the
// cgroup, or one an exec left running) gets nothing more collected.
func (p *outputPipes) drain(grace time.Duration) bool {
	drained := make(chan struct{})
	go func() { p.copies.Wait(); close(drained) }()
	ended := true
	select {
	case <-drained:
	case <-time.After(grace):
		ended = false
	}
	p.outR.Close()
	p.errR.Close()
	p.copies.Wait()
	return ended
}
