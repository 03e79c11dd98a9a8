// Package execd is the exec helper of a session's sandbox and its wire
// format. The helper (Main, built as the static binary airlock-execd) is
// started once per session sandbox by the runtime (`runc exec`), so it
// has the sandbox's namespaces, cgroup, seccomp filter, no_new_privs and
// rlimits; it holds one end of an anonymous socketpair the executor made
// (no path a job could find or connect to) and, for each request, forks
// the command as the job's user with the standard streams the executor
// sent over SCM_RIGHTS, and answers with a pidfd of it. The executor
// reads the command's exit status from that pidfd (the kernel's record,
// not the helper's word).
package execd

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// maxFrame bounds one message: an exec's argv and env, which the kernel
// bounds far below it.
const maxFrame = 8 << 20

// Request is one command to start. Its three fds (stdin, stdout, stderr)
// travel with it.
type Request struct {
	Argv   []string `json:"argv"`
	Env    []string `json:"env"`
	Cwd    string   `json:"cwd"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// Response answers a Request, or is the helper's first message (Ready).
// When Error is empty the command runs and its pidfd travels with it.
type Response struct {
	Ready bool `json:"ready,omitempty"`
	// Error says why the command could not be started; Code is then
	// 127 (not found) or 126 (found, not executable), as a shell says.
	Error string `json:"error,omitempty"`
	Code  int    `json:"code,omitempty"`
	// Pid is the command's pid in the sandbox's namespace.
	Pid int `json:"pid,omitempty"`
}

// Send writes v as one frame on the stream socket fd, with fds attached.
func Send(fd int, v any, fds ...int) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(data) > maxFrame {
		return fmt.Errorf("execd: message of %d bytes exceeds %d", len(data), maxFrame)
	}
	buf := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(data)), uint32(len(data)))
	buf = append(buf, data...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	// The fds go with the first bytes; the rest follows.
	n, err := sendmsg(fd, buf, oob)
	if err != nil {
		return err
	}
	for n < len(buf) {
		m, err := sendmsg(fd, buf[n:], nil)
		if err != nil {
			return err
		}
		n += m
	}
	return nil
}

// sendmsg and recvmsg retry a call a signal interrupted before it moved a
// byte: a socket with a timeout (the executor's end has one) is not
// restarted by SA_RESTART, and a Go process takes signals all the time
// (SIGURG preempts goroutines).
func sendmsg(fd int, b, oob []byte) (int, error) {
	for {
		n, err := unix.SendmsgN(fd, b, oob, nil, unix.MSG_NOSIGNAL)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

func recvmsg(fd int, b, oob []byte) (n, oobn int, err error) {
	for {
		n, oobn, _, _, err = unix.Recvmsg(fd, b, oob, unix.MSG_CMSG_CLOEXEC)
		if !errors.Is(err, unix.EINTR) {
			return n, oobn, err
		}
	}
}

// Recv reads one frame from the stream socket fd into v, with the fds
// that came with it (close-on-exec). io.EOF is a peer that closed its end.
func Recv(fd int, v any) ([]int, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, err := recvmsg(fd, hdr[:], oob)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, io.EOF
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err != nil {
				closeAll(fds)
				return nil, err
			}
			fds = append(fds, got...)
		}
	}
	fail := func(err error) ([]int, error) { closeAll(fds); return nil, err }
	if err := readFull(fd, hdr[n:]); err != nil {
		return fail(err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxFrame {
		return fail(fmt.Errorf("execd: frame of %d bytes exceeds %d", size, maxFrame))
	}
	data := make([]byte, size)
	if err := readFull(fd, data); err != nil {
		return fail(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fail(fmt.Errorf("execd: frame: %w", err))
	}
	return fds, nil
}

func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
