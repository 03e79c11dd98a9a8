package runs

import (
	"os"
	"sync"
)

// output captures one stream of a job to a file, up to a cap. Past the cap
// the rest is dropped and the stream is marked truncated; the job never
// blocks on its output.
type output struct {
	mu        sync.Mutex
	f         *os.File
	path      string // the file a lazy output makes at its first byte
	closed    bool
	size      int64
	limit     int64
	truncated bool
	notify    func()
}

func newOutput(path string, limit int64, notify func()) (*output, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	return &output{f: f, limit: limit, notify: notify}, nil
}

// lazyOutput is an output whose file is made at its first byte: an
// exec's, which mostly write nothing to one stream or both, and whose
// readers take a missing file for an empty stream (sendStream,
// streamSummary). Making two files costs an exec about half a
// millisecond.
func lazyOutput(path string, limit int64, notify func()) *output {
	return &output{path: path, limit: limit, notify: notify}
}

// Write never fails towards the job: a full cap or a write error drops bytes.
func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	n := len(p)
	if room := o.limit - o.size; room < int64(len(p)) {
		if room < 0 {
			room = 0
		}
		p = p[:room]
		o.truncated = true
	}
	if len(p) > 0 && o.f == nil && o.path != "" && !o.closed {
		// A file that cannot be made drops the stream's bytes from here
		// on, and the stream reads cut.
		var err error
		if o.f, err = os.OpenFile(o.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err != nil {
			o.closed, o.truncated = true, true
		}
	}
	if len(p) > 0 && o.f != nil {
		w, _ := o.f.Write(p)
		o.size += int64(w)
	}
	o.mu.Unlock()
	o.notify()
	return n, nil
}

// state returns the bytes written so far and whether the stream was cut.
func (o *output) state() (int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.size, o.truncated
}

// close closes the file; later writes are dropped. It may be called more
// than once.
func (o *output) close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	if o.f == nil {
		return nil
	}
	err := o.f.Close()
	o.f = nil
	return err
}
