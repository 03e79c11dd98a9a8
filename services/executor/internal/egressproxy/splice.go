package egressproxy

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// activity is when bytes last moved either way on one connection, so that
// a long download with a silent job is not idle.
type activity struct{ last atomic.Int64 }

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

func (a *activity) at() time.Time { return time.Unix(0, a.last.Load()) }

// errIdle ends a connection nothing moved on for IdleTimeout.
var errIdle = errors.New("idle")

// idleReader reads conn. With act nil (while a connection is being set up)
// a deadline is final; with act set, a read deadline that passes while the
// other direction was active is moved on, and only a connection idle both
// ways for idle fails (errIdle).
type idleReader struct {
	conn net.Conn
	act  *activity
	idle time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	for {
		n, err := r.conn.Read(p)
		if r.act == nil {
			return n, err
		}
		if n > 0 {
			r.act.touch()
		}
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			next := r.act.at().Add(r.idle)
			if time.Until(next) <= 0 {
				return 0, errIdle
			}
			if err := r.conn.SetReadDeadline(next); err != nil {
				return 0, err
			}
			continue
		}
		return n, err
	}
}

// idleWriter writes to conn, counting, and fails a write that makes no
// progress for idle.
type idleWriter struct {
	conn  net.Conn
	act   *activity
	idle  time.Duration
	count *atomic.Int64
}

func (w *idleWriter) Write(p []byte) (int, error) {
	if err := w.conn.SetWriteDeadline(time.Now().Add(w.idle)); err != nil {
		return 0, err
	}
	n, err := w.conn.Write(p)
	w.count.Add(int64(n))
	if n > 0 {
		w.act.touch()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = errIdle
	}
	return n, err
}

// splice joins c's client to up both ways until both ends are done, first
// giving up what prelude writes (the ClientHello the proxy read, or the
// request it rewrote). An end's EOF half-closes the other side; an error
// either way closes both. It sets c's End.
func (p *Proxy) splice(c *conn, up net.Conn, prelude func(io.Writer) error) {
	idle := p.cfg.IdleTimeout
	c.act.touch()
	// The setup deadline is over; from here each direction keeps its own,
	// moved on by activity either way.
	c.client.SetDeadline(time.Now().Add(idle))
	up.SetDeadline(time.Now().Add(idle))
	c.reader.act, c.reader.idle = &c.act, idle
	toUp := &idleWriter{conn: up, act: &c.act, idle: idle, count: &c.bytesOut}
	toClient := &idleWriter{conn: c.client, act: &c.act, idle: idle, count: &c.bytesIn}
	fromUp := &idleReader{conn: up, act: &c.act, idle: idle}

	done := make(chan string, 2)
	pump := func(dst *idleWriter, src io.Reader, raw net.Conn, first func(io.Writer) error, dir string) {
		var err error
		if first != nil {
			err = first(dst)
		}
		if err == nil {
			err = pipe(dst, src, raw)
		}
		if err == nil {
			closeWrite(dst.conn)
		} else {
			c.client.Close()
			up.Close()
		}
		done <- ending(err, dir, idle)
	}
	go pump(toClient, fromUp, up, nil, "upstream to job")
	go pump(toUp, c.in, c.client, prelude, "job to upstream")
	// The first to end says how, unless it ended well and the other did
	// not; an end closing both makes the other's error only an echo.
	first, second := <-done, <-done
	c.d.End = first
	if first == "closed" || first == "" {
		c.d.End = cmp.Or(second, "closed")
	}
}

// spliceChunk is the most one zero-copy round moves between two looks at
// the idle rule and the counts.
const spliceChunk = 1 << 20

// pipe copies src, which reads raw (through a buffer, when src is one), to
// dst until src's EOF. Between two TCP connections the kernel moves the
// bytes (splice(2), by TCPConn.ReadFrom) a chunk at a time, so the counts
// and the idle rule keep up without the bytes passing through the proxy's
// memory; otherwise it copies through a buffer with src's and dst's idle
// rules.
func pipe(dst *idleWriter, src io.Reader, raw net.Conn) error {
	to, ok1 := dst.conn.(*net.TCPConn)
	from, ok2 := raw.(*net.TCPConn)
	if !ok1 || !ok2 {
		_, err := io.CopyBuffer(dst, src, make([]byte, 64<<10))
		return err
	}
	// What the proxy already read (a request head's rest) goes first.
	if b, ok := src.(*bufio.Reader); ok && b.Buffered() > 0 {
		data, _ := b.Peek(b.Buffered())
		if _, err := dst.Write(data); err != nil {
			return err
		}
		b.Discard(len(data))
	}
	for {
		// Writes must make progress within idle; reads wait as long as
		// either direction moved within idle, but never past three
		// quarters of the write's time, so that a deadline passing before
		// writeBy is the read's alone (the loop then looks again).
		writeBy := time.Now().Add(dst.idle)
		readBy := dst.act.at().Add(dst.idle)
		if early := writeBy.Add(-dst.idle / 4); early.Before(readBy) {
			readBy = early
		}
		if err := from.SetReadDeadline(readBy); err != nil {
			return err
		}
		if err := to.SetWriteDeadline(writeBy); err != nil {
			return err
		}
		n, err := to.ReadFrom(io.LimitReader(from, spliceChunk))
		if n > 0 {
			dst.count.Add(n)
			dst.act.touch()
		}
		switch {
		case err == nil && n < spliceChunk:
			return nil // src's EOF
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(writeBy):
			// The read deadline, with nothing in flight (the kernel
			// reads only once it may write): go on unless both
			// directions have been idle.
			if n == 0 && time.Until(dst.act.at().Add(dst.idle)) <= 0 {
				return errIdle
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The write made no progress for idle: bytes read may be
			// in flight, so the connection ends here.
			return errIdle
		default:
			return err
		}
	}
}

// ending says how one direction of a splice ended: "" when only because
// the other direction closed both ends.
func ending(err error, dir string, idle time.Duration) string {
	switch {
	case err == nil:
		return "closed"
	case errors.Is(err, net.ErrClosed):
		return ""
	case errors.Is(err, errIdle):
		return fmt.Sprintf("idle for %s", idle)
	case errors.Is(err, syscall.ECONNRESET):
		// Common at the end of an exchange: a peer closes with a TLS
		// close_notify it never read still queued, and its kernel resets.
		return "reset (" + dir + ")"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe (" + dir + ")"
	}
	return fmt.Sprintf("%s: %v", dir, err)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
