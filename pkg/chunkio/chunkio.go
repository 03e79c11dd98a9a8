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
