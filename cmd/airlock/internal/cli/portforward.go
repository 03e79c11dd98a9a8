package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/termtext"
	"github.com/airlockhq/airlock/pkg/tunnel"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// forwardPoll is how often a waiting or listening port-forward reads its
// forward again.
const forwardPoll = time.Second

// forwardStateWord is a forward's state in one word.
func forwardStateWord(s authorityv1.PortForwardState) string {
	switch s {
	case authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING:
		return "pending"
	case authorityv1.PortForwardState_PORT_FORWARD_STATE_OPEN:
		return "open"
	case authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED:
		return "closed"
	}
	return "unknown"
}

// parseForwardPorts reads [LOCAL:]PORT; LOCAL defaults to PORT, and 0
// takes any free port.
func parseForwardPorts(s string) (local int, port uint32, err error) {
	l, p, hasLocal := strings.Cut(s, ":")
	if !hasLocal {
		p = l
	}
	pn, perr := strconv.ParseUint(p, 10, 16)
	ln, lerr := strconv.ParseUint(l, 10, 16)
	if perr != nil || pn == 0 || lerr != nil {
		return 0, 0, fmt.Errorf("%q: want [LOCAL:]PORT, PORT 1 to 65535 inside the session, LOCAL 0 to 65535 on this machine (0: any free port)", s)
	}
	return int(ln), uint32(pn), nil
}

func newSessionPortForward(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "port-forward SESSION [LOCAL:]PORT",
		Short: "Reach a TCP port inside a running session from this machine only",
		Long: `Opens a port forward into a running session and listens on 127.0.0.1:LOCAL
(this machine's loopback only; LOCAL defaults to PORT, 0 takes any free
port). Each connection to it is carried over this client's mTLS connection
to the authority, then to the session's executor, which connects to PORT
on the session's own loopback. Nothing listens anywhere else: no public
port is opened, on the executor or on any network.

The tenant's policy says which ports may be forwarded and for how long
(port_forward); where it says approval: required the forward waits,
pending, until an approver who is not you approves it. Ctrl-C closes the
forward; it also closes at its expiry (--ttl) or when the session ends.
Its record, with the bytes carried each way, stays: session forwards.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, port, err := parseForwardPorts(args[1])
			if err != nil {
				return usageError{err}
			}
			if ttl < 0 {
				return usageError{errors.New("--ttl must not be negative")}
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				return portForward(cmd.Context(), g, client, args[0], local, port, ttl)
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the forward stays open (default: the tenant's port_forward.default_ttl)")
	return cmd
}

// portForward opens the forward, waits while it is pending, then carries
// connections until ctx ends (then it closes the forward) or the forward
// closes.
func portForward(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, session string, local int, port uint32, ttl time.Duration) error {
	req := &authorityv1.OpenPortForwardRequest{SessionId: session, Port: port}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := client.OpenPortForward(ctx, req)
	if err != nil {
		return err
	}
	f := resp.GetForward()
	id := f.GetForwardId()
	// However this ends, the forward is closed.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		r, err := client.ClosePortForward(cctx, &authorityv1.ClosePortForwardRequest{ForwardId: id})
		if err != nil {
			fmt.Fprintf(g.Stderr, "[airlock] close forward %s: %v\n", termtext.Line(id), err)
			return
		}
		c := r.GetForward()
		fmt.Fprintf(g.Stderr, "[airlock] forward %s closed: %d connection(s), %d byte(s) in, %d byte(s) out\n",
			termtext.Line(id), c.GetConnections(), c.GetBytesIn(), c.GetBytesOut())
	}()
	if f.GetState() == authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING {
		fmt.Fprintf(g.Stderr, "[airlock] forward %s waits for approval %s (an approver who is not you: airlock approval approve %s)\n",
			termtext.Line(id), termtext.Line(f.GetApprovalId()), termtext.Line(f.GetApprovalId()))
	}
	for f.GetState() == authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil // Ctrl-C while pending: the deferred close withdraws it
			}
			return ctx.Err()
		case <-time.After(forwardPoll):
		}
		if f, err = getForward(ctx, client, session, id); err != nil {
			return err
		}
	}
	if f.GetState() != authorityv1.PortForwardState_PORT_FORWARD_STATE_OPEN {
		return remoteError{fmt.Errorf("forward %s is %s: %s", termtext.Line(id), forwardStateWord(f.GetState()), termtext.Line(f.GetCloseReason()))}
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(local)))
	if err != nil {
		return err
	}
	defer l.Close()
	// The address alone on stdout, for scripts; the rest on stderr.
	fmt.Fprintln(g.Stdout, l.Addr().String())
	fmt.Fprintf(g.Stderr, "[airlock] forwarding %s to port %d of session %s (forward %s, until %s); Ctrl-C closes it\n",
		l.Addr(), port, termtext.Line(session), termtext.Line(id), f.GetExpiresAt().AsTime().Local().Format(time.DateTime))

	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go func() {
		// The forward may close without us: at its expiry, when the
		// session ends, or closed by another client or an operator.
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(forwardPoll):
			}
			cur, err := getForward(ctx, client, session, id)
			if err == nil && cur.GetState() == authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED {
				stop(remoteError{fmt.Errorf("forward %s closed: %s", termtext.Line(id), termtext.Line(cur.GetCloseReason()))})
				return
			}
		}
	}()
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	var wg sync.WaitGroup
	// Whatever ended the loop (an Accept error too), the connections are
	// cut before they are waited for.
	defer func() {
		stop(nil)
		wg.Wait()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				if errors.Is(cause, context.Canceled) {
					return nil // Ctrl-C: the deferred close says what it carried
				}
				return cause
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			if err := carryConn(ctx, client, id, c); err != nil && ctx.Err() == nil {
				fmt.Fprintf(g.Stderr, "[airlock] connection from %s: %v\n", c.RemoteAddr(), err)
			}
		}()
	}
}

// carryConn carries one local connection over its own ForwardPort stream.
func carryConn(ctx context.Context, client authorityv1.AuthorityServiceClient, id string, c net.Conn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.ForwardPort(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&authorityv1.ForwardPortRequest{Msg: &authorityv1.ForwardPortRequest_ForwardId{ForwardId: id}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if !first.GetConnected() {
		return errors.New("the authority's first answer was not connected")
	}
	service := tunnel.Funcs{
		RecvFunc: func() ([]byte, error) {
			m, err := stream.Recv()
			if err != nil {
				return nil, err
			}
			return m.GetData(), nil
		},
		SendFunc: func(b []byte) error {
			return stream.Send(&authorityv1.ForwardPortRequest{Msg: &authorityv1.ForwardPortRequest_Data{Data: b}})
		},
		CloseSendFunc: stream.CloseSend,
	}
	return tunnel.Join(tunnel.Conn(c), service, nil, nil, func() { c.Close(); cancel() })
}

// getForward reads one forward of session (ListPortForwards: there is no
// call for one).
func getForward(ctx context.Context, client authorityv1.AuthorityServiceClient, session, id string) (*authorityv1.PortForward, error) {
	r, err := client.ListPortForwards(ctx, &authorityv1.ListPortForwardsRequest{SessionId: session})
	if err != nil {
		return nil, err
	}
	for _, f := range r.GetForwards() {
		if f.GetForwardId() == id {
			return f, nil
		}
	}
	return nil, fmt.Errorf("forward %s is not among session %s's", termtext.Line(id), termtext.Line(session))
}

func newSessionForwards(g *globals) *cobra.Command {
	var openOnly bool
	cmd := &cobra.Command{
		Use:   "forwards SESSION",
		Short: "List a session's port forwards, open and closed, with what each carried",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return showAuthority(cmd, g, func(ctx context.Context, c authorityv1.AuthorityServiceClient) (*authorityv1.ListPortForwardsResponse, error) {
				return c.ListPortForwards(ctx, &authorityv1.ListPortForwardsRequest{SessionId: args[0], OpenOnly: openOnly})
			}, func(w io.Writer, r *authorityv1.ListPortForwardsResponse) {
				fmt.Fprintln(w, "FORWARD\tPORT\tSTATE\tREQUESTER\tCONNECTIONS\tBYTES IN\tBYTES OUT\tEXPIRES\tCLOSED")
				for _, f := range r.GetForwards() {
					closed := ""
					if f.GetState() == authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED {
						closed = f.GetClosedAt().AsTime().Local().Format(time.DateTime) + " " + f.GetCloseReason()
					}
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", termtext.Line(f.GetForwardId()), f.GetPort(), forwardStateWord(f.GetState()),
						termtext.Line(f.GetRequester()), f.GetConnections(), f.GetBytesIn(), f.GetBytesOut(),
						f.GetExpiresAt().AsTime().Local().Format(time.DateTime), termtext.Line(closed))
				}
			})
		},
	}
	cmd.Flags().BoolVar(&openOnly, "open", false, "only forwards open or pending")
	return cmd
}

func newSessionCloseForward(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "close-forward FORWARD",
		Short: "Close a port forward: its live connections are cut and no new one is carried",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return showAuthority(cmd, g, func(ctx context.Context, c authorityv1.AuthorityServiceClient) (*authorityv1.ClosePortForwardResponse, error) {
				return c.ClosePortForward(ctx, &authorityv1.ClosePortForwardRequest{ForwardId: args[0]})
			}, func(w io.Writer, r *authorityv1.ClosePortForwardResponse) {
				f := r.GetForward()
				fmt.Fprintf(w, "forward %s closed (%s): %d connection(s), %d byte(s) in, %d byte(s) out\n", termtext.Line(f.GetForwardId()),
					termtext.Line(f.GetCloseReason()), f.GetConnections(), f.GetBytesIn(), f.GetBytesOut())
			})
		},
	}
}

// writePortForwardRequest prints what a port forward approval is about.
func writePortForwardRequest(w io.Writer, a *authorityv1.Approval) {
	f := a.GetPortForward()
	fmt.Fprintf(w, "forward    %s: port %d of session %s, asked by %s\n", termtext.Line(f.GetForwardId()), f.GetPort(),
		termtext.Line(a.GetJobId()), termtext.Line(a.GetRequester()))
	if ttl := f.GetTtl(); ttl != nil {
		fmt.Fprintf(w, "opens for  %v from its approval\n", ttl.AsDuration())
	}
	fmt.Fprintf(w, "digest     %s\n", termtext.Line(a.GetBundleDigest()))
	fmt.Fprintf(w, "reach      from the requester's machine only, through the authority; nothing public\n")
}
