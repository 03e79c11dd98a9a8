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
	if o.f == nil {
		return nil
	}
	err := o.f.Close()
	o.f = nil
	return err
}
