package runs

import (
	"context"
	"fmt"
	"net"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// MaxForwardedConns bounds a session's forwarded connections at once on
// this executor, whatever the authority allows: each holds a goroutine
// pair and a socket into the sandbox.
const MaxForwardedConns = 32

// ForwardPort connects to TCP port inside the running session jobID (on
// its own loopback, as a process of the session would: sandbox.DialPort)
// and runs relay with the connection until it returns. relay's context
// ends when the session stops taking calls (its end, or a suspension);
// relay must return soon then, and the connection is closed on return.
// A live forwarded connection counts as activity for the idle timeout.
// An asleep session is woken first, as for a file call (Wake). A job, a
// session its client suspended, an ended session, a vm session, and a
// session at MaxForwardedConns are refused. Connections run concurrently.
// The executor opens no TCP listening socket for any of it (under runsc,
// only a short-lived Unix listener in a root-only directory: DialPort).
func (m *Manager) ForwardPort(ctx context.Context, jobID string, port int, relay func(ctx context.Context, c net.Conn) error) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("%w: port: %d is not between 1 and 65535", errdefs.ErrInvalidArgument, port)
	}
	m.mu.Lock()
	e, ok := m.runs[jobID]
	switch {
	case !ok:
		m.mu.Unlock()
		return fmt.Errorf("%w: run %q", errdefs.ErrNotFound, jobID)
	case e.run.Grant.Class == sandbox.ClassVM:
		m.mu.Unlock()
		return fmt.Errorf("%w: session %s runs under runtime class vm, whose ports cannot be forwarded yet", errdefs.ErrFailedPrecondition, jobID)
	case e.run.Suspended && !e.wakeable():
		m.mu.Unlock()
		return fmt.Errorf("%w: session %s is suspended: resume it first", errdefs.ErrFailedPrecondition, jobID)
	case e.forwards >= MaxForwardedConns:
		m.mu.Unlock()
		return fmt.Errorf("%w: session %s already carries %d forwarded connections, the most at once", errdefs.ErrResourceExhausted, jobID, MaxForwardedConns)
	}
	e.forwards++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		e.forwards--
		m.mu.Unlock()
	}()
	return m.sessionFiles(ctx, jobID, func(ctx context.Context, sb *sandbox.Sandbox) error {
		c, err := sb.DialPort(ctx, port)
		if err != nil {
			return err
		}
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		return relay(ctx, c)
	})
}
