package jobs

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Taking a run's result from the executor.

// Reason says why a run ended.
type Reason int

const (
	ReasonUnspecified Reason = iota
	ReasonExited
	ReasonTimeout
	ReasonOOM
	ReasonDiskFull
	ReasonCancelled
	ReasonExecutorRestarted
	ReasonSandboxError
	// A session's: its client finished it, or it sat idle too long.
	ReasonFinished
	ReasonIdleTimeout
)

// Report is what the executor reports when a run ends.
type Report struct {
	Reason       Reason
	ExitCode     int32
	BundleDigest string
	// Message is the executor's detail, for SANDBOX_ERROR and the like.
	Message string
	// Result is the serialized RunResult, stored as is.
	Result []byte
	// Patch is the patch's first bytes, for reviewers.
	Patch []byte
	// Review is the serialized ReviewDetail (file list, patch size, output
	// tails), stored as is; nil when the executor sent none, which is
	// refused for a result with a bundle.
	Review     []byte
	Provenance []byte
	// Execs are a session's execs as the report lists them (the first and
	// the last, when not all fit): the authority's records take their
	// final state from them.
	Execs []ExecSeen
}

// outcome maps a report to the job's final state and a message for people.
// prior is the job's message until then: for a cancel, who asked for it.
func (r Report) outcome(prior string) (store.State, string) {
	detail := func(s string) string {
		if r.Message != "" {
			return s + ": " + r.Message
		}
		return s
	}
	switch r.Reason {
	case ReasonExited:
		return store.StateFinished, fmt.Sprintf("exited with status %d", r.ExitCode)
	case ReasonTimeout:
		return store.StateFinished, "the deadline passed and the process tree was killed"
	case ReasonOOM:
		return store.StateFinished, "the memory limit was hit and the kernel killed the job"
	case ReasonDiskFull:
		return store.StateFinished, detail("the disk limit was reached")
	case ReasonCancelled:
		// The state already says cancelled: the message says who asked
		// and what the executor did, each once.
		who, ok := strings.CutPrefix(prior, cancelRequested)
		if !ok {
			who = "cancelled"
		}
		if r.Message != "" {
			who += "; " + r.Message
		}
		return store.StateCancelled, who
	case ReasonExecutorRestarted:
		return store.StateFailed, detail("the executor restarted while the job was in flight")
	case ReasonFinished:
		return store.StateFinished, "the client finished the session"
	case ReasonIdleTimeout:
		return store.StateFinished, "the session had no exec running for longer than its idle timeout"
	default:
		return store.StateFailed, detail("the sandbox could not be set up or the runtime failed")
	}
}

// ReportResult records a run's outcome. The same report again (same bundle
// digest) changes nothing; a different one for a job that already has a
// result is refused.
func (s *Service) ReportResult(ctx context.Context, caller identity.ID, id string, r Report) (store.Job, error) {
	if !isExecutor(caller) {
		return store.Job{}, fmt.Errorf("%w: only the executor reports results", errdefs.ErrPermissionDenied)
	}
	if id == "" {
		return store.Job{}, fmt.Errorf("%w: job_id: required", errdefs.ErrInvalidArgument)
	}
	if r.Reason <= ReasonUnspecified || r.Reason > ReasonIdleTimeout {
		return store.Job{}, fmt.Errorf("%w: result.reason: required", errdefs.ErrInvalidArgument)
	}
	if r.BundleDigest != "" && !isDigest(r.BundleDigest) {
		return store.Job{}, fmt.Errorf("%w: result.bundle_digest: %q is not sha256:<64 hex>", errdefs.ErrInvalidArgument, r.BundleDigest)
	}
	if r.BundleDigest == "" {
		if st, _ := r.outcome(""); st == store.StateFinished {
			return store.Job{}, fmt.Errorf("%w: result.bundle_digest: required when the run finished", errdefs.ErrInvalidArgument)
		}
	}
	if r.BundleDigest != "" && r.Review == nil {
		// A reviewer must see every file of a bundle that may land.
		return store.Job{}, fmt.Errorf("%w: detail: required with a bundle (the file list, patch size and output tails)", errdefs.ErrInvalidArgument)
	}
	j, err := s.updateAudited(ctx, id, func(j *store.Job) error {
		if j.DispatchedAt.IsZero() {
			return fmt.Errorf("%w: job %q was never dispatched", errdefs.ErrFailedPrecondition, id)
		}
		if err := dispatchedTo(*j, caller); err != nil {
			return err
		}
		if len(j.Result) > 0 {
			if j.BundleDigest == r.BundleDigest && (r.BundleDigest != "" || string(j.Result) == string(r.Result)) {
				return errUnchanged
			}
			return fmt.Errorf("%w: job %q already has a result (bundle %q)", errdefs.ErrFailedPrecondition, id, j.BundleDigest)
		}
		j.Result, j.BundleDigest, j.Patch, j.Review, j.Provenance = r.Result, r.BundleDigest, r.Patch, r.Review, r.Provenance
		if !j.State.Terminal() {
			// A job already ended here (cancelled while queued, say)
			// keeps its state; the result is recorded beside it.
			j.State, j.Message = r.outcome(j.Message)
		}
		return nil
	}, func(j *store.Job) audit.Event {
		return audit.Event{Kind: audit.KindResultRecorded, Caller: caller.String(), Subject: j.ID, Outcome: audit.OutcomeAllowed,
			Reason: fmt.Sprintf("%s, bundle %s: %s", j.State, orNone(j.BundleDigest), j.Message)}
	})
	if err == nil && len(r.Execs) > 0 {
		s.observeExecs(ctx, j.ID, r.Execs...)
	}
	return j, err
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func isDigest(s string) bool {
	hex, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, r := range hex {
		if !('0' <= r && r <= '9') && !('a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}
