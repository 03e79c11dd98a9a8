package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// actor is who the authority acts as when it changes job j on its own:
// itself, in the requester's trust domain when it was given no identity.
func (s *Service) actor(j store.Job) string {
	if !s.cfg.Self.IsZero() {
		return s.cfg.Self.String()
	}
	if r, err := identity.Parse(j.Requester); err == nil {
		return identity.Service(r.TrustDomain, identity.ServiceAuthority).String()
	}
	return "service/" + identity.ServiceAuthority
}

// executorName is the fleet name of the executor with SPIFFE ID id.
func executorName(id string) string {
	x, err := identity.Parse(id)
	if err != nil {
		return id
	}
	return fleet.NameOf(x)
}

// needOf is what job j, granted g, asks of an executor.
func needOf(j store.Job, g GrantRequest) fleet.Need {
	n := fleet.Need{Tenant: j.Tenant, Class: g.RuntimeClass, MemoryBytes: g.Limits.MemoryBytes, CPUMillis: g.Limits.CPUMillis,
		DiskBytes: g.Limits.DiskBytes, Source: j.Tenant + "/" + j.Repository}
	if g.Image != nil {
		n.Image = g.Image.Digest
	}
	return n
}

// mustMove says whether queued job j, granted g, must be placed before it
// is handed over — placed nowhere yet, or on an executor that is drained
// or lost while the job was never handed to it — and why, for the log.
func (s *Service) mustMove(j store.Job, g GrantRequest) (bool, string, error) {
	if !j.DispatchedAt.IsZero() {
		return false, "", nil // it may have the job: only its refusal moves it
	}
	if j.Executor == "" || g.Executor != j.Executor {
		return true, "", nil
	}
	// Read now, not from the recent view: a drain another replica
	// recorded a moment ago holds before the job is handed over.
	m, ok, err := s.cfg.Fleet.Current(s.ctx, j.Executor)
	switch {
	case err != nil:
		return false, "", err
	case !ok:
		return true, fmt.Sprintf(" (executor %s left the fleet)", executorName(j.Executor)), nil
	case m.Lost:
		return true, fmt.Sprintf(" (executor %s was lost)", m.Name), nil
	case m.Draining:
		return true, fmt.Sprintf(" (executor %s is drained)", m.Name), nil
	}
	return false, "", nil
}

// unplace takes queued job id off executor, which refused it or was lost
// before the job was handed to it: the next dispatch places it anew.
func (s *Service) unplace(id, executor string) (store.Job, error) {
	return s.update(s.ctx, id, func(j *store.Job) error {
		if j.State != store.StateQueued || j.Executor != executor || j.ClaimedBy != s.cfg.Replica {
			return errUnchanged
		}
		j.Executor, j.DispatchedAt = "", time.Time{}
		return nil
	})
}

// sweep has the fleet mark executors lost and ends or moves their work.
func (s *Service) sweep(ctx context.Context) error {
	lost, err := s.cfg.Fleet.Sweep(ctx, s.cfg.Self)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range lost {
		errs = append(errs, s.leaveLost(ctx, m))
	}
	return errors.Join(errs...)
}

// leaveLost ends or moves the work of lost executor m: a queued job never
// handed to it goes elsewhere; a session waits for it to come back (it
// keeps its disk there) until its deadline; every other job ends
// executor_lost, never run again, as it may have had effects.
func (s *Service) leaveLost(ctx context.Context, m fleet.Member) error {
	jobs, err := s.cfg.Store.JobsOnExecutor(ctx, m.ID, claimBatch)
	if err != nil {
		return err
	}
	var errs []error
	for _, j := range jobs {
		g, gerr := s.grantOf(j)
		switch {
		case j.State == store.StateQueued && j.DispatchedAt.IsZero():
			// Its next dispatch places it elsewhere (mustMove), saying why.
			s.cfg.Fleet.Release(j.ID)
			s.gate.wake()
			if j.ClaimedBy == s.cfg.Replica {
				s.kick(j.ID)
			}
		case gerr == nil && g.Session != nil && s.now().Before(j.CreatedAt.Add(g.Limits.Deadline)):
			// Suspended while its executor is away.
		default:
			why := fmt.Sprintf(lostWord+": executor %s stopped answering (last heard from at %s); the job may have had effects, so it is not run again",
				m.Name, m.LastSeen.Format(time.RFC3339))
			if gerr == nil && g.Session != nil {
				why = fmt.Sprintf(lostWord+": executor %s stopped answering (last heard from at %s) and the session's deadline passed before it came back",
					m.Name, m.LastSeen.Format(time.RFC3339))
			}
			if _, err := s.endLost(ctx, j.ID, m.ID, why); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// endLost ends job id, placed on lost executor, as executor_lost, on the
// log.
func (s *Service) endLost(ctx context.Context, id, executor, why string) (store.Job, error) {
	j, err := s.updateAudited(ctx, id, func(j *store.Job) error {
		if j.State.Terminal() || j.Executor != executor {
			return errUnchanged
		}
		j.State, j.Message, j.Result = store.StateFailed, why, s.cfg.LostResult
		if j.NetworkState == "pending" {
			j.NetworkState = "failed"
		}
		return nil
	}, func(j *store.Job) audit.Event {
		return audit.Event{Kind: audit.KindJobExecutorLost, Caller: s.actor(*j), Subject: j.ID, Outcome: audit.OutcomeAllowed, Reason: why}
	})
	if err == nil && j.State == store.StateFailed && j.Executor == executor {
		s.gate.release(id)
		// It may only be this authority that cannot hear the executor:
		// it is told to stop the run now if it can be reached, and by its
		// heartbeat's answer when it returns.
		s.background(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := s.cfg.Executors.For(executor).Cancel(ctx, id, why); err != nil {
				s.cfg.Logger.Debug("cancel a run on a lost executor", "job", id, "error", err)
			}
		})
	}
	return j, err
}

// background runs fn on its own for the Service's life (not started once
// the Service is stopping).
func (s *Service) background(fn func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn(s.ctx)
	}()
}

// lostWord is the suspension reason of a session whose executor
// is lost, and the ending of a job that executor ran.
const lostWord = "executor_lost"

// executorRestarted is the executor's suspension reason for a
// session it found again when it started.
const executorRestarted = "executor_restarted"

// ExecutorReturned resumes, in the background, the sessions placed on
// executor id (a SPIFFE ID) that it suspended because it restarted while
// it was lost: it is back, and their clients find them running again.
func (s *Service) ExecutorReturned(id string) {
	s.background(func(ctx context.Context) {
		jobs, err := s.cfg.Store.JobsOnExecutor(ctx, id, claimBatch, store.StateStaging, store.StateRunning)
		if err != nil {
			s.cfg.Logger.Warn("sessions of a returned executor", "executor", id, "error", err)
			return
		}
		ex := s.cfg.Executors.For(id)
		for _, j := range jobs {
			if g, err := s.grantOf(j); err != nil || g.Session == nil {
				continue
			}
			st, err := ex.RunStatus(ctx, j.ID)
			if err != nil || !st.Suspended || st.SuspendReason != executorRestarted {
				continue
			}
			if err := ex.Resume(ctx, j.ID); err != nil {
				s.cfg.Logger.Warn("resume a session on its returned executor", "job", j.ID, "executor", id, "error", err)
				continue
			}
			s.cfg.Logger.Info("session resumed on its returned executor", "job", j.ID, "executor", executorName(id))
		}
	})
}

// OpenArtifact streams the result bundle of job jobID named by digest from
// the executor the job ran on (approvals.Artifacts).
func (s *Service) OpenArtifact(ctx context.Context, jobID, digest string) (io.ReadCloser, error) {
	j, err := s.cfg.Store.GetJob(ctx, jobID)
	if err != nil {
		return nil, err
	}
	return s.cfg.Executors.For(j.Executor).OpenArtifact(ctx, jobID, digest)
}

// ExecutorOf says which executor job jobID ran on (its SPIFFE ID) and where
// it is reached now ("" when the fleet does not know it or lost it): where
// the publisher fetches the job's bundle.
func (s *Service) ExecutorOf(ctx context.Context, jobID string) (id, address string, err error) {
	j, err := s.cfg.Store.GetJob(ctx, jobID)
	if err != nil {
		return "", "", err
	}
	if j.Executor == "" {
		return "", "", nil
	}
	m, ok, err := s.cfg.Fleet.Lookup(ctx, j.Executor)
	if err != nil || !ok || m.Lost {
		return j.Executor, "", err
	}
	return j.Executor, m.Address, nil
}

// place asks the fleet for an executor for job j, granted g, and counts
// the decision.
func (s *Service) place(ctx context.Context, j store.Job, g GrantRequest) (fleet.Member, string, error) {
	start := time.Now()
	m, why, err := s.cfg.Fleet.Place(ctx, j.ID, needOf(j, g))
	outcome := placePlaced
	switch {
	case err != nil:
		outcome = placeFailed
	case m.ID == "":
		outcome = placeNone
	}
	s.metrics.placed(outcome, time.Since(start))
	return m, why, err
}

// lostExecutor says whether the fleet has lost executor id.
func (s *Service) lostExecutor(ctx context.Context, id string) bool {
	m, ok, err := s.cfg.Fleet.Lookup(ctx, id)
	return err == nil && ok && m.Lost
}

// freePlacement frees job id's room at its executor in the fleet's
// accounting once the job has ended (a drive that stops for another
// reason — another replica drives it now — frees nothing).
func (s *Service) freePlacement(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, err := s.cfg.Store.GetJob(ctx, id)
	if err != nil || !j.State.Terminal() {
		return
	}
	if j.Executor == "" {
		s.cfg.Fleet.Release(id)
		return
	}
	if g, err := s.grantOf(j); err == nil {
		s.cfg.Fleet.Ended(j.ID, j.Executor, needOf(j, g))
	}
}
