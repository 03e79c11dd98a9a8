// Package client is the host's side of the guest agent protocol (package
// vm/proto): one Client per virtio-serial connection, multiplexing the
// control stream and one stream per process. Everything the guest sends is
// treated as hostile: a malformed or unexpected frame ends the connection.
// The VM runtime CLI (cmd/airlock-vm) and the tests that boot a guest import it.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// ExecError is Start's error when the guest could not execute argv[0]; its
// message is what runc logs (`exec: "x": executable file not found in $PATH`).
type ExecError struct {
	Message string
	Code    int // 127: not found; 126: not executable
}

func (e *ExecError) Error() string { return e.Message }

// GuestError is a control request the guest refused, with its reason.
type GuestError struct{ Message string }

func (e *GuestError) Error() string { return "guest: " + e.Message }

// Client talks to one guest agent. Its methods are safe for concurrent use;
// control requests (Configure, Signal) are answered one at a time.
type Client struct {
	conn io.ReadWriteCloser
	w    *proto.Writer

	hello chan proto.Hello
	ctl   chan proto.Frame // the answer to the outstanding control request
	ctlMu sync.Mutex       // held while a control request is outstanding

	mu      sync.Mutex
	procs   map[uint32]*Process
	next    uint32
	pending bool // a control request awaits its answer
	done    chan struct{}
	err     error // why the connection ended, set before done closes
}

// New starts reading conn; the guest's Hello is then available from Hello.
// Close (or the guest closing) ends every Process with an error.
func New(conn io.ReadWriteCloser) *Client {
	c := &Client{
		conn:  conn,
		w:     proto.NewWriter(conn),
		hello: make(chan proto.Hello, 1),
		ctl:   make(chan proto.Frame, 1),
		procs: map[uint32]*Process{},
		done:  make(chan struct{}),
	}
	go c.read()
	return c
}

// Hello waits for the guest's first frame.
func (c *Client) Hello(ctx context.Context) (proto.Hello, error) {
	select {
	case h := <-c.hello:
		c.hello <- h // later callers see it too
		return h, nil
	case <-c.done:
		return proto.Hello{}, c.err
	case <-ctx.Done():
		return proto.Hello{}, fmt.Errorf("waiting for the guest's hello: %w", ctx.Err())
	}
}

// Configure sends the machine's setup (files first, as File frames) and
// waits until the guest has mounted, networked and started what it asks for.
func (c *Client) Configure(ctx context.Context, cfg proto.Config) error {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	for i := range cfg.Files {
		f := &cfg.Files[i]
		if len(f.Content) > proto.MaxFileSize {
			return fmt.Errorf("config file %s: %d bytes exceeds %d", f.Path, len(f.Content), proto.MaxFileSize)
		}
		f.Size = len(f.Content)
		for off := 0; off == 0 || off < len(f.Content); {
			end := min(off+proto.MaxFileChunk, len(f.Content))
			b, err := proto.EncodeFileChunk(f.Path, f.Mode, f.Content[off:end])
			if err != nil {
				return err
			}
			if err := c.w.Write(proto.ControlStream, proto.TypeFile, b); err != nil {
				return fmt.Errorf("send config file %s: %w", f.Path, err)
			}
			if off = end; end == 0 {
				break
			}
		}
	}
	return c.request(ctx, proto.TypeConfig, cfg)
}

// Signal sends sig to pid in the guest; a negative pid is a process group.
func (c *Client) Signal(ctx context.Context, pid int, sig syscall.Signal) error {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	return c.request(ctx, proto.TypeSignal, proto.Signal{Pid: pid, Signal: int(sig)})
}

// Shutdown asks the guest to kill everything, sync and power off. It does
// not wait: the connection (and QEMU) ending is the answer.
func (c *Client) Shutdown() error {
	return c.w.Write(proto.ControlStream, proto.TypeShutdown, nil)
}

// Close ends the connection; running Processes' Wait returns an error.
func (c *Client) Close() error {
	err := c.conn.Close()
	c.fail(errors.New("vm client closed"))
	return err
}

// Done is closed when the connection has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (nil while it runs).
func (c *Client) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// request sends one control request and waits for Ready or Error; ctlMu is held.
func (c *Client) request(ctx context.Context, t proto.Type, v any) error {
	c.mu.Lock()
	c.pending = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.pending = false
		c.mu.Unlock()
	}()
	if err := c.w.WriteJSON(proto.ControlStream, t, v); err != nil {
		return fmt.Errorf("send %s: %w", t, err)
	}
	select {
	case f := <-c.ctl:
		if f.Type == proto.TypeReady {
			return nil
		}
		var e proto.Error
		if err := proto.Decode(f, &e); err != nil {
			c.fail(err)
			return err
		}
		return &GuestError{Message: bounded(e.Message)}
	case <-c.done:
		return c.err
	case <-ctx.Done():
		// The answer may still come; the connection is no longer in step.
		c.fail(fmt.Errorf("%s: %w", t, ctx.Err()))
		return fmt.Errorf("waiting for the guest's answer to %s: %w", t, ctx.Err())
	}
}

// fail ends the connection once, with err as the reason.
func (c *Client) fail(err error) {
	c.mu.Lock()
	select {
	case <-c.done:
		c.mu.Unlock()
		return
	default:
	}
	c.err = err
	close(c.done)
	procs := c.procs
	c.procs = map[uint32]*Process{}
	c.mu.Unlock()
	c.conn.Close()
	for _, p := range procs {
		p.finish(proto.Exit{}, err)
	}
}

// bounded keeps a guest-chosen message from flooding a log.
func bounded(s string) string {
	const limit = 4096
	if len(s) > limit {
		return s[:limit] + "...(truncated)"
	}
	return s
}

// read dispatches the guest's frames until the connection ends.
func (c *Client) read() {
	r := proto.NewReader(c.conn)
	helloSeen := false
	for {
		f, err := r.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("guest closed the connection")
			}
			c.fail(err)
			return
		}
		if f.Stream == proto.ControlStream {
			err = c.control(f, &helloSeen)
		} else {
			err = c.process(f)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

func (c *Client) control(f proto.Frame, helloSeen *bool) error {
	switch f.Type {
	case proto.TypeHello:
		if *helloSeen {
			return fmt.Errorf("%w: second hello", proto.ErrProtocol)
		}
		*helloSeen = true
		var h proto.Hello
		if err := proto.Decode(f, &h); err != nil {
			return err
		}
		h.Version, h.Kernel = bounded(h.Version), bounded(h.Kernel)
		c.hello <- h
		return nil
	case proto.TypeReady, proto.TypeError:
		c.mu.Lock()
		pending := c.pending
		c.pending = false
		c.mu.Unlock()
		if !pending {
			return fmt.Errorf("%w: unrequested %s on the control stream", proto.ErrProtocol, f.Type)
		}
		c.ctl <- f
		return nil
	}
	return fmt.Errorf("%w: %s on the control stream", proto.ErrProtocol, f.Type)
}

func (c *Client) process(f proto.Frame) error {
	c.mu.Lock()
	p := c.procs[f.Stream]
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w: %s on unknown stream %d", proto.ErrProtocol, f.Type, f.Stream)
	}
	p.mu.Lock()
	started := p.Pid != 0
	p.mu.Unlock()
	switch {
	case f.Type == proto.TypeStarted && !started:
		var s proto.Started
		if err := proto.Decode(f, &s); err != nil {
			return err
		}
		if s.Pid <= 0 {
			return fmt.Errorf("%w: started pid %d", proto.ErrProtocol, s.Pid)
		}
		p.mu.Lock()
		p.Pid = s.Pid
		p.mu.Unlock()
		close(p.started)
		return nil
	case f.Type == proto.TypeError && !started:
		var e proto.Error
		if err := proto.Decode(f, &e); err != nil {
			return err
		}
		var err error = &GuestError{Message: bounded(e.Message)}
		if e.ExitCode == 126 || e.ExitCode == 127 {
			err = &ExecError{Message: bounded(e.Message), Code: e.ExitCode}
		}
		c.remove(f.Stream)
		p.finish(proto.Exit{}, err)
		return nil
	case !started:
		return fmt.Errorf("%w: %s before started on stream %d", proto.ErrProtocol, f.Type, f.Stream)
	case f.Type == proto.TypeStdout || f.Type == proto.TypeStderr:
		w := p.stdout
		if f.Type == proto.TypeStderr {
			w = p.stderr
		}
		if w != nil {
			w.Write(f.Payload) // a failing writer loses output, not the connection
		}
		return nil
	case f.Type == proto.TypeStdinAck:
		var a proto.StdinAck
		if err := proto.Decode(f, &a); err != nil {
			return err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if a.Bytes <= 0 || p.window+a.Bytes > proto.MaxStdinQueue {
			return fmt.Errorf("%w: stdin ack of %d with window %d", proto.ErrProtocol, a.Bytes, p.window)
		}
		p.window += a.Bytes
		p.cond.Broadcast()
		return nil
	case f.Type == proto.TypeExit:
		var e proto.Exit
		if err := proto.Decode(f, &e); err != nil {
			return err
		}
		if e.Code < 0 || e.Code > 255 || e.Signal < 0 || e.Signal > 64 {
			return fmt.Errorf("%w: exit code %d signal %d", proto.ErrProtocol, e.Code, e.Signal)
		}
		c.remove(f.Stream)
		p.finish(e, nil)
		return nil
	}
	return fmt.Errorf("%w: %s on process stream %d", proto.ErrProtocol, f.Type, f.Stream)
}

func (c *Client) remove(stream uint32) {
	c.mu.Lock()
	delete(c.procs, stream)
	c.mu.Unlock()
}

// Process is one process running in the guest.
type Process struct {
	// Pid is the guest pid, also its process group and session id.
	Pid int
	// Stdin feeds the process's stdin (nil unless proto.Process.Stdin);
	// Close sends EOF. Writes block while the guest's queue is full.
	Stdin io.WriteCloser

	c              *Client
	stream         uint32
	stdout, stderr io.Writer
	started        chan struct{}
	exited         chan struct{}

	mu     sync.Mutex
	cond   *sync.Cond
	window int // stdin bytes the guest will still accept
	closed bool
	exit   proto.Exit
	err    error
}

// Start runs spec in the guest and waits until it runs. Its output goes to
// stdout and stderr (either may be nil to discard), written from the
// client's reader: a slow writer slows every stream. A failed execve is an
// *ExecError. If ctx ends first the connection is closed, since the guest
// may still start the process.
func (c *Client) Start(ctx context.Context, spec proto.Process, stdout, stderr io.Writer) (*Process, error) {
	p := &Process{c: c, stdout: stdout, stderr: stderr, started: make(chan struct{}),
		exited: make(chan struct{}), window: proto.MaxStdinQueue}
	p.cond = sync.NewCond(&p.mu)
	if spec.Stdin {
		p.Stdin = &stdinWriter{p}
	}
	c.mu.Lock()
	select {
	case <-c.done:
		c.mu.Unlock()
		return nil, c.err
	default:
	}
	c.next++
	if c.next == 0 {
		c.next = 1
	}
	p.stream = c.next
	c.procs[p.stream] = p
	c.mu.Unlock()
	if err := c.w.WriteJSON(p.stream, proto.TypeStart, spec); err != nil {
		c.remove(p.stream)
		return nil, fmt.Errorf("send start: %w", err)
	}
	select {
	case <-p.started:
		return p, nil
	case <-p.exited:
		// A process that started and ended at once has both closed, and
		// select picks either: it started, and its exit waits in Wait.
		select {
		case <-p.started:
			return p, nil
		default:
		}
		if p.err == nil {
			return nil, fmt.Errorf("the guest ended %q before it started", spec.Args)
		}
		return nil, p.err
	case <-ctx.Done():
		c.fail(fmt.Errorf("start: %w", ctx.Err()))
		return nil, fmt.Errorf("waiting for the guest to start %q: %w", spec.Args[0], ctx.Err())
	}
}

// Wait returns the process's exit, or an error when the connection ended first.
func (p *Process) Wait(ctx context.Context) (proto.Exit, error) {
	select {
	case <-p.exited:
		return p.exit, p.err
	case <-ctx.Done():
		return proto.Exit{}, ctx.Err()
	}
}

// Exited is closed once Wait would return without blocking.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Signal sends sig to the process (not its group: use Client.Signal with -Pid).
func (p *Process) Signal(ctx context.Context, sig syscall.Signal) error {
	return p.c.Signal(ctx, p.Pid, sig)
}

func (p *Process) finish(e proto.Exit, err error) {
	p.mu.Lock()
	select {
	case <-p.exited:
		p.mu.Unlock()
		return
	default:
	}
	p.exit, p.err, p.closed = e, err, true
	close(p.exited)
	p.cond.Broadcast()
	p.mu.Unlock()
}

type stdinWriter struct{ p *Process }

// chunk keeps one stdin frame small so output of other streams interleaves.
const chunk = 64 << 10

func (s stdinWriter) Write(b []byte) (int, error) {
	p := s.p
	n := 0
	for len(b) > 0 {
		p.mu.Lock()
		for p.window == 0 && !p.closed {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			return n, os.ErrClosed
		}
		m := min(len(b), p.window, chunk)
		p.window -= m
		p.mu.Unlock()
		if err := p.c.w.Write(p.stream, proto.TypeStdin, b[:m]); err != nil {
			return n, err
		}
		n += m
		b = b[m:]
	}
	return n, nil
}

func (s stdinWriter) Close() error {
	p := s.p
	p.mu.Lock()
	closed := p.closed
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	if closed {
		return nil
	}
	return p.c.w.Write(p.stream, proto.TypeStdinClose, nil)
}
