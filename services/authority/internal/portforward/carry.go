package portforward

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/tunnel"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Carry carries one connection of caller's forward id: it checks the
// forward (only its requester, only while it is OPEN and unexpired, only
// while its session runs), has the session's executor connect to the
// port, calls connected, and then joins client to it until either side
// ends, the forward closes (here: at once; through another replica:
// within CheckEvery) or expires. The bytes each way are added to the
// record every FlushEvery and at the end, and the connection is audited
// with them.
func (s *Service) Carry(ctx context.Context, caller identity.ID, id string, connected func() error, client tunnel.End) error {
	f, j, err := s.checkCarry(ctx, caller, id)
	if err != nil {
		return s.refused(ctx, caller, id, f.Tenant, err)
	}
	ctx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	lc := &liveConn{cut: cut, done: make(chan struct{})}
	s.track(id, lc, true)
	defer s.track(id, lc, false)
	defer func() {
		select {
		case <-lc.done:
		default:
			close(lc.done)
		}
	}()

	service, err := s.cfg.Sessions.ForwardPort(ctx, j, f.Port, f.ID)
	if err != nil {
		if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
			err = c
		}
		return s.failedConn(ctx, caller, f, "the executor did not connect", err)
	}
	started := s.now()
	if err := connected(); err != nil {
		return s.failedConn(ctx, caller, f, "the client was not told it is connected", err)
	}
	// Counted once carried: a refused or failed connection is audited
	// (failedConn), not counted.
	if err := s.cfg.Store.AddForwardTraffic(ctx, id, 1, 0, 0); err != nil {
		s.cfg.Logger.ErrorContext(ctx, "count a forwarded connection", "forward", id, "error", err)
	}
	var in, out, flushedIn, flushedOut atomic.Int64
	flush := func(ctx context.Context) {
		i, o := in.Load(), out.Load()
		di, do := i-flushedIn.Load(), o-flushedOut.Load()
		if di == 0 && do == 0 {
			return
		}
		if err := s.cfg.Store.AddForwardTraffic(ctx, id, 0, di, do); err != nil {
			s.cfg.Logger.ErrorContext(ctx, "count a forward's bytes", "forward", id, "error", err)
			return
		}
		flushedIn.Store(i)
		flushedOut.Store(o)
	}
	watched := make(chan struct{})
	var expired bool
	go func() {
		defer close(watched)
		expired = s.watch(ctx, f, cut, flush)
	}()
	joinErr := tunnel.Join(client, service, &in, &out, func() { cut(nil) })
	cause := context.Cause(ctx)
	cut(nil)
	<-watched
	// The last bytes are counted whatever ended the connection, even the
	// caller's own cancellation.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	flush(fctx)
	if _, err := s.cfg.Store.AppendAudit(fctx, audit.Event{Kind: audit.KindForwardConnection, Caller: caller.String(), Subject: id,
		Tenant: f.Tenant, JobID: f.SessionID, Time: s.now(), Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("a connection to port %d of session %s: %d byte(s) in, %d byte(s) out over %v",
			f.Port, f.SessionID, in.Load(), out.Load(), s.now().Sub(started).Round(time.Millisecond))}); err != nil {
		s.cfg.Logger.ErrorContext(fctx, "audit a forwarded connection", "forward", id, "error", err)
	}
	close(lc.done)
	if expired {
		if _, err := s.closeForward(fctx, s.self(), f.ID, "expired"); err != nil {
			s.cfg.Logger.ErrorContext(fctx, "close an expired forward", "forward", f.ID, "error", err)
		}
	}
	if cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return joinErr
}

// checkCarry finds forward id and its running session for caller.
func (s *Service) checkCarry(ctx context.Context, caller identity.ID, id string) (store.PortForward, store.Job, error) {
	if id == "" {
		return store.PortForward{}, store.Job{}, invalid("forward_id", "required")
	}
	f, err := s.cfg.Store.GetPortForward(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && (caller.Kind != identity.KindClient || !s.readsTenant(caller, f.Tenant))) {
		return store.PortForward{}, store.Job{}, notFound(id)
	}
	if err != nil {
		return store.PortForward{}, store.Job{}, err
	}
	if f.Requester != caller.String() {
		return f, store.Job{}, denied("port forward %s was opened by %s: only it carries connections", id, f.Requester)
	}
	if f, err = s.resolve(ctx, f); err != nil {
		return f, store.Job{}, err
	}
	if why := s.policyRefusal(f.Tenant, f.Port); why != "" {
		_, err := s.closeForward(ctx, s.self(), id, why)
		return f, store.Job{}, errors.Join(denied("port forward %s: tenant %q's %s", id, f.Tenant, why), err)
	}
	switch {
	case f.State == store.ForwardPending:
		return f, store.Job{}, precondition("port forward %s is pending: its approval %s is not decided yet", id, f.ApprovalID)
	case f.State == store.ForwardClosed:
		return f, store.Job{}, precondition("port forward %s is closed: %s", id, f.CloseReason)
	case !s.now().Before(f.ExpiresAt):
		_, err := s.closeForward(ctx, s.self(), id, "expired")
		return f, store.Job{}, errors.Join(precondition("port forward %s expired at %s", id, f.ExpiresAt.Format(time.RFC3339)), err)
	}
	j, err := s.cfg.Store.GetJob(ctx, f.SessionID)
	if err != nil {
		return f, store.Job{}, err
	}
	if j.State != store.StateRunning {
		_, err := s.closeForward(ctx, s.self(), id, "session ended")
		return f, store.Job{}, errors.Join(precondition("session %s is %s: its forwards are closed", j.ID, j.State), err)
	}
	return f, j, nil
}

// watch reads forward f again every CheckEvery until ctx ends, cutting
// the connection once the forward is closed (through any replica) or
// expired (then it reports true: the caller closes it once this
// connection is flushed), and flushes the bytes every FlushEvery.
func (s *Service) watch(ctx context.Context, f store.PortForward, cut context.CancelCauseFunc, flush func(context.Context)) bool {
	check := time.NewTicker(s.cfg.CheckEvery)
	defer check.Stop()
	lastFlush := time.Now()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-check.C:
		}
		if time.Since(lastFlush) >= s.cfg.FlushEvery {
			flush(ctx)
			lastFlush = time.Now()
		}
		cur, err := s.cfg.Store.GetPortForward(ctx, f.ID)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				s.cfg.Logger.WarnContext(ctx, "read a forward again", "forward", f.ID, "error", err)
			}
		case cur.State == store.ForwardClosed:
			cut(precondition("port forward %s was closed: %s", f.ID, cur.CloseReason))
			return false
		case !s.now().Before(cur.ExpiresAt):
			cut(precondition("port forward %s expired at %s", f.ID, cur.ExpiresAt.Format(time.RFC3339)))
			return true
		}
	}
}

// failedConn audits a connection of forward f that failed before it was
// carried (why, err) and returns err.
func (s *Service) failedConn(ctx context.Context, caller identity.ID, f store.PortForward, why string, err error) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, aerr := s.cfg.Store.AppendAudit(actx, audit.Event{Kind: audit.KindForwardConnection, Caller: caller.String(), Subject: f.ID,
		Tenant: f.Tenant, JobID: f.SessionID, Time: s.now(), Outcome: audit.OutcomeDenied,
		Reason: fmt.Sprintf("a connection to port %d of session %s failed: %s: %v", f.Port, f.SessionID, why, err)}); aerr != nil {
		s.cfg.Logger.ErrorContext(actx, "audit a failed forwarded connection", "forward", f.ID, "error", aerr)
	}
	return err
}

// track adds (or removes) a live connection of forward id.
func (s *Service) track(id string, c *liveConn, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.live[id] == nil {
			s.live[id] = map[*liveConn]struct{}{}
		}
		s.live[id][c] = struct{}{}
		return
	}
	delete(s.live[id], c)
	if len(s.live[id]) == 0 {
		delete(s.live, id)
	}
}
