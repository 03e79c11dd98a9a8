package portforward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Request is what a port forward approval is about, as it stores it: a
// decision names its digest, so it decides exactly this.
type Request struct {
	ForwardID string        `json:"forward_id"`
	SessionID string        `json:"session_id"`
	Requester string        `json:"requester"`
	Port      uint32        `json:"port"`
	TTL       time.Duration `json:"ttl"`
}

// Encode serializes r with the digest a decision must name.
func (r Request) Encode() (wire []byte, dgst string, err error) {
	wire, err = json.Marshal(r)
	if err != nil {
		return nil, "", err
	}
	return wire, digest.Of(wire), nil
}

// DecodeRequest reads what a port forward approval recorded.
func DecodeRequest(wire []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(wire, &r); err != nil {
		return Request{}, fmt.Errorf("portforward: stored request: %w", err)
	}
	return r, nil
}

// openApproval records forward f's approval (its id is f.ApprovalID),
// asked by caller, bound to the request's digest: approvers who are not
// its requester decide it as any other (package approvals).
func (s *Service) openApproval(ctx context.Context, caller identity.ID, f store.PortForward, t *policy.Tenant, ttl time.Duration) (store.Approval, error) {
	wire, dgst, err := Request{ForwardID: f.ID, SessionID: f.SessionID, Requester: f.Requester, Port: f.Port, TTL: ttl}.Encode()
	if err != nil {
		return store.Approval{}, err
	}
	life := approvalLife(t)
	now := s.now()
	a := store.Approval{
		ID: f.ApprovalID, Kind: store.KindPortForward, JobID: f.SessionID, Tenant: f.Tenant, Requester: f.Requester,
		BundleDigest: dgst, Change: wire, State: store.ApprovalPending, Required: max(t.Approvals.Required, 1),
		CreatedAt: now, ExpiresAt: now.Add(life),
	}
	a, _, err = s.cfg.Store.CreateApprovalAudited(ctx, a, audit.Event{
		Kind: audit.KindApprovalOpened, Caller: caller.String(), Subject: a.ID, Time: now, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("port forward %s to port %d of session %s needs %d approval(s)", f.ID, f.Port, f.SessionID, a.Required),
	})
	return a, err
}

// resolve brings pending forward f up to date with its approval: approved,
// the approval is spent and the forward opens for its ttl from then;
// denied, expired or missing, it closes. Any other forward is returned
// as it is.
func (s *Service) resolve(ctx context.Context, f store.PortForward) (store.PortForward, error) {
	if f.State != store.ForwardPending {
		return f, nil
	}
	a, err := s.cfg.Store.GetApproval(ctx, f.ApprovalID)
	now := s.now()
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return s.closeForward(ctx, s.self(), f.ID, "its approval "+f.ApprovalID+" does not exist")
	case err != nil:
		return store.PortForward{}, err
	case a.State == store.ApprovalDenied:
		return s.closeForward(ctx, s.self(), f.ID, "denied (approval "+a.ID+")")
	case a.State == store.ApprovalExpired || (a.State == store.ApprovalPending || a.State == store.ApprovalApproved) && !now.Before(a.ExpiresAt):
		return s.closeForward(ctx, s.self(), f.ID, "its approval "+a.ID+" expired undecided")
	case a.State == store.ApprovalPending:
		return f, nil
	}
	// Approved (or consumed by another replica on its way to opening it).
	r, err := DecodeRequest(a.Change)
	if err != nil {
		return store.PortForward{}, err
	}
	if a.State == store.ApprovalApproved {
		_, err := s.cfg.Store.ConsumeApprovalAudited(ctx, store.ConsumeRequest{Kind: store.KindPortForward, ID: a.ID, JobID: a.JobID,
			BundleDigest: a.BundleDigest, By: f.Requester, At: now},
			audit.Event{Kind: audit.KindApprovalConsumed, Caller: f.Requester, Subject: a.ID, JobID: f.SessionID, Time: now,
				Outcome: audit.OutcomeAllowed, Reason: fmt.Sprintf("port forward %s approved: it opens", f.ID)})
		if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return store.PortForward{}, err
		}
		// A precondition: another replica spent it first; the update
		// below is then a no-op or the same.
	}
	return s.cfg.Store.UpdatePortForwardAudited(ctx, f.ID, func(cur *store.PortForward) (*audit.Event, error) {
		if cur.State != store.ForwardPending {
			return nil, nil
		}
		cur.State, cur.ExpiresAt = store.ForwardOpen, now.Add(r.TTL)
		return &audit.Event{Kind: audit.KindForwardOpened, Caller: cur.Requester, Subject: cur.ID, Time: now, Outcome: audit.OutcomeAllowed,
			Reason: fmt.Sprintf("port %d of session %s: approval %s approved; open until %s", cur.Port, cur.SessionID, a.ID, cur.ExpiresAt.Format(time.RFC3339))}, nil
	})
}
