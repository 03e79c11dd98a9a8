package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// A session's calls that reach its executor. Each takes the session the
// caller may reach (Session), does what the authority must before the
// executor sees it (the exec's record and audit entry), calls the
// executor through Executor, and brings the authority's own records up to
// date with what the executor says of execs (observeExecs). When the
// executor cannot answer for a session, the authority's own records
// answer, marked stale.

// SessionView is what the executor says of a session.
type SessionView struct {
	Suspended     bool
	SuspendReason string
	SuspendedAt   time.Time
	// SuspensionUnknown says the executor could not be asked whether the
	// session is suspended (and is not lost, which would suspend it).
	SuspensionUnknown bool
	// Execs are the executor's listing of the session's last execs; when
	// the executor could not answer, Records are the authority's own
	// instead, and Stale says there are some that may be behind.
	Execs   []ExecSeen
	Records []store.Exec
	Total   int64
	Stale   bool
	// Uploads are the executor's records of the client's uploads (none
	// when it could not answer), UploadsTotal how many uploads they
	// stand for.
	Uploads      []Upload
	UploadsTotal int64
}

// SessionState asks the executor about session j (nothing before it was
// dispatched).
func (s *Service) SessionState(ctx context.Context, j store.Job) (SessionView, error) {
	var v SessionView
	if j.DispatchedAt.IsZero() {
		return v, nil
	}
	if !j.State.Terminal() {
		st, err := s.cfg.Executors.For(j.Executor).RunStatus(ctx, j.ID)
		switch {
		case err == nil:
			v.Suspended, v.SuspendReason, v.SuspendedAt = st.Suspended, st.SuspendReason, st.SuspendedAt
		case executorLost(err) && s.lostExecutor(ctx, j.Executor):
			// Its executor is away: the session waits for it, to resume
			// when it returns or end at its deadline.
			v.Suspended, v.SuspendReason = true, lostWord
		default:
			v.SuspensionUnknown = true
		}
	}
	list, err := s.cfg.Executors.For(j.Executor).ListExecs(ctx, j.ID)
	switch {
	case executorLost(err):
		// The executor cannot say: the authority's own records do, maybe
		// behind it.
		own, total, oerr := s.Execs(ctx, j, 1000)
		if oerr != nil {
			return v, oerr
		}
		v.Records, v.Total, v.Stale = own, total, total > 0
	case err != nil:
		return v, err
	default:
		v.Execs, v.Total, v.Uploads, v.UploadsTotal = list.Execs, list.Total, list.Uploads, list.UploadsTotal
		s.observeExecs(ctx, j.ID, list.Execs...)
	}
	return v, nil
}

// suspensionsWait bounds how long Suspensions waits for the executors.
const suspensionsWait = 2 * time.Second

// Suspensions asks the executors which of the running sessions in list
// are suspended (or asleep), all at once and for suspensionsWait at most:
// a session whose executor does not answer in time is left out.
func (s *Service) Suspensions(ctx context.Context, list []store.Job) map[string]RunStatus {
	ctx, cancel := context.WithTimeout(ctx, suspensionsWait)
	defer cancel()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]RunStatus{}
	)
	for _, j := range list {
		if j.State != store.StateRunning || j.DispatchedAt.IsZero() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := s.cfg.Executors.For(j.Executor).RunStatus(ctx, j.ID)
			if err != nil || !st.Suspended {
				return
			}
			mu.Lock()
			out[j.ID] = st
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// runningSession refuses session j unless it is at an executor and not
// ended.
func runningSession(j store.Job) error {
	if j.State.Terminal() {
		return fmt.Errorf("%w: session %q already ended (%s)", errdefs.ErrFailedPrecondition, j.ID, j.State)
	}
	if j.DispatchedAt.IsZero() {
		return fmt.Errorf("%w: session %q has not reached an executor yet", errdefs.ErrFailedPrecondition, j.ID)
	}
	return nil
}

// FinishSession asks the executor to end session j and make its bundle.
func (s *Service) FinishSession(ctx context.Context, j store.Job) error {
	if err := runningSession(j); err != nil {
		return err
	}
	return s.cfg.Executors.For(j.Executor).Finish(ctx, j.ID)
}

// SuspendSession asks the executor to suspend session j.
func (s *Service) SuspendSession(ctx context.Context, j store.Job) error {
	if err := runningSession(j); err != nil {
		return err
	}
	return s.cfg.Executors.For(j.Executor).Suspend(ctx, j.ID)
}

// ResumeSession asks the executor to resume session j, unless its tenant
// is past its monthly budget: a suspended session costs disk only, and
// resuming it is new compute, refused as a new job is
// (errdefs.ErrResourceExhausted). A running session is admitted work: its
// execs are not checked.
func (s *Service) ResumeSession(ctx context.Context, j store.Job) error {
	if err := runningSession(j); err != nil {
		return err
	}
	if s.cfg.Metering != nil {
		if _, err := s.cfg.Metering.Admit(ctx, j.Tenant); err != nil {
			return err
		}
	}
	return s.cfg.Executors.For(j.Executor).Resume(ctx, j.ID)
}

// execRequested checks caller's request to run spec in session j
// (StartExec, RunExec) and records it with its audit entry before it can
// reach the sandbox: one that cannot be recorded, or that reuses an id
// with another spec, is refused here. Whether it starts a new exec or
// names one already started (a retry, even after the session ended) the
// executor decides.
func (s *Service) execRequested(ctx context.Context, caller identity.ID, j store.Job, spec ExecSpec, stdin []byte) error {
	if err := s.CheckExecEnv(ctx, spec.Env); err != nil {
		return err
	}
	if j.DispatchedAt.IsZero() {
		return fmt.Errorf("%w: session %q is %s: it takes execs only once it runs", errdefs.ErrFailedPrecondition, j.ID, j.State)
	}
	if _, _, err := s.RequestExec(ctx, caller, j, spec, stdin); err != nil {
		return err
	}
	return nil
}

// StartExec records caller's request for an exec in session j and starts
// it at the executor.
func (s *Service) StartExec(ctx context.Context, caller identity.ID, j store.Job, spec ExecSpec, stdin []byte) (ExecSeen, bool, error) {
	if err := s.execRequested(ctx, caller, j, spec, stdin); err != nil {
		return ExecSeen{}, false, err
	}
	x, created, err := s.cfg.Executors.For(j.Executor).StartExec(ctx, j.ID, spec, stdin)
	if err != nil {
		return ExecSeen{}, false, err
	}
	s.observeReport(ctx, j.ID, x)
	return x, created, nil
}

// RunExec is StartExec with stdin streamed and the exec's events passed
// to fn as they come (Executor.RunExec).
func (s *Service) RunExec(ctx context.Context, caller identity.ID, j store.Job, start ExecStart, stdin func() (StdinPart, error), fn func(ExecEvent) error) error {
	if err := s.execRequested(ctx, caller, j, start.Spec, start.Stdin); err != nil {
		return err
	}
	return s.cfg.Executors.For(j.Executor).RunExec(ctx, j.ID, start, stdin, s.observing(ctx, j.ID, fn))
}

// ExecView is an exec as the executor reports it, or, when the executor
// cannot answer, as the authority recorded it (Stale).
type ExecView struct {
	Exec   ExecSeen
	Record store.Exec
	Stale  bool
}

// GetExec returns exec execID of session j.
func (s *Service) GetExec(ctx context.Context, j store.Job, execID string) (ExecView, error) {
	x, err := s.cfg.Executors.For(j.Executor).GetExec(ctx, j.ID, execID)
	if executorLost(err) {
		// The authority's own record answers, marked as maybe behind.
		if rec, oerr := s.Exec(ctx, j, execID); oerr == nil {
			return ExecView{Record: rec, Stale: true}, nil
		}
	}
	if err != nil {
		return ExecView{}, err
	}
	s.observeExecs(ctx, j.ID, x)
	return ExecView{Exec: x}, nil
}

// WatchExec passes exec execID's events to fn (Executor.WatchExec).
func (s *Service) WatchExec(ctx context.Context, j store.Job, execID string, from Offsets, fn func(ExecEvent) error) error {
	return s.cfg.Executors.For(j.Executor).WatchExec(ctx, j.ID, execID, from, s.observing(ctx, j.ID, fn))
}

// CancelExec asks the executor to kill exec execID of session j.
func (s *Service) CancelExec(ctx context.Context, j store.Job, execID string) (ExecSeen, error) {
	x, err := s.cfg.Executors.For(j.Executor).CancelExec(ctx, j.ID, execID)
	if err != nil {
		return ExecSeen{}, err
	}
	s.observeExecs(ctx, j.ID, x)
	return x, nil
}

// ReadFile passes a file of session j to fn (Executor.ReadFile).
func (s *Service) ReadFile(ctx context.Context, j store.Job, path string, fn func(FilePart) error) error {
	return s.cfg.Executors.For(j.Executor).ReadFile(ctx, j.ID, path, fn)
}

// WriteFile uploads caller's file into session j (Executor.WriteFile) and
// appends the upload to the audit log.
func (s *Service) WriteFile(ctx context.Context, caller identity.ID, j store.Job, path string, mode uint32, next func() ([]byte, error)) (int64, error) {
	size, err := s.cfg.Executors.For(j.Executor).WriteFile(ctx, j.ID, path, mode, next)
	if err != nil {
		return 0, err
	}
	if err := s.RecordWrite(ctx, caller, j, path, size); err != nil {
		// The file is written; the bundle records it too.
		s.cfg.Logger.ErrorContext(ctx, "audit an upload", "session", j.ID, "error", err)
	}
	return size, nil
}

// ListFiles lists a directory of session j.
func (s *Service) ListFiles(ctx context.Context, j store.Job, path string, recursive bool) ([]FileEntry, bool, error) {
	return s.cfg.Executors.For(j.Executor).ListFiles(ctx, j.ID, path, recursive)
}

// observing is fn after the exec record of each event is observed
// (observeReport). A running exec's record is observed only once it has
// run for startObserveDelay: most execs end sooner, and their end, which
// says all the start would, is recorded instead (one transaction per exec
// rather than two on the exec's way).
func (s *Service) observing(ctx context.Context, sessionID string, fn func(ExecEvent) error) func(ExecEvent) error {
	var pending *time.Timer
	return func(ev ExecEvent) error {
		if ev.Exec != nil {
			if pending != nil {
				pending.Stop()
				pending = nil
			}
			if x := *ev.Exec; !x.Ended {
				pending = time.AfterFunc(startObserveDelay, func() { s.observeExecs(context.WithoutCancel(ctx), sessionID, x) })
			} else {
				s.observeReport(ctx, sessionID, x)
			}
		}
		return fn(ev)
	}
}

// startObserveDelay is how long a streamed exec runs before the authority
// records it running (observing).
const startObserveDelay = 50 * time.Millisecond

// observeReport records one report of an exec on its way to the caller:
// an exec's end before the caller hears of it, so the authority's record
// says it ended before its caller learns it did; an earlier report
// (started, running) beside the answer, so neither the caller's start nor
// the exec's end waits behind that store write. A record never moves back
// (ObserveExec), so a report of the start written after the end changes
// nothing; the write outlives the call, so a caller that breaks off at
// once still leaves the exec recorded as running.
func (s *Service) observeReport(ctx context.Context, sessionID string, x ExecSeen) {
	if x.Ended {
		s.observeExecs(ctx, sessionID, x)
		return
	}
	go s.observeExecs(context.WithoutCancel(ctx), sessionID, x)
}

// observeExecs records what the executor said of a session's execs. The
// caller's answer does not wait on it: a record that could not be brought
// up to date is brought up to date by the next answer.
func (s *Service) observeExecs(ctx context.Context, sessionID string, seen ...ExecSeen) {
	var err error
	if len(seen) == 1 {
		err = s.ObserveExec(ctx, sessionID, seen[0])
	} else {
		err = s.ObserveExecs(ctx, sessionID, seen)
	}
	if err != nil {
		s.cfg.Logger.ErrorContext(ctx, "record what the executor said of execs", "session", sessionID, "error", err)
	}
}

// executorLost reports whether err from the executor means it cannot
// answer for a session (unreachable, or it no longer has the run): the
// authority's own records answer then.
func executorLost(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errdefs.ErrNotFound)
}
