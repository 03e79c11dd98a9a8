package api

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/bundle/bundlepb"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
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
	switch a.Kind {
	case store.KindChange:
		out.Kind = authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE
		// A change that cannot be read is shown without it; the digest
		// still binds any decision to what was stored.
		if c, err := jobs.DecodeChange(a.Change); err == nil {
			out.Change = changeToProto(c)
		}
	case store.KindStart:
		out.Kind = authorityv1.ApprovalKind_APPROVAL_KIND_START
		if r, err := jobs.DecodeStart(a.Change); err == nil {
			out.Start = startToProto(r)
		}
	case store.KindPortForward:
		out.Kind = authorityv1.ApprovalKind_APPROVAL_KIND_PORT_FORWARD
		out.PortForward = forwardRequestToProto(a)
	default:
		out.Target = &typesv1.PublishTarget{Repository: a.TargetRepo, Branch: a.TargetBranch}
	}
	for _, v := range a.Votes {
		out.Votes = append(out.Votes, &authorityv1.ApprovalVote{Approver: v.Approver, Decision: decisionToProto[v.Decision],
			Comment: v.Comment, DecidedAt: timestamppb.New(v.DecidedAt)})
	}
	return out
}

// startToProto is the API's view of what a start approval is about.
func startToProto(r jobs.StartRequest) *authorityv1.StartRequest {
	out := &authorityv1.StartRequest{}
	for _, c := range r.Credentials {
		out.Credentials = append(out.Credentials, &authorityv1.StartCredential{Name: c.Name, Hosts: c.Hosts, ApprovalRequired: c.ApprovalRequired})
	}
	return out
}

func (s *Service) approval(a store.Approval) *authorityv1.Approval {
	return approvalToProto(a, s.cfg.Approvals.State(a))
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
	rv := &authorityv1.ReviewMaterial{
		Patch: j.Patch, Result: pj.GetResult(),
		NetworkPolicy: pj.GetNetworkPolicyStatus().GetPolicy(), Command: pj.GetSpec().GetCommand(), Commit: j.Commit,
	}
	if rv.Detail, err = storedReview(j); err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.GetApprovalResponse{Approval: s.approval(a), Review: rv}, nil
}

var reviewParts = map[authorityv1.ReviewPart]string{
	authorityv1.ReviewPart_REVIEW_PART_FILES:  approvals.PartFiles,
	authorityv1.ReviewPart_REVIEW_PART_PATCH:  approvals.PartPatch,
	authorityv1.ReviewPart_REVIEW_PART_STDOUT: approvals.PartStdout,
	authorityv1.ReviewPart_REVIEW_PART_STDERR: approvals.PartStderr,
}

func (s *Service) ReadReview(req *authorityv1.ReadReviewRequest, stream grpc.ServerStreamingServer[authorityv1.ReadReviewResponse]) error {
	ctx := stream.Context()
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	var parts []string
	for i, p := range req.GetParts() {
		name, ok := reviewParts[p]
		if !ok {
			return status.Errorf(codes.InvalidArgument, "parts[%d]: %v is not a review part", i, p)
		}
		parts = append(parts, name)
	}
	digest, err := s.cfg.Approvals.ReadReview(ctx, id, req.GetApprovalId(), parts, reviewSink{stream})
	if err != nil {
		return s.fail(ctx, err)
	}
	return stream.Send(&authorityv1.ReadReviewResponse{Msg: &authorityv1.ReadReviewResponse_VerifiedDigest{VerifiedDigest: digest}})
}

// reviewSink sends what approvals.ReadReview reads as ReadReview messages.
type reviewSink struct {
	stream grpc.ServerStreamingServer[authorityv1.ReadReviewResponse]
}

func (k reviewSink) Start(part string, size int64) error {
	var p authorityv1.ReviewPart
	for pp, name := range reviewParts {
		if name == part {
			p = pp
		}
	}
	return k.stream.Send(&authorityv1.ReadReviewResponse{Msg: &authorityv1.ReadReviewResponse_Start{Start: &authorityv1.ReviewPartStart{Part: p, Size: size}}})
}

func (k reviewSink) Files(files []bundle.FileChange) error {
	out := make([]*authorityv1.FileChange, len(files))
	for i, f := range files {
		out[i] = bundlepb.File(f)
	}
	return k.stream.Send(&authorityv1.ReadReviewResponse{Msg: &authorityv1.ReadReviewResponse_Files{Files: &authorityv1.ReviewFiles{Files: out}}})
}

func (k reviewSink) Chunk(data []byte) error {
	return k.stream.Send(&authorityv1.ReadReviewResponse{Msg: &authorityv1.ReadReviewResponse_Chunk{Chunk: data}})
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
	a, err := s.cfg.Flow.Decide(ctx, id, approvals.DecideRequest{
		ID: req.GetApprovalId(), BundleDigest: req.GetBundleDigest(), Decision: decision, Comment: req.GetComment(),
	})
	if err != nil {
		return nil, s.fail(ctx, err)
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

func (s *Service) GetPublishSpec(ctx context.Context, req *authorityv1.GetPublishSpecRequest) (*authorityv1.GetPublishSpecResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	spec, err := s.cfg.Approvals.PublishSpec(ctx, id, req.GetApprovalId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.GetPublishSpecResponse{
		Approval: s.approval(spec.Approval), RepositoryUrl: spec.Repository.URL, ReadCredential: spec.Repository.Credential != "",
		BaseCommit: spec.Base, Approvers: spec.Approvers,
		Policy: &authorityv1.PublishPolicy{
			Protected: spec.Policy.Content.Protected, AllowProtected: spec.Policy.Content.AllowProtected,
			MaxFileBytes: spec.Policy.Content.MaxFileBytes, AllowBinary: spec.Policy.Content.AllowBinary, OnMoved: spec.Policy.OnMoved,
		},
		PolicyDigest: spec.Policy.Digest(), TenantApprovers: spec.TenantApprovers, DeployCredential: spec.DeployCredential,
	}
	if !spec.ApprovedAt.IsZero() {
		out.ApprovedAt = timestamppb.New(spec.ApprovedAt)
	}
	if out.Executor, out.ExecutorAddress, err = s.cfg.Jobs.ExecutorOf(ctx, spec.Approval.JobID); err != nil {
		return nil, s.fail(ctx, err)
	}
	if spec.Repository.CA != "" {
		// The operator's file, read at each call so a renewed CA is seen.
		if out.RepositoryCa, err = os.ReadFile(spec.Repository.CA); err != nil {
			s.cfg.Logger.ErrorContext(ctx, "read repository CA", "repository", spec.Repository.Name, "error", err)
			return nil, status.Errorf(codes.Unavailable, "the CA of repository %q cannot be read", spec.Repository.Name)
		}
	}
	return out, nil
}

// checkReviewDetail refuses a report whose review detail cannot be true: a
// reviewer reads these counts as what will land.
func checkReviewDetail(req *authorityv1.ReportResultRequest) error {
	d := req.GetDetail()
	if d == nil {
		return nil // required with a bundle: the domain says so, after the result's own checks
	}
	bad := func(field, why string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, "detail.%s: "+why, append([]any{field}, args...)...)
	}
	if d.GetFilesTotal() < int64(len(d.GetFiles())) {
		return bad("files_total", "%d is fewer than the %d files listed", d.GetFilesTotal(), len(d.GetFiles()))
	}
	if n := req.GetResult().GetDiffStat().GetFilesChanged(); d.GetFilesTotal() != n {
		return bad("files_total", "%d, but result.diff_stat counts %d files", d.GetFilesTotal(), n)
	}
	if d.GetPatchSize() < int64(len(req.GetPatch())) {
		return bad("patch_size", "%d is less than the %d bytes of patch sent", d.GetPatchSize(), len(req.GetPatch()))
	}
	for i, f := range d.GetFiles() {
		if f.GetPath() == "" || f.GetStatus() == authorityv1.FileStatus_FILE_STATUS_UNSPECIFIED || f.GetPatchBytes() <= 0 {
			return bad(fmt.Sprintf("files[%d]", i), "needs a path, a status and its share of the patch")
		}
	}
	for name, t := range map[string]*authorityv1.OutputTail{"stdout": d.GetStdout(), "stderr": d.GetStderr()} {
		if t.GetSize() < int64(len(t.GetData())) {
			return bad(name+".size", "%d is less than the %d bytes of tail sent", t.GetSize(), len(t.GetData()))
		}
	}
	listed := int64(0)
	for i, w := range d.GetFileWrites() {
		if w.GetCount() < 0 || w.GetFirstAfterExec() > w.GetAfterExec() {
			return bad(fmt.Sprintf("file_writes[%d]", i), "count %d, first after %d execs, last after %d: not a span of uploads", w.GetCount(), w.GetFirstAfterExec(), w.GetAfterExec())
		}
		listed += max(w.GetCount(), 1)
	}
	if d.GetFileWritesTotal() < listed {
		return bad("file_writes_total", "%d is fewer than the %d uploads listed", d.GetFileWritesTotal(), listed)
	}
	if d.GetExecsTotal() < int64(len(d.GetExecs())) {
		return bad("execs_total", "%d is fewer than the %d execs listed", d.GetExecsTotal(), len(d.GetExecs()))
	}
	if err := egresspb.Check("detail.egress", d.GetEgress()); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}
