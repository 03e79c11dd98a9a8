package jobs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// startTimeout bounds one StartJob attempt.
const startTimeout = 30 * time.Second

// kick makes sure one goroutine drives job id until it needs nothing more
// from the executor.
func (s *Service) kick(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	if _, driven := s.active[id]; driven {
		// Driven already: once more after, in case the goroutine has
		// just decided it is done.
		s.active[id] = true
		return
	}
	s.active[id] = false
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			s.driveOnce(id)
			s.mu.Lock()
			again := s.active[id] && s.ctx.Err() == nil
			if !again {
				delete(s.active, id)
				delete(s.traces, id)
			} else {
				s.active[id] = false
			}
			s.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// driveOnce drives job id, then frees whatever the job held at the gate
// and in placement once nothing more is asked of the executor for it: its
// run ended, or the job did.
func (s *Service) driveOnce(id string) {
	defer s.gate.release(id)
	defer s.freePlacement(id)
	s.drive(id)
}

// drive takes a job from queued through the executor's acceptance and
// follows its run until the run's stream ends. Transient failures (the
// executor or the store unreachable) are retried with back-off; the job's
// terminal state comes from ReportResult, not from here.
func (s *Service) drive(id string) {
	log := s.cfg.Logger.With("job", id)
	wait := s.cfg.Retry.Min
	for s.ctx.Err() == nil {
		j, err := s.cfg.Store.GetJob(s.ctx, id)
		var done bool
		if err == nil && j.ClaimedBy != s.cfg.Replica && !j.State.Terminal() {
			// Another replica holds the job now (this one's claim lapsed):
			// it drives it.
			log.Info("job claimed by another replica", "replica", j.ClaimedBy)
			return
		}
		if err == nil {
			switch j.State {
			case store.StateQueued:
				done, err = s.dispatch(j)
			case store.StateStaging, store.StateRunning:
				done, err = s.follow(j)
			default:
				done = true
			}
		}
		if done && err == nil {
			return
		}
		if err == nil {
			wait = s.cfg.Retry.Min
			continue
		}
		if s.ctx.Err() != nil {
			return
		}
		log.Warn("executor not reachable; retrying", "error", err, "in", wait)
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, s.cfg.Retry.Max)
	}
}

// retryable reports whether an executor error may go away by itself.
func retryable(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrResourceExhausted) ||
		errors.Is(err, context.DeadlineExceeded)
}

// dispatch hands the job's grant to the executor. It returns done when the
// job needs no more driving, and an error when the attempt should be
// retried.
func (s *Service) dispatch(j store.Job) (done bool, err error) {
	g, err := s.grantOf(j)
	if err != nil {
		return false, fmt.Errorf("jobs: decode the grant of job %s: %w", j.ID, err)
	}
	// A job waiting for its start approval is never placed, and its start
	// deadline counts from the approval: only the approval's own expiry
	// ends its wait.
	ok, from, done, err := s.startGate(j, g)
	if !ok {
		return done, err
	}
	if !s.now().Before(j.GrantExpiresAt) && !s.now().Before(from.Add(s.startDeadline(j))) {
		since := "submission"
		if !from.Equal(j.CreatedAt) {
			since = "its start approval"
		}
		_, err := s.transition(j.ID, []store.State{store.StateQueued}, store.StateFailed,
			fmt.Sprintf("no executor accepted the job within its tenant's start deadline (%v after %s)", s.startDeadline(j), since))
		return true, err
	}
	need := useOf(g.Limits)
	if ok, why := s.gate.enter(j.ID, j.Tenant, need, gateWait); !ok {
		if why == "" {
			return false, nil // withdrawn: read the job again
		}
		return false, s.noteWaiting(j.ID, why)
	}
	defer s.gate.tried(j.ID)
	if leaving, why, err := s.mustMove(j, g); err != nil {
		return false, err
	} else if leaving {
		// Placed nowhere yet, or on an executor it must leave before it
		// was ever handed over (drained, lost, or full when it asked): a
		// place now, with the same decision signed for it — if the
		// tenant's policy in force still allows it.
		if why := s.stillAllowed(j); why != "" {
			_, err := s.transition(j.ID, []store.State{store.StateQueued}, store.StateFailed,
				"it waited for an executor, and the tenant's policy no longer allows it: "+why)
			return true, err
		}
		m, full, err := s.place(s.ctx, j, g)
		if err != nil {
			return false, err
		}
		if m.ID == "" {
			s.gate.refused(j.ID, j.Tenant, need, s.cfg.Retry.Max)
			return false, s.noteWaiting(j.ID, full)
		}
		id := j.ID
		if j, err = s.regrant(j, m, why); err != nil || j.State != store.StateQueued || j.Executor != m.ID {
			s.cfg.Fleet.Release(id)
			return false, err
		}
	} else if !s.now().Before(j.GrantExpiresAt) {
		// The grant expired while the job waited, or while the executor
		// was out of reach: the same decision, signed again — if the
		// tenant's policy in force still allows it — right before it is
		// handed over (a job waiting at the gate is not granted again
		// and again). An executor that did accept the old grant answers
		// a new one with the run it has, so the job still runs once.
		if why := s.stillAllowed(j); why != "" {
			_, err := s.transition(j.ID, []store.State{store.StateQueued}, store.StateFailed,
				"its grant expired before an executor accepted it, and the tenant's policy no longer allows it: "+why)
			return true, err
		}
		if j, err = s.regrant(j, fleet.Member{}, ""); err != nil {
			return false, err
		}
		if j.State != store.StateQueued {
			return false, nil
		}
	}
	// first says this is the first StartJob the job ever gets: the only
	// one whose "no room" proves the executor does not have the job (a
	// later one may answer while an earlier attempt, timed out here, is
	// still on its way there).
	first := j.DispatchedAt.IsZero()
	if first {
		// Recorded before the first attempt, so a cancel knows the executor
		// may have the job, FetchSource knows it was sent, and the job is
		// never placed elsewhere unless this attempt is refused for room.
		// Only this replica's claim, on the executor and grant it read,
		// records it: a replica that lost the claim hands nothing over.
		placed, grant := j.Executor, string(j.Grant)
		j, err = s.update(s.ctx, j.ID, func(j *store.Job) error {
			if j.State != store.StateQueued || j.ClaimedBy != s.cfg.Replica || j.Executor != placed || string(j.Grant) != grant || !j.DispatchedAt.IsZero() {
				return errUnchanged
			}
			j.DispatchedAt = s.now()
			return nil
		})
		if err != nil {
			return false, err
		}
		if j.State != store.StateQueued || j.ClaimedBy != s.cfg.Replica || j.Executor != placed || string(j.Grant) != grant {
			return false, nil // read the job again
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx, startTimeout)
	defer cancel()
	s.mu.Lock()
	sc := s.traces[j.ID]
	s.mu.Unlock()
	ctx, span := tracer.Start(trace.ContextWithSpanContext(ctx, sc), "jobs.dispatch")
	state, err := s.cfg.Executors.For(j.Executor).Start(ctx, j.Grant)
	span.End()
	switch {
	case err != nil && s.ctx.Err() != nil:
		return true, nil
	case err != nil && errors.Is(err, errdefs.ErrResourceExhausted):
		// The executor is full. After the job's first attempt it surely
		// does not have the job, which may go to another executor now;
		// after a later one it waits for this executor. Either way it
		// waits at the gate, first in line, and nobody asks again before a
		// job ends or Retry.Max passes.
		name := executorName(j.Executor)
		s.cfg.Fleet.Full(name)
		if first {
			s.cfg.Fleet.Release(j.ID)
			if _, uerr := s.unplace(j.ID, j.Executor); uerr != nil {
				return false, uerr
			}
		}
		s.gate.refused(j.ID, j.Tenant, need, s.cfg.Retry.Max)
		s.cfg.Logger.Debug("executor full", "job", j.ID, "executor", name, "error", err)
		return false, s.noteWaiting(j.ID, fmt.Sprintf("executor %s has no capacity for it yet (it asks %s of memory and %d millicores)",
			name, config.FormatByteSize(need.memory), need.cpu))
	case err != nil && retryable(err):
		return false, err
	case err != nil && !s.now().Before(j.GrantExpiresAt):
		// The grant expired on its way (a slow link, a short TTL): the
		// next attempt grants the same decision again, or fails the job
		// past its start deadline.
		return false, err
	case err != nil:
		_, terr := s.transition(j.ID, []store.State{store.StateQueued}, store.StateFailed, "the executor refused the job: "+err.Error())
		return true, terr
	}
	s.cfg.Logger.Info("job dispatched", "job", j.ID, "executor", executorName(j.Executor), "run_state", int(state))
	s.metrics.handover.Record(context.Background(), s.now().Sub(j.CreatedAt).Seconds())
	next := store.StateStaging
	if state == RunRunning {
		next = store.StateRunning
	}
	cur, err := s.update(s.ctx, j.ID, func(j *store.Job) error {
		if j.State != store.StateQueued {
			return errUnchanged
		}
		j.State = next
		if strings.HasPrefix(j.Message, waitingPrefix) {
			j.Message = ""
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if cur.State == store.StateCancelled {
		// Cancelled while the StartJob was in flight: stop what started.
		if err := s.cfg.Executors.For(j.Executor).Cancel(s.ctx, j.ID, cur.Message); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.cfg.Logger.Warn("cancel after a raced dispatch", "job", j.ID, "error", err)
		}
		return true, nil
	}
	return false, nil
}

// gateWait is how long one wait at the gate lasts before the job is read
// again (for its start deadline; a cancel withdraws it at once).
const gateWait = 5 * time.Second

// waitingPrefix starts the message of a job waiting at the gate.
const waitingPrefix = "waiting: "

// noteWaiting says on the queued job why it waits, when that changed.
func (s *Service) noteWaiting(id, why string) error {
	_, err := s.update(s.ctx, id, func(j *store.Job) error {
		msg := waitingPrefix + why
		if j.State != store.StateQueued || j.Message == msg {
			return errUnchanged
		}
		j.Message = msg
		return nil
	})
	return err
}

// follow watches the run and moves the job to staging and running as the
// executor reports them. It is done when the run's stream ends.
func (s *Service) follow(j store.Job) (done bool, err error) {
	// A run the executor has holds its share at the gate (after a restart
	// too), until the drive ends.
	if g, err := s.grantOf(j); err == nil {
		s.gate.hold(j.ID, j.Tenant, useOf(g.Limits))
	}
	// Offsets past any output: the follower wants states, not the job's
	// output, which watching clients fetch for themselves.
	err = s.cfg.Executors.For(j.Executor).Watch(s.ctx, j.ID, Offsets{Stdout: math.MaxInt64, Stderr: math.MaxInt64}, func(ev RunEvent) error {
		if ev.Output != nil {
			return nil
		}
		var to store.State
		switch ev.State {
		case RunStaging:
			to = store.StateStaging
		case RunRunning:
			to = store.StateRunning
		}
		_, err := s.update(s.ctx, j.ID, func(j *store.Job) error {
			changed := false
			if to != "" && advances(j.State, to) {
				j.State, changed = to, true
			}
			if ev.NetworkState != "" && ev.NetworkState != j.NetworkState && !j.State.Terminal() && s.current(j, ev.GrantGeneration) {
				j.NetworkState, changed = ev.NetworkState, true
			}
			if !changed {
				return errUnchanged
			}
			return nil
		})
		return err
	})
	switch {
	case err == nil:
		// The run ended: its room on the executor is free.
		if g, gerr := s.grantOf(j); gerr == nil {
			s.cfg.Fleet.Ended(j.ID, j.Executor, needOf(j, g))
		}
		return true, nil
	case s.ctx.Err() != nil:
		return true, nil
	case errors.Is(err, errdefs.ErrNotFound):
		_, terr := s.transition(j.ID, []store.State{store.StateQueued, store.StateStaging, store.StateRunning}, store.StateFailed,
			"the executor has no run for this job (it may have lost it in a restart)")
		return true, terr
	}
	return false, err
}

// current reports whether a state the executor reported for its grant of
// generation gen is about the job's grant in force, not an older one a
// pending change is replacing: "applied" means the whole grant (limits and
// network policy) is in force.
func (s *Service) current(j *store.Job, gen int64) bool {
	g, err := s.grantOf(*j)
	return err != nil || gen >= g.Generation
}

// advances reports whether to is a step forward from from.
func advances(from, to store.State) bool {
	rank := map[store.State]int{store.StateQueued: 0, store.StateStaging: 1, store.StateRunning: 2}
	f, okf := rank[from]
	t, okt := rank[to]
	return okf && okt && t > f
}

// transition moves the job to state to if it is in one of from, with
// message (kept when empty). It returns the job as it now is, whether or
// not it moved.
func (s *Service) transition(id string, from []store.State, to store.State, message string) (store.Job, error) {
	j, err := s.update(s.ctx, id, func(j *store.Job) error {
		for _, f := range from {
			if j.State == f {
				j.State = to
				if message != "" {
					j.Message = message
				}
				if to == store.StateFailed && j.NetworkState == "pending" {
					j.NetworkState = "failed"
				}
				return nil
			}
		}
		return errUnchanged
	})
	if err != nil {
		return store.Job{}, fmt.Errorf("jobs: %s → %s: %w", id, to, err)
	}
	return j, nil
}

// stillAllowed says why the tenant's policy in force would no longer grant
// job j's decision ("" when it would): the tenant, the repository, the
// runtime class, the limits against the ceilings and the quota, the
// network policy against the egress allowed, and the brokered credentials.
func (s *Service) stillAllowed(j store.Job) string {
	t := s.cfg.Tenants[j.Tenant]
	if t == nil {
		return fmt.Sprintf("tenant %q is no longer configured", j.Tenant)
	}
	if r, err := identity.Parse(j.Requester); err != nil || !t.HasClient(r.Principal()) {
		return fmt.Sprintf("%s no longer acts for tenant %s", j.Requester, j.Tenant)
	}
	g, err := s.grantOf(j)
	if err != nil {
		return "its grant cannot be read: " + err.Error()
	}
	if _, ok := t.Repositories[g.Repository]; !ok {
		return fmt.Sprintf("repository %q is no longer the tenant's", g.Repository)
	}
	if !slices.Contains(t.RuntimeClasses, g.RuntimeClass) {
		return fmt.Sprintf("runtime class %s is no longer allowed", g.RuntimeClass)
	}
	if _, err := effectiveLimits("limits", g.Limits, t.Default, t.Max); err != nil {
		return withoutKind(err)
	}
	if err := withinQuota("limits", t, g.Limits); err != nil {
		return withoutKind(err)
	}
	if _, err := checkNetwork(t, "network_policy", g.Network); err != nil {
		return withoutKind(err)
	}
	if _, err := checkCredentials(t, g.Credentials, g.RuntimeClass, g.Network); err != nil {
		return withoutKind(err)
	}
	return ""
}

// withoutKind is a refusal's text without the errdefs kind before it.
func withoutKind(err error) string {
	msg := err.Error()
	for _, k := range []error{errdefs.ErrInvalidArgument, errdefs.ErrPermissionDenied} {
		msg = strings.TrimPrefix(msg, k.Error()+": ")
	}
	return msg
}

// regrant replaces a queued job's grant with a fresh one for the same
// decision (limits, policy, everything but the times), on the log: for
// executor m when m is set (the job is placed there, why saying why it
// moved, if it did), else for the executor it names.
func (s *Service) regrant(j store.Job, m fleet.Member, why string) (store.Job, error) {
	req, err := s.grantOf(j)
	if err != nil {
		return store.Job{}, fmt.Errorf("jobs: decode the grant of job %s: %w", j.ID, err)
	}
	now := s.now()
	req.IssuedAt, req.ExpiresAt = now, now.Add(s.cfg.GrantTTL)
	if m.ID != "" {
		req.Executor = m.ID
	}
	g, err := s.cfg.Signer.Sign(req)
	if err != nil {
		return store.Job{}, fmt.Errorf("jobs: sign grant: %w", err)
	}
	return s.updateAudited(s.ctx, j.ID, func(cur *store.Job) error {
		if cur.State != store.StateQueued || string(cur.Grant) != string(j.Grant) || cur.Executor != j.Executor {
			return errUnchanged // dispatched, ended, placed or granted anew meanwhile
		}
		if m.ID != "" && (!cur.DispatchedAt.IsZero() || cur.ClaimedBy != s.cfg.Replica) {
			// Handed to its executor meanwhile (which may have it), or
			// another replica drives it now: never moved.
			return errUnchanged
		}
		cur.Grant, cur.GrantExpiresAt, cur.Executor = g.Wire, req.ExpiresAt, req.Executor
		if m.ID != "" {
			cur.DispatchedAt = time.Time{}
		}
		return nil
	}, func(cur *store.Job) audit.Event {
		if m.ID != "" {
			return audit.Event{Kind: audit.KindJobPlaced, Caller: s.actor(*cur), Subject: cur.ID, Outcome: audit.OutcomeAllowed,
				Reason: fmt.Sprintf("placed on executor %s%s; the same decision, granted for it until %s", m.Name, why, req.ExpiresAt.Format(time.RFC3339))}
		}
		return audit.Event{Kind: audit.KindJobRegranted, Caller: s.actor(*cur), Subject: cur.ID, Outcome: audit.OutcomeAllowed,
			Reason: fmt.Sprintf("no executor accepted the grant before it expired; the same decision, granted again until %s (start deadline %s)",
				req.ExpiresAt.Format(time.RFC3339), cur.CreatedAt.Add(s.startDeadline(*cur)).Format(time.RFC3339))}
	})
}
