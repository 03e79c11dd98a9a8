package api

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

var approvalStateToProto = map[store.ApprovalState]authorityv1.ApprovalState{
	store.ApprovalPending:  authorityv1.ApprovalState_APPROVAL_STATE_PENDING,
	store.ApprovalApproved: authorityv1.ApprovalState_APPROVAL_STATE_APPROVED,
	store.ApprovalDenied:   authorityv1.ApprovalState_APPROVAL_STATE_DENIED,
	store.ApprovalConsumed: authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED,
	store.ApprovalExpired:  authorityv1.ApprovalState_APPROVAL_STATE_EXPIRED,
}

var approvalStateFromProto = func() map[authorityv1.ApprovalState]store.ApprovalState {
	m := map[authorityv1.ApprovalState]store.ApprovalState{}
	for k, v := range approvalStateToProto {
		m[v] = k
	}
	return m
}()

var decisionToProto = map[string]authorityv1.Decision{
	store.DecisionApprove: authorityv1.Decision_DECISION_APPROVE,
	store.DecisionDeny:    authorityv1.Decision_DECISION_DENY,
}

// optTime is t, or nil when t is unset.
func optTime(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// approvalToProto builds the API's view of a stored approval, in the state
// callers see (expired once past its expiry).
func approvalToProto(a store.Approval, state store.ApprovalState) *authorityv1.Approval {
	out := &authorityv1.Approval{
		ApprovalId: a.ID, JobId: a.JobID, Tenant: a.Tenant, Requester: a.Requester, BundleDigest: a.BundleDigest,
		State: approvalStateToProto[state], RequiredApprovals: int32(a.Required),
		CreatedAt: timestamppb.New(a.CreatedAt), ExpiresAt: timestamppb.New(a.ExpiresAt),
		Kind: authorityv1.ApprovalKind_APPROVAL_KIND_PUBLISH,
	}
	if a.Kind == store.KindChange {
		out.Kind = authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE
		// A change that cannot be read is shown without it; the digest
		// still binds any decision to what was stored.
		if c, err := jobs.DecodeChange(a.Change); err == nil {
			out.Change = changeToProto(c)
		}
	} else {
		out.Target = &typesv1.PublishTarget{Repository: a.TargetRepo, Branch: a.TargetBranch}
	}
	for _, v := range a.Votes {
		out.Votes = append(out.Votes, &authorityv1.ApprovalVote{Approver: v.Approver, Decision: decisionToProto[v.Decision],
			Comment: v.Comment, DecidedAt: timestamppb.New(v.DecidedAt)})
	}
	return out
}

func (s *Service) approval(a store.Approval) *authorityv1.Approval {
	return approvalToProto(a, s.cfg.Approvals.State(a))
}

var leasePurposeToProto = map[string]authorityv1.LeasePurpose{approvals.PurposeDeploy: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY}

func leaseToProto(l store.Lease) *authorityv1.Lease {
	return &authorityv1.Lease{
		LeaseId: l.ID, Purpose: leasePurposeToProto[l.Purpose], JobId: l.JobID, Resource: l.Resource, Holder: l.Holder,
		IssuedAt: timestamppb.New(l.IssuedAt), ExpiresAt: timestamppb.New(l.ExpiresAt),
		RevokedAt: optTime(l.RevokedAt),
	}
}

func (s *Service) ListApprovals(ctx context.Context, req *authorityv1.ListApprovalsRequest) (*authorityv1.ListApprovalsResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	var states []store.ApprovalState
	for _, st := range req.GetStates() {
		ds, ok := approvalStateFromProto[st]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "states: %v is not an approval state", st)
		}
		states = append(states, ds)
	}
	list, next, err := s.cfg.Approvals.List(ctx, id, approvals.ListRequest{
		Tenant: req.GetTenant(), States: states, PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken(),
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.ListApprovalsResponse{NextPageToken: next}
	for _, a := range list {
		out.Approvals = append(out.Approvals, s.approval(a))
	}
	return out, nil
}

func (s *Service) GetApproval(ctx context.Context, req *authorityv1.GetApprovalRequest) (*authorityv1.GetApprovalResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	a, j, err := s.cfg.Approvals.Get(ctx, id, req.GetApprovalId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.GetApprovalResponse{Approval: s.approval(a), Review: &authorityv1.ReviewMaterial{
		Patch: j.Patch, Result: pj.GetResult(), OutputTail: j.OutputTail,
		NetworkPolicy: pj.GetNetworkPolicyStatus().GetPolicy(), Command: pj.GetSpec().GetCommand(), Commit: j.Commit,
	}}, nil
}

func (s *Service) DecideApproval(ctx context.Context, req *authorityv1.DecideApprovalRequest) (*authorityv1.DecideApprovalResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	var decision string
	switch req.GetDecision() {
	case authorityv1.Decision_DECISION_APPROVE:
		decision = store.DecisionApprove
	case authorityv1.Decision_DECISION_DENY:
		decision = store.DecisionDeny
	}
	a, err := s.cfg.Approvals.Decide(ctx, id, approvals.DecideRequest{
		ID: req.GetApprovalId(), BundleDigest: req.GetBundleDigest(), Decision: decision, Comment: req.GetComment(),
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if a.Kind == store.KindChange && a.State == store.ApprovalApproved {
		// The deciding vote applies the change: the approval is spent with
		// the job's new grant in one transaction.
		if _, err := s.cfg.Jobs.ApplyApproved(ctx, id, a.ID); err != nil {
			return nil, s.fail(ctx, fmt.Errorf("the decision is recorded and approval %s is approved, but its change did not apply: %w", a.ID, err))
		}
		if a, _, err = s.cfg.Approvals.Get(ctx, id, a.ID); err != nil {
			return nil, s.fail(ctx, err)
		}
	}
	return &authorityv1.DecideApprovalResponse{Approval: s.approval(a)}, nil
}

func (s *Service) ConsumeApproval(ctx context.Context, req *authorityv1.ConsumeApprovalRequest) (*authorityv1.ConsumeApprovalResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	a, err := s.cfg.Approvals.Consume(ctx, id, approvals.ConsumeRequest{
		ID: req.GetApprovalId(), JobID: req.GetJobId(), BundleDigest: req.GetBundleDigest(),
		Target: approvals.Target{Repo: req.GetTarget().GetRepository(), Branch: req.GetTarget().GetBranch()},
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.ConsumeApprovalResponse{Approval: s.approval(a)}, nil
}

// peerLeaf returns the caller's verified client certificate.
func peerLeaf(ctx context.Context) (*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil, status.Error(codes.Unauthenticated, "no client certificate")
	}
	return info.State.PeerCertificates[0], nil
}

func (s *Service) LeaseCredential(ctx context.Context, req *authorityv1.LeaseCredentialRequest) (*authorityv1.LeaseCredentialResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	cert, err := peerLeaf(ctx)
	if err != nil {
		return nil, err
	}
	var purpose string
	if req.GetPurpose() == authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY {
		purpose = approvals.PurposeDeploy
	}
	lr := approvals.LeaseRequest{Purpose: purpose, JobID: req.GetJobId(), Resource: req.GetResource()}
	if d := req.GetTtl(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "ttl: %v", err)
		}
		lr.TTL = d.AsDuration()
	}
	l, box, err := s.cfg.Approvals.Lease(ctx, id, cert, lr)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.LeaseCredentialResponse{Lease: leaseToProto(l), SealedCredential: box}, nil
}

func (s *Service) RevokeCredential(ctx context.Context, req *authorityv1.RevokeCredentialRequest) (*authorityv1.RevokeCredentialResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.cfg.Approvals.Revoke(ctx, id, req.GetLeaseId(), req.GetReason())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.RevokeCredentialResponse{Lease: leaseToProto(l)}, nil
}

func (s *Service) ListLeases(ctx context.Context, req *authorityv1.ListLeasesRequest) (*authorityv1.ListLeasesResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	list, next, err := s.cfg.Approvals.ListLeases(ctx, id, approvals.LeaseQuery{
		JobID: req.GetJobId(), IncludeInactive: req.GetIncludeInactive(), PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken(),
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.ListLeasesResponse{NextPageToken: next}
	for _, l := range list {
		out.Leases = append(out.Leases, leaseToProto(l))
	}
	return out, nil
}

// PublishTarget reads the publish target from a stored job's spec; zero if
// it has none. The composition root passes it to approvals.OpenMissing.
func PublishTarget(j store.Job) (approvals.Target, error) {
	spec := &authorityv1.JobSpec{}
	if err := proto.Unmarshal(j.Spec, spec); err != nil {
		return approvals.Target{}, fmt.Errorf("api: stored spec of job %s: %w", j.ID, err)
	}
	t := spec.GetPublishTarget()
	return approvals.Target{Repo: t.GetRepository(), Branch: t.GetBranch()}, nil
}
