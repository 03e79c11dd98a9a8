package approvals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// DecideRequest is one approver's decision.
type DecideRequest struct {
	ID           string
	BundleDigest string
	// Decision is store.DecisionApprove or store.DecisionDeny.
	Decision string
	Comment  string
}

// Decide records caller's decision. Refused: anyone but an approver (the
// services included); the job's requester under any kind (client/dev and
// approver/dev are one person); an approver the tenant does not list; an
// expired or already decided request; a digest other than the request's;
// a second vote by the same approver; a deny without a comment. Reaching
// the required count approves; one deny denies.
func (s *Service) Decide(ctx context.Context, caller identity.ID, req DecideRequest) (store.Approval, error) {
	ev := audit.Event{Kind: audit.KindApprovalDecided, Caller: caller.String(), Subject: req.ID}
	if err := s.checkDecide(caller, req); err != nil {
		return store.Approval{}, s.Refused(ctx, ev, err)
	}
	now := s.now()
	a, err := s.cfg.Store.DecideApprovalAudited(ctx, req.ID, func(a *store.Approval) (store.Vote, audit.Event, error) {
		ev.Tenant, ev.JobID = a.Tenant, a.JobID
		if err := s.mayDecide(caller, *a, req, now); err != nil {
			return store.Vote{}, audit.Event{}, err
		}
		approvals := 0
		for _, v := range a.Votes {
			if v.Decision == store.DecisionApprove {
				approvals++
			}
		}
		switch req.Decision {
		case store.DecisionDeny:
			a.State = store.ApprovalDenied
		default:
			if approvals+1 >= a.Required {
				a.State = store.ApprovalApproved
			}
		}
		e := ev
		e.Time, e.Outcome = now, audit.OutcomeAllowed
		e.Reason = fmt.Sprintf("%s (%d of %d approvals), now %s", req.Decision, approvals+boolInt(req.Decision == store.DecisionApprove), a.Required, a.State)
		if req.Comment != "" {
			e.Reason += ": " + req.Comment
		}
		return store.Vote{Approver: caller.String(), Decision: req.Decision, Comment: req.Comment, DecidedAt: now}, e, nil
	})
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, req.ID)
		}
		return store.Approval{}, s.Refused(ctx, ev, err)
	}
	s.metrics.voted(a, req.Decision)
	return a, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkDecide checks what needs no stored record.
func (s *Service) checkDecide(caller identity.ID, req DecideRequest) error {
	if caller.Kind != identity.KindApprover {
		return denied("%s is not an approver; only approver identities decide", caller.Principal())
	}
	switch {
	case req.ID == "":
		return invalid("approval_id", "required")
	case req.BundleDigest == "":
		return invalid("bundle_digest", "required: the digest you reviewed")
	case req.Decision != store.DecisionApprove && req.Decision != store.DecisionDeny:
		return invalid("decision", "required: approve or deny")
	case req.Decision == store.DecisionDeny && req.Comment == "":
		return invalid("comment", "required when denying")
	case len(req.Comment) > MaxCommentBytes:
		return invalid("comment", "at most %d bytes", MaxCommentBytes)
	case len(req.ID) > MaxIDBytes:
		return invalid("approval_id", "at most %d bytes", MaxIDBytes)
	}
	return nil
}

// mayDecide checks caller's decision against the stored request, under its
// row lock.
func (s *Service) mayDecide(caller identity.ID, a store.Approval, req DecideRequest, now time.Time) error {
	// First, and as Get answers: an approver of other tenants learns
	// nothing of this request, not even that it exists.
	if !s.ApproverOf(caller, a.Tenant) {
		return fmt.Errorf("%w: approval %q", errdefs.ErrNotFound, a.ID)
	}
	if r, err := identity.Parse(a.Requester); err != nil || r.Name == caller.Name {
		return denied("%s requested job %q (as %s) and may not decide its approval", caller.Name, a.JobID, a.Requester)
	}
	for _, v := range a.Votes {
		if v.Approver == caller.String() {
			return fmt.Errorf("%w: %s has already decided approval %q (%s)", errdefs.ErrAlreadyExists, caller.Principal(), a.ID, v.Decision)
		}
	}
	if st := Effective(a, now); st != store.ApprovalPending {
		return precondition("approval %q is %s, not pending", a.ID, st)
	}
	if req.BundleDigest != a.BundleDigest {
		return precondition("bundle_digest: %s is not the request's %s", req.BundleDigest, a.BundleDigest)
	}
	return nil
}
