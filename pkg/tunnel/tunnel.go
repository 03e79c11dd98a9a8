// Package tunnel carries one TCP connection's bytes between two ends that
// each deliver and take byte chunks: a net.Conn, or a gRPC stream of data
// messages. The CLI, the authority and the executor each join two such
// ends to forward a port (ForwardPort); the package counts the bytes each
// way. It imports no gRPC; any package may import it.
package tunnel

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ChunkSize is the most bytes one chunk carries (the proto's bound on a
// data message is 64 KiB).
const ChunkSize = 32 << 10

// End is one side of a tunnel.
type End interface {
	// Recv returns the next chunk, or io.EOF when the side sends no more.
	Recv() ([]byte, error)
	// Send delivers a chunk.
	Send([]byte) error
	// CloseSend says no more chunks will be sent (a half-close); an end
	// that cannot half-close does nothing.
	CloseSend() error
}

// Funcs makes an End of three functions; a nil CloseSend does nothing.
type Funcs struct {
	RecvFunc      func() ([]byte, error)
	SendFunc      func([]byte) error
	CloseSendFunc func() error
}

func (f Funcs) Recv() ([]byte, error) { return f.RecvFunc() }
func (f Funcs) Send(b []byte) error   { return f.SendFunc(b) }
func (f Funcs) CloseSend() error {
	if f.CloseSendFunc == nil {
		return nil
	}
	return f.CloseSendFunc()
}

// Conn is a net.Conn as an End; CloseSend half-closes a TCP or Unix
// connection.
func Conn(c net.Conn) End { return connEnd{c: c, buf: make([]byte, ChunkSize)} }

type connEnd struct {
	c   net.Conn
	buf []byte
}

func (e connEnd) Recv() ([]byte, error) {
	n, err := e.c.Read(e.buf)
	if n > 0 {
		return e.buf[:n], nil
	}
	if err == nil {
		return nil, nil
	}
	return nil, err
}

func (e connEnd) Send(b []byte) error {
	_, err := e.c.Write(b)
	return err
}

func (e connEnd) CloseSend() error {
	if hc, ok := e.c.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return nil
}

// drainWait bounds how long Join waits, once it is done, for the other
// direction to end.
const drainWait = 2 * time.Second

// Join carries chunks from client to service (counting them in in) and
// from service to client (counting them in out) until the service's
// chunks end: then the client is half-closed and Join returns nil. The
// client's end (io.EOF) half-closes the service and the bytes back keep
// flowing. Any other failure either way returns it.
//
// Once done, Join calls stop (if not nil), which should close both ends
// or cancel their streams, and waits (at most drainWait) for the other
// direction to end. Whatever it does, no chunk is sent or counted after
// Join returns: a direction still blocked in a Recv that stop cannot end
// (a gRPC server stream's ends only with its handler) drops what it then
// receives, so a server stream is never sent on after its handler
// returned and the counts are final when Join returns.
func Join(client, service End, in, out *atomic.Int64, stop func()) error {
	g := &gate{}
	up := make(chan error, 1)
	down := make(chan error, 1)
	go func() { up <- pump(client, service, in, g) }()
	go func() { down <- pump(service, client, out, g) }()
	var err error
	other := up
	for {
		select {
		case err = <-up:
			if err == nil {
				up = nil // half-closed; the bytes back go on
				continue
			}
			other = down
		case err = <-down:
			other = up
		}
		break
	}
	if stop != nil {
		stop()
	}
	g.shut()
	if other != nil {
		t := time.NewTimer(drainWait)
		defer t.Stop()
		select {
		case <-other:
		case <-t.C:
		}
	}
	return err
}

// gate lets chunks through until it is shut.
type gate struct {
	mu     sync.Mutex
	closed bool
}

func (g *gate) shut() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// errShut is what a direction sees once Join is done.
var errShut = errors.New("tunnel: joined ends are done")

// pump copies from src to dst until src ends (then dst is half-closed and
// pump returns nil) or either fails, or g is shut.
func pump(src, dst End, n *atomic.Int64, g *gate) error {
	for {
		b, err := src.Recv()
		if len(b) > 0 {
			if serr := g.send(dst, b, n); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.closed {
				return errShut
			}
			return dst.CloseSend()
		}
		if err != nil {
			return err
		}
	}
}

// send delivers b to dst and counts it, unless g is shut.
func (g *gate) send(dst End, b []byte, n *atomic.Int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errShut
	}
	if err := dst.Send(b); err != nil {
		return err
	}
	if n != nil {
		n.Add(int64(len(b)))
	}
	return nil
}
