package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// stdinChunk is how much of stdin one request carries.
const stdinChunk = 256 << 10

// execStdin is what session exec streams to the command: --stdin's file
// (- for standard input), else standard input when it is a pipe, a socket
// or a file, never a terminal (it would wait for a ^D nobody meant to
// type) or a character device such as /dev/null. Nil: no stdin.
func execStdin(flag string, none bool) (io.Reader, func(), error) {
	switch {
	case none:
		return nil, func() {}, nil
	case flag == "-":
		return os.Stdin, func() {}, nil
	case flag != "":
		f, err := os.Open(flag)
		if err != nil {
			return nil, nil, usageError{fmt.Errorf("--stdin %q: %v", flag, err)}
		}
		return f, func() { f.Close() }, nil
	}
	fi, err := os.Stdin.Stat()
	if err != nil || fi.Mode()&(os.ModeNamedPipe|os.ModeSocket) == 0 && !fi.Mode().IsRegular() {
		return nil, func() {}, nil
	}
	return os.Stdin, func() {}, nil
}

// runExec runs an exec in one RunExec call: it starts it (or attaches to
// the exec of its id), streams in to it when it started it, and streams
// its output until it ends, then turns its ending into the exit status. A
// call that drops is made again from the offsets reached: the exec id
// makes it the same exec, attached to, not run again.
func runExec(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, sessionID string, spec *typesv1.ExecSpec, in io.Reader, raw bool) error {
	out := newOutputSink(g, raw)
	defer out.flush()
	for attempt := 0; ; attempt++ {
		x, retry, err := runExecOnce(ctx, g, client, sessionID, spec, in, out, attempt == 0)
		if x != nil {
			out.flush()
			return finishExec(g, x)
		}
		if !retry || attempt >= 10 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
}

// runExecOnce is one RunExec call: the ended exec, or whether to call
// again (the authority or the executor could not be reached).
func runExecOnce(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, sessionID string, spec *typesv1.ExecSpec,
	in io.Reader, out *outputSink, first bool) (*typesv1.Exec, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) (*typesv1.Exec, bool, error) {
		return nil, status.Code(err) == codes.Unavailable, rpcError(err)
	}
	stream, err := client.RunExec(ctx)
	if err != nil {
		return fail(err)
	}
	if err := stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{
		SessionId: sessionID, Spec: spec,
		StdoutOffset: out.offset(typesv1.OutputStream_OUTPUT_STREAM_STDOUT), StderrOffset: out.offset(typesv1.OutputStream_OUTPUT_STREAM_STDERR),
	}}}); err != nil && !errors.Is(err, io.EOF) {
		return fail(err)
	}
	// Stdin goes only once the exec is known to be this call's: an exec
	// started before takes none.
	msg, err := stream.Recv()
	if err != nil {
		return fail(err)
	}
	started := msg.GetStarted()
	if started == nil {
		return nil, false, remoteError{errors.New("the authority's RunExec began without the exec")}
	}
	if !started.GetCreated() && first && g.Output == "text" {
		fmt.Fprintf(g.Stderr, "[airlock] exec %s was started before: following it, not running it again\n", termtext.Line(spec.GetExecId()))
	}
	feedErr := make(chan error, 1)
	if started.GetCreated() && in != nil {
		go func() {
			if err := sendStdin(stream, in); err != nil {
				feedErr <- err
				cancel() // the exec is cancelled rather than run on part of its input
			}
		}()
	} else if err := stream.CloseSend(); err != nil {
		return fail(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			select {
			case ferr := <-feedErr:
				return nil, false, usageError{fmt.Errorf("stdin: %v; the exec is cancelled", ferr)}
			default:
			}
			if errors.Is(err, io.EOF) {
				return nil, true, remoteError{errors.New("the exec's stream ended before its record")}
			}
			return fail(err)
		}
		switch ev := msg.GetEvent().(type) {
		case *authorityv1.RunExecResponse_Output:
			out.write(ev.Output)
		case *authorityv1.RunExecResponse_Exec:
			return ev.Exec, false, nil
		}
	}
}

// sendStdin streams in to the exec, then closes its stdin. A send that
// fails means the call has ended; its status comes with Recv.
func sendStdin(stream interface {
	Send(*authorityv1.RunExecRequest) error
	CloseSend() error
}, in io.Reader) error {
	for {
		// A fresh buffer each time: a sent message is not to be changed.
		buf := make([]byte, stdinChunk)
		n, err := in.Read(buf)
		if n > 0 {
			if stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Stdin{Stdin: buf[:n]}}) != nil {
				return nil
			}
		}
		if errors.Is(err, io.EOF) {
			if stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_CloseStdin{CloseStdin: true}}) != nil {
				return nil
			}
			_ = stream.CloseSend()
			return nil
		}
		if err != nil {
			return err
		}
	}
}
