package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// cancelRequested starts the message of a job the executor was asked to
// cancel; the rest says who asked and why, until the result's outcome
// takes it over.
const cancelRequested = "cancel requested: "

// Cancel stops a job. A queued job is cancelled here and never dispatched;
// a job the executor holds is cancelled there, and its final state arrives
// with its result.
func (s *Service) Cancel(ctx context.Context, caller identity.ID, id, reason string) (store.Job, error) {
	if _, err := s.visible(ctx, caller, id); err != nil {
		return store.Job{}, err
	}
	if len(reason) > 1024 {
		return store.Job{}, fmt.Errorf("%w: reason: at most 1024 bytes", errdefs.ErrInvalidArgument)
	}
	who := "cancelled by " + caller.Principal()
	if reason != "" {
		who += ": " + reason
	}
	var atExecutor, wasQueued bool
	j, err := s.updateAudited(ctx, id, func(j *store.Job) error {
		switch {
		case j.State == store.StateCancelled:
			return errUnchanged
		case j.State.Terminal():
			return fmt.Errorf("%w: job %q already ended (%s)", errdefs.ErrFailedPrecondition, id, j.State)
		case j.State == store.StateQueued:
			j.State, j.Message = store.StateCancelled, who
			// A StartJob may already be on its way; make sure it is undone.
			atExecutor, wasQueued = !j.DispatchedAt.IsZero(), true
		default:
			j.Message = cancelRequested + who
			atExecutor = true
		}
		return nil
	}, func(j *store.Job) audit.Event {
		return audit.Event{Kind: audit.KindJobCancelled, Caller: caller.String(), Subject: j.ID, Outcome: audit.OutcomeAllowed, Reason: j.Message}
	})
	if err == nil && wasQueued {
		s.gate.withdraw(id) // no longer waits for its turn
	}
	if err != nil || !atExecutor {
		return j, err
	}
	err = s.cfg.Executors.For(j.Executor).Cancel(ctx, id, reason)
	switch {
	case err == nil:
		return j, nil
	case wasQueued:
		s.cfg.Logger.Debug("cancel of a queued job at the executor", "job", id, "error", err)
		return j, nil
	case errors.Is(err, errdefs.ErrNotFound):
		// The executor has no run to stop; nothing else would ever end the job.
		return s.update(ctx, id, func(j *store.Job) error {
			if j.State.Terminal() {
				return errUnchanged
			}
			j.State, j.Message = store.StateCancelled, who+" (the executor had no run for it)"
			return nil
		})
	case s.lostExecutor(ctx, j.Executor):
		// Its executor is lost: the job ends here, and the executor is
		// told to stop the run when it comes back (its heartbeat's answer).
		return s.update(ctx, id, func(j *store.Job) error {
			if j.State.Terminal() {
				return errUnchanged
			}
			j.State, j.Message = store.StateCancelled, who+fmt.Sprintf(" (its executor %s is lost; the run is stopped if it comes back)", executorName(j.Executor))
			return nil
		})
	default:
		return store.Job{}, fmt.Errorf("%w: the executor could not be reached to cancel the job; try again", errdefs.ErrUnavailable)
	}
}
