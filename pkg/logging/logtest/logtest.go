// Package logtest gives tests a log sink they can read back while servers
// write to it from many goroutines. Only tests import it.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent use whose content can be read
// at any time.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
