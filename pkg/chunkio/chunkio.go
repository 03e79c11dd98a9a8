// Package chunkio reads a stream of byte chunks (a gRPC stream's messages,
// say) as one io.Reader.
package chunkio

// Reader is an io.Reader of the chunks next returns, in order, as one byte stream.
// next returns io.EOF at the stream's end; an empty chunk is skipped.
type Reader struct {
	next func() ([]byte, error)
	buf  []byte
}

// NewReader returns a Reader over next.
func NewReader(next func() ([]byte, error)) *Reader { return &Reader{next: next} }

func (r *Reader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		b, err := r.next()
		if err != nil {
			return 0, err
		}
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Writer gathers what is written into chunks of a fixed size and hands
// each to send (the last, at Flush, shorter). send must be done with the
// chunk when it returns (a gRPC stream's Send serializes it): the buffer
// is reused.
type Writer struct {
	buf  []byte
	send func([]byte) error
}

// NewWriter returns a Writer of chunks of size bytes.
func NewWriter(size int, send func([]byte) error) *Writer {
	return &Writer{buf: make([]byte, 0, size), send: send}
}

func (w *Writer) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), cap(w.buf)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.Flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// Flush sends what is gathered, if anything.
func (w *Writer) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.send(w.buf)
	w.buf = w.buf[:0]
	return err
}
