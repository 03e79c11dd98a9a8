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

	"golang.org/x/sys/unix"
)

// activity is when bytes last moved either way on one connection, so that
// a long download with a silent job is not idle.
type activity struct{ last atomic.Int64 }

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

func (a *activity) at() time.Time { return time.Unix(0, a.last.Load()) }

// errIdle ends a connection nothing moved on for IdleTimeout.
var errIdle = errors.New("idle")

// errRequestDone, from a splice's prelude, says the job's side is done
// once it is written: what the job sends after it is read and dropped.
var errRequestDone = errors.New("request written")

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

	type end struct {
		how     string
		drained bool // the job's side, thrown away after one request
	}
	done := make(chan end, 2)
	var draining atomic.Bool
	// closedFirst is the first end seen to close (its EOF, or its reset
	// while the handshake was watched), taken before either end is told,
	// so the other's answer to that cannot come first.
	var closedFirst atomic.Int32
	closedFirst.Store(-1)
	pump := func(dst *idleWriter, src io.Reader, raw net.Conn, first func(io.Writer) error, from int, dir string) {
		var err error
		if first != nil {
			err = first(dst)
		}
		drained := errors.Is(err, errRequestDone)
		switch {
		case drained:
			draining.Store(true)
			// The upstream keeps its side open (a FIN would read as the
			// client leaving); what the job sends now is read and thrown
			// away, so nothing it sends is forwarded and none is left
			// unread to reset the response on its way.
			_, err = io.Copy(io.Discard, src)
		case err == nil:
			err = pipe(dst, src, raw, c.tls, from)
		}
		if !drained && (err == nil || sourceReset(err)) {
			closedFirst.CompareAndSwap(-1, int32(from))
		}
		switch {
		case drained:
			// However the job's side ended, the response says how the
			// connection did.
			done <- end{"", true}
			return
		case err == nil:
			closeWrite(dst.conn)
		default:
			c.client.Close()
			up.Close()
		}
		done <- end{ending(err, dir, idle), false}
	}
	go pump(toClient, fromUp, up, nil, dirServer, "upstream to job")
	go pump(toUp, c.in, c.client, prelude, dirJob, "job to upstream")
	// The first to end says how, unless it ended well and the other did
	// not; an end closing both makes the other's error only an echo.
	first := <-done
	var second end
	if !first.drained && first.how == "closed" && draining.Load() {
		// A response sent whole, to a job whose side is drained (read as
		// it came, so nothing unread makes the close a reset): the
		// connection is done.
		c.client.Close()
	}
	second = <-done
	if f := closedFirst.Load(); f >= 0 {
		c.d.ClosedFirst = sideOf[f]
	}
	c.d.End = first.how
	if first.how == "closed" || first.how == "" {
		c.d.End = cmp.Or(second.how, "closed")
	}
}

// spliceChunk is the most one zero-copy round moves between two updates of
// the counts.
const spliceChunk = 1 << 20

// pipe copies src, which reads raw (through a buffer, when src is one), to
// dst until src's EOF. Between two TCP connections the kernel moves the
// bytes (splice(2), by TCPConn.ReadFrom) a chunk at a time, so they never
// pass through the proxy's memory; otherwise it copies through a buffer
// with src's and dst's idle rules.
//
// The idle rule on the zero-copy path: a read waits as long as either
// direction moved within idle; a write fails only once dst's send queue has
// not changed for idle (the peer stopped reading), watched by stallWatch,
// since a kernel that wakes a blocked writer only when much of a large send
// buffer is free would otherwise cut a slow but steady reader; it also keeps
// the activity both directions share fresh while bytes trickle.
//
// With w set, the bytes pass through the proxy's memory, each chunk shown
// to w as direction dir, until w has decided the handshake; then the rest
// goes as above.
func pipe(dst *idleWriter, src io.Reader, raw net.Conn, w *tlsWatch, dir int) error {
	if w != nil {
		if eof, err := watched(dst, src, w, dir); eof || err != nil {
			return err
		}
	}
	to, ok1 := dst.conn.(*net.TCPConn)
	from, ok2 := raw.(*net.TCPConn)
	if ok1 {
		// The zero-copy path needs to see the send queue move.
		_, _, ok1 = sendQueue(to)
	}
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
	if err := to.SetWriteDeadline(time.Time{}); err != nil {
		return err
	}
	stalled, stop := stallWatch(to, dst.act, dst.idle)
	defer stop()
	for {
		if err := from.SetReadDeadline(dst.act.at().Add(dst.idle)); err != nil {
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
		case errors.Is(err, os.ErrDeadlineExceeded) && stalled.Load():
			// The write made no progress for idle: bytes read may be
			// in flight, so the connection ends here.
			return errIdle
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The read deadline, with nothing in flight (the kernel
			// reads only once it may write): go on unless both
			// directions have been idle.
			if n == 0 && time.Until(dst.act.at().Add(dst.idle)) <= 0 {
				return errIdle
			}
		default:
			return err
		}
	}
}

// watchChunk is the most one read moves while a handshake is watched.
const watchChunk = 32 << 10

// watched copies src to dst, showing each chunk to w as direction dir
// before it is written, until w has decided (eof false, err nil: the rest
// is to be copied unwatched), src's EOF (eof true), or an error.
func watched(dst *idleWriter, src io.Reader, w *tlsWatch, dir int) (eof bool, err error) {
	buf := make([]byte, watchChunk)
	for !w.done() {
		n, rerr := src.Read(buf)
		if n > 0 {
			w.feed(dir, buf[:n])
			if _, err := dst.Write(buf[:n]); err != nil {
				return false, err
			}
		}
		switch {
		case errors.Is(rerr, io.EOF):
			return true, nil
		case rerr != nil:
			return false, readError{rerr}
		}
	}
	return false, nil
}

// readError is an error reading a direction's source, as opposed to
// writing its destination.
type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }
func (e readError) Unwrap() error { return e.err }

// sourceReset reports whether err is the source's end resetting the
// connection (as a TLS client does that closes with bytes unread): that
// end went first.
func sourceReset(err error) bool {
	var re readError
	return errors.As(err, &re) && errors.Is(err, syscall.ECONNRESET)
}

// stallWatch looks at c every idle/4. While c's peer takes bytes (its
// count of bytes acked grows, or the send queue shrinks) it keeps act
// fresh: a splice round does not return until its chunk is full, so a
// trickle would otherwise look idle to the other direction. Once bytes wait
// in c's send queue and none has been taken for idle, or c can no longer be
// looked at, it reports the stall and makes c's pending write fail (a
// deadline in the past). stop ends it.
func stallWatch(c *net.TCPConn, act *activity, idle time.Duration) (stalled *atomic.Bool, stop func()) {
	stalled = new(atomic.Bool)
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(idle / 4)
		defer t.Stop()
		lastAcked, lastQueued, _ := sendQueue(c)
		since := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				acked, queued, ok := sendQueue(c)
				progress := acked != lastAcked || queued < lastQueued
				lastAcked, lastQueued = acked, queued
				switch {
				case ok && progress:
					since = now
					act.touch()
				case ok && queued == 0:
					since = now // nothing waits: not a stall (the read side keeps the idle rule)
				case !ok || now.Sub(since) >= idle:
					stalled.Store(true)
					c.SetWriteDeadline(time.Unix(1, 0))
					return
				}
			}
		}
	}()
	return stalled, func() { close(done) }
}

// sendQueue is how many bytes c's peer has acked and how many wait in c's
// send queue; ok is false when c cannot be looked at.
func sendQueue(c *net.TCPConn) (acked uint64, queued int, ok bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var gerr error
	cerr := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		if info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); gerr == nil {
			acked = info.Bytes_acked
			queued, gerr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		}
	})
	return acked, queued, cerr == nil && gerr == nil
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
