//go:build linux

package guest

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// process is one Start'ed process and its stdin queue.
type process struct {
	a      *agent
	stream uint32

	mu     sync.Mutex
	cond   *sync.Cond
	queue  [][]byte
	queued int
	closed bool // StdinClose arrived, or the process is gone
	ended  bool // Error or Exit sent: the stream's last frame
}

// outputChunk bounds one Stdout/Stderr frame.
const outputChunk = 32 << 10

// drainAfterExit is how long output is still read once the process is gone
// (a background child may hold its pipes open for ever).
const drainAfterExit = 2 * time.Second

// start runs spec; the answer (Started or Error, then output and Exit) comes
// from goroutines so the frame loop keeps reading.
func (a *agent) start(stream uint32, spec proto.Process) {
	p := &process{a: a, stream: stream}
	p.cond = sync.NewCond(&p.mu)
	a.mu.Lock()
	a.procs[stream] = p
	a.mu.Unlock()
	if err := spec.Validate(); err != nil {
		p.end(proto.TypeError, proto.Error{Message: err.Error()})
		return
	}
	go func() {
		if err := p.run(spec); err != nil {
			p.end(proto.TypeError, proto.Error{Message: err.Error()})
		}
	}()
}

// pipes makes n pipes; on error the ones made are closed.
func pipes(n int) ([][2]*os.File, error) {
	var out [][2]*os.File
	for range n {
		r, w, err := os.Pipe()
		if err != nil {
			for _, p := range out {
				p[0].Close()
				p[1].Close()
			}
			return nil, err
		}
		out = append(out, [2]*os.File{r, w})
	}
	return out, nil
}

func (p *process) run(spec proto.Process) error {
	a := p.a
	ps, err := pipes(5) // stdin, stdout, stderr, spec, status
	if err != nil {
		return fmt.Errorf("pipes: %w", err)
	}
	stdin, stdout, stderr, specP, status := ps[0], ps[1], ps[2], ps[3], ps[4]
	childStdin := stdin[0]
	if !spec.Stdin {
		stdin[0].Close()
		stdin[1].Close()
		if childStdin, err = os.Open(os.DevNull); err != nil {
			return err
		}
	}
	oomBefore := readOOMKills()
	sys := &syscall.SysProcAttr{Setsid: true}
	if a.jobCg >= 0 {
		sys.UseCgroupFD, sys.CgroupFD = true, a.jobCg
	}
	pid, wait, err := a.reaper.spawn("/proc/self/exe", []string{ChildArg0}, &syscall.ProcAttr{
		Env:   []string{},
		Files: []uintptr{childStdin.Fd(), stdout[1].Fd(), stderr[1].Fd(), specP[0].Fd(), status[1].Fd()},
		Sys:   sys,
	})
	for _, f := range []*os.File{childStdin, stdout[1], stderr[1], specP[0], status[1]} {
		f.Close()
	}
	if err != nil {
		for _, f := range []*os.File{stdin[1], stdout[0], stderr[0], specP[1], status[0]} {
			f.Close()
		}
		return fmt.Errorf("start %q: %w", spec.Args[0], err)
	}
	b, _ := json.Marshal(spec)
	specP[1].Write(b) // a child that dies early is reported through status
	specP[1].Close()
	msg, _ := io.ReadAll(io.LimitReader(status[0], 4096))
	status[0].Close()
	if len(msg) > 0 {
		stdout[0].Close()
		stderr[0].Close()
		if spec.Stdin {
			stdin[1].Close()
		}
		<-wait
		code, text, _ := strings.Cut(string(msg), " ")
		n, _ := strconv.Atoi(code)
		if n != 126 && n != 127 {
			n = 0 // not an exec failure
		}
		p.end(proto.TypeError, proto.Error{Message: text, ExitCode: n})
		return nil
	}
	if err := a.w.WriteJSON(p.stream, proto.TypeStarted, proto.Started{Pid: pid}); err != nil {
		return err
	}
	if spec.Stdin {
		go p.feed(stdin[1])
	}
	var out sync.WaitGroup
	for _, s := range []struct {
		f *os.File
		t proto.Type
	}{{stdout[0], proto.TypeStdout}, {stderr[0], proto.TypeStderr}} {
		out.Add(1)
		go func() {
			defer out.Done()
			p.pump(s.f, s.t)
		}()
	}
	ws := <-wait
	drained := make(chan struct{})
	go func() { out.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainAfterExit):
		stdout[0].Close() // ends the pumps' reads
		stderr[0].Close()
		<-drained
	}
	e := proto.Exit{OOMKills: readOOMKills() - oomBefore}
	if ws.Signaled() {
		e.Signal = int(ws.Signal())
		e.Code = 128 + e.Signal
	} else {
		e.Code = ws.ExitStatus()
	}
	p.end(proto.TypeExit, e)
	return nil
}

// end sends the stream's last frame (Error or Exit) once; no stdin
// acknowledgement follows it, which the host would take for a protocol error.
func (p *process) end(t proto.Type, v any) {
	p.a.mu.Lock()
	delete(p.a.procs, p.stream)
	p.a.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.ended, p.closed = true, true
	p.cond.Broadcast()
	p.a.w.WriteJSON(p.stream, t, v)
}

func (p *process) pump(f *os.File, t proto.Type) {
	buf := make([]byte, outputChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if p.a.w.Write(p.stream, t, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// queueStdin takes a Stdin frame; the host may not exceed its window.
func (p *process) queueStdin(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queued+len(b) > proto.MaxStdinQueue {
		return fmt.Errorf("%w: stream %d: stdin past its window", proto.ErrProtocol, p.stream)
	}
	if p.closed {
		go p.ack(len(b)) // a process gone: discard, but give the window back
		return nil
	}
	p.queue = append(p.queue, b)
	p.queued += len(b)
	p.cond.Signal()
	return nil
}

func (p *process) closeStdin() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *process) ack(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > 0 && !p.ended {
		p.a.w.WriteJSON(p.stream, proto.TypeStdinAck, proto.StdinAck{Bytes: n})
	}
}

// feed writes the queue to the process's stdin, acknowledging each chunk.
func (p *process) feed(w *os.File) {
	defer w.Close()
	broken := false
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && !p.closed {
			p.cond.Wait()
		}
		if len(p.queue) == 0 {
			p.mu.Unlock()
			return
		}
		b := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		if !broken {
			_, err := w.Write(b)
			broken = err != nil
		}
		p.mu.Lock()
		p.queued -= len(b)
		p.mu.Unlock()
		p.ack(len(b))
	}
}
