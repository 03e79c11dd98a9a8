package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/services/executor/internal/vm/client"
	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// The control socket's protocol, between run and the exec and kill of
// other CLI processes (all root, in a 0700 directory): the client sends
// one byte carrying its stdin, stdout and stderr (SCM_RIGHTS; exec only),
// then one JSON request line; run answers with JSON lines: exec gets
// {"pid":N} once the process runs and {"exit":{...}} when it ends, or
// {"error":..., "exit_code":126|127}; kill gets {} or {"error":...}.

// ctlRequest is one request on the control socket.
type ctlRequest struct {
	Op      string         `json:"op"` // "exec" or "kill"
	Process *proto.Process `json:"process,omitempty"`
	// Pgid, for kill, names a process group; 0 names the job.
	Pgid   int `json:"pgid,omitempty"`
	Signal int `json:"signal,omitempty"`
}

type ctlReply struct {
	Pid      int         `json:"pid,omitempty"`
	Exit     *proto.Exit `json:"exit,omitempty"`
	Error    string      `json:"error,omitempty"`
	ExitCode int         `json:"exit_code,omitempty"`
}

// maxCtlLine bounds one request or reply line.
const maxCtlLine = 2 << 20

// readLine reads one newline-terminated line of at most maxCtlLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > maxCtlLine {
			return nil, fmt.Errorf("control line longer than %d bytes", maxCtlLine)
		}
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// listen opens ROOT/ID/ctl.sock and serves it until the run ends.
func (r *runner) listen() error {
	path := r.state.path(ctlSock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	r.ln = ln
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	return nil
}

func (r *runner) serve(c *net.UnixConn) {
	defer c.Close()
	oob := make([]byte, unix.CmsgSpace(3*4))
	one := make([]byte, 1)
	_, oobn, _, _, err := c.ReadMsgUnix(one, oob)
	if err != nil {
		return
	}
	var files []*os.File
	if oobn > 0 {
		files = parseRights(oob[:oobn])
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	enc := json.NewEncoder(c)
	line, err := readLine(br)
	if err != nil {
		return
	}
	var req ctlRequest
	if err := json.Unmarshal(line, &req); err != nil {
		enc.Encode(ctlReply{Error: "control request: " + err.Error()})
		return
	}
	switch req.Op {
	case "kill":
		enc.Encode(r.kill(req))
	case "exec":
		if req.Process == nil || len(files) != 3 {
			enc.Encode(ctlReply{Error: "exec: want a process and three descriptors"})
			return
		}
		r.exec(c, br, *req.Process, files, enc)
	default:
		enc.Encode(ctlReply{Error: fmt.Sprintf("control request op %q: unknown", req.Op)})
	}
}

// parseRights returns the descriptors of SCM_RIGHTS messages (all of
// them, so none leaks; the caller checks how many it wanted).
func parseRights(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			// Non-blocking, so Go's poller serves it and closing it ends
			// a read still waiting on stdin: run then holds no end of the
			// exec's stdin pipe once the exec is over, and the writer
			// sees EPIPE instead of blocking for good.
			unix.SetNonblock(fd, true)
			out = append(out, os.NewFile(uintptr(fd), "ctl-fd"))
		}
	}
	return out
}

func (r *runner) kill(req ctlRequest) ctlReply {
	if req.Signal <= 0 || req.Signal > 64 || req.Pgid < 0 {
		return ctlReply{Error: fmt.Sprintf("kill: signal %d, pgid %d: out of range", req.Signal, req.Pgid)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if req.Pgid > 0 {
		err = r.c.Signal(ctx, -req.Pgid, syscall.Signal(req.Signal))
	} else {
		r.mu.Lock()
		job := r.job
		r.mu.Unlock()
		if job == nil {
			return ctlReply{Error: "kill: the job has not started"}
		}
		err = job.Signal(ctx, syscall.Signal(req.Signal))
	}
	if err != nil {
		return ctlReply{Error: "kill: " + err.Error()}
	}
	return ctlReply{}
}

// exec runs p in the guest with the exec CLI's stdin, stdout and stderr.
//
// The exec CLI may ask to signal the process's group (a kill request line
// on the same connection, when it is signalled itself); if it goes away
// before the process ends, the group is killed: only the sandbox kills an
// exec CLI, to stop the exec.
func (r *runner) exec(c *net.UnixConn, br *bufio.Reader, p proto.Process, files []*os.File, enc *json.Encoder) {
	if err := p.Validate(); err != nil {
		enc.Encode(ctlReply{Error: "exec: " + err.Error()})
		return
	}
	p.Stdin = true
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	proc, err := r.c.Start(ctx, p, files[1], files[2])
	cancel()
	if err != nil {
		var ee *client.ExecError
		if errors.As(err, &ee) {
			enc.Encode(ctlReply{Error: ee.Message, ExitCode: execCode(ee.Code)})
		} else {
			enc.Encode(ctlReply{Error: "exec: " + err.Error()})
		}
		return
	}
	enc.Encode(ctlReply{Pid: proc.Pid})
	go func() {
		io.Copy(proc.Stdin, files[0])
		proc.Stdin.Close()
	}()
	go func() {
		for {
			line, err := readLine(br)
			var req ctlRequest
			if err == nil && json.Unmarshal(line, &req) == nil && req.Op == "kill" {
				r.kill(ctlRequest{Pgid: proc.Pid, Signal: req.Signal})
				continue
			}
			select {
			case <-proc.Exited():
			default:
				r.kill(ctlRequest{Pgid: proc.Pid, Signal: int(unix.SIGKILL)})
			}
			return
		}
	}()
	exit, err := proc.Wait(context.Background())
	if err != nil {
		enc.Encode(ctlReply{Error: "exec: " + err.Error()})
		return
	}
	enc.Encode(ctlReply{Exit: &exit})
}

// dialCtl connects to ID's run, sending files (may be none) and req.
func dialCtl(g globals, id string, req ctlRequest, files ...*os.File) (*net.UnixConn, *bufio.Reader, error) {
	path := stateDir(g.root + "/" + id).path(ctlSock)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, nil, &notRunning{id: id, err: err}
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	b, _ := json.Marshal(req)
	if _, _, err := c.WriteMsgUnix([]byte{0}, oob, nil); err == nil {
		_, err = c.Write(append(b, '\n'))
	}
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("control socket of %q: %w", id, err)
	}
	return c, bufio.NewReaderSize(c, 64<<10), nil
}

// notRunning is dialCtl's error when no run answers for the container.
type notRunning struct {
	id  string
	err error
}

func (e *notRunning) Error() string {
	return fmt.Sprintf("container %q is not running: %v", e.id, e.err)
}

// call sends req (with files) to id's run and reads the first reply; a
// reply's error is returned as an error (an *exitCode for a failed execve).
func call(g globals, id string, req ctlRequest, files ...*os.File) (*net.UnixConn, *bufio.Reader, ctlReply, error) {
	c, br, err := dialCtl(g, id, req, files...)
	if err != nil {
		return nil, nil, ctlReply{}, err
	}
	rep, err := readReply(br)
	if err == nil && rep.Error != "" {
		err = errors.New(rep.Error)
		if rep.ExitCode == exitNotFound || rep.ExitCode == exitNoExec {
			err = &exitCode{code: rep.ExitCode, err: err}
		}
	}
	if err != nil {
		c.Close()
		return nil, nil, rep, err
	}
	return c, br, rep, nil
}

// readReply reads one reply line.
func readReply(br *bufio.Reader) (ctlReply, error) {
	var rep ctlReply
	line, err := readLine(br)
	if err != nil {
		return rep, fmt.Errorf("control socket: %w", err)
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("control socket: %w", err)
	}
	return rep, nil
}
