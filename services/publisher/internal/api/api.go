// Package api is the publisher's thin gRPC adapter: it validates requests,
// calls the publisher's domain packages and maps their errors with
// pkg/errdefs. It is imported only by the publisher's composition root.
package api

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/identity"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// Config holds the publisher's domain services.
type Config struct {
	Publish *publish.Service
	Store   *store.Store
	Logger  *slog.Logger
}

// Service implements airlock.publisher.v1.PublisherService; the Unsafe
// embedding makes an unhandled new RPC a compile error.
type Service struct {
	publisherv1.UnsafePublisherServiceServer
	cfg Config
}

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{cfg: cfg}
}

// Register registers the service on s.
func (s *Service) Register(r grpc.ServiceRegistrar) { publisherv1.RegisterPublisherServiceServer(r, s) }

func caller(ctx context.Context) (identity.ID, error) {
	id, ok := identity.FromContext(ctx)
	if !ok {
		return identity.ID{}, status.Error(codes.Unauthenticated, "no caller identity")
	}
	return id, nil
}

// fail maps a domain error to a status; anything that is not a sentinel
// is logged and reaches the caller as "internal error".
func (s *Service) fail(ctx context.Context, err error) error {
	st := errgrpc.ToGRPC(err)
	if c := status.Code(st); c == codes.Internal || c == codes.Unknown {
		s.cfg.Logger.ErrorContext(ctx, "request failed", "error", err)
	}
	return st
}

// Publish runs the publish flow. A refused or failed deployment is
// FailedPrecondition with the deployment (and its findings) attached as
// the status's detail; one still in progress (a peer unreachable) is
// Unavailable: retry with the same idempotency key. A dry run returns its
// unstored deployment, refused or not.
func (s *Service) Publish(ctx context.Context, req *publisherv1.PublishRequest) (*publisherv1.PublishResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	r := publish.Request{
		JobID: req.GetJobId(), ApprovalID: req.GetApprovalId(), BundleDigest: req.GetBundleDigest(),
		Repo: req.GetTarget().GetRepository(), Branch: req.GetTarget().GetBranch(), IdempotencyKey: req.GetIdempotencyKey(),
	}
	if req.GetDryRun() {
		d, err := s.cfg.Publish.DryRun(ctx, id.String(), r)
		if err != nil {
			return nil, s.fail(ctx, err)
		}
		return &publisherv1.PublishResponse{Deployment: deploymentToProto(d)}, nil
	}
	d, err := s.cfg.Publish.Publish(ctx, id.String(), r)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := deploymentToProto(d)
	switch {
	case d.State == store.Failed:
		st, derr := status.New(codes.FailedPrecondition, "deployment "+d.ID+" failed: "+d.Message).WithDetails(out)
		if derr != nil {
			return nil, status.Error(codes.FailedPrecondition, "deployment "+d.ID+" failed: "+d.Message)
		}
		return nil, st.Err()
	case d.State == store.InProgress && ctx.Err() == nil:
		// The run ended without finishing: paused for a retry, or run by
		// another publisher process.
		why := "is being published by another publisher process"
		if publish.Waiting(d) {
			why = "is " + d.Message
		}
		msg := "deployment " + d.ID + " " + why + "; retry with the same idempotency key"
		st, derr := status.New(codes.Unavailable, msg).WithDetails(out)
		if derr != nil {
			return nil, status.Error(codes.Unavailable, msg)
		}
		return nil, st.Err()
	}
	return &publisherv1.PublishResponse{Deployment: out}, nil
}

func (s *Service) GetDeployment(ctx context.Context, req *publisherv1.GetDeploymentRequest) (*publisherv1.GetDeploymentResponse, error) {
	if req.GetDeploymentId() == "" {
		return nil, status.Error(codes.InvalidArgument, "deployment_id: required")
	}
	if len(req.GetDeploymentId()) > 128 {
		return nil, status.Error(codes.InvalidArgument, "deployment_id: at most 128 bytes")
	}
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	d, err := s.cfg.Store.Get(ctx, req.GetDeploymentId())
	if err == nil && !mayRead(id, d) {
		// As for a deployment that does not exist: ids reveal nothing.
		err = fmt.Errorf("%w: deployment %q", errdefs.ErrNotFound, req.GetDeploymentId())
	}
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &publisherv1.GetDeploymentResponse{Deployment: deploymentToProto(d)}, nil
}

func (s *Service) ListDeployments(ctx context.Context, req *publisherv1.ListDeploymentsRequest) (*publisherv1.ListDeploymentsResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0 || size > 500:
		return nil, status.Error(codes.InvalidArgument, "page_size: must be between 0 (the default, 50) and 500")
	case size == 0:
		size = 50
	}
	if len(req.GetJobId()) > 128 || len(req.GetRepository()) > 128 {
		return nil, status.Error(codes.InvalidArgument, "job_id and repository: at most 128 bytes")
	}
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	list, next, err := s.cfg.Store.List(ctx, req.GetJobId(), req.GetRepository(), size, req.GetPageToken())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	// Only what the caller may read (a page may then hold fewer than
	// asked while more follow).
	out := &publisherv1.ListDeploymentsResponse{NextPageToken: next}
	for _, d := range list {
		if mayRead(id, d) {
			out.Deployments = append(out.Deployments, deploymentToProto(d))
		}
	}
	return out, nil
}

// mayRead reports whether caller may read d: any pipeline, and the
// approvers of d's tenant (every approver when the tenant lists none).
// The authorization table keeps every other caller out before this.
func mayRead(caller identity.ID, d store.Deployment) bool {
	switch caller.Kind {
	case identity.KindPipeline:
		return true
	case identity.KindApprover:
		return d.ReadableBy(caller.Principal())
	}
	return false
}

var states = map[store.State]publisherv1.DeploymentState{
	store.InProgress: publisherv1.DeploymentState_DEPLOYMENT_STATE_IN_PROGRESS,
	store.Succeeded:  publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED,
	store.Failed:     publisherv1.DeploymentState_DEPLOYMENT_STATE_FAILED,
}

func deploymentToProto(d store.Deployment) *publisherv1.Deployment {
	out := &publisherv1.Deployment{
		DeploymentId: d.ID, JobId: d.JobID, ApprovalId: d.ApprovalID, BundleDigest: d.BundleDigest,
		Target: &typesv1.PublishTarget{Repository: d.TargetRepo, Branch: d.TargetBranch},
		State:  states[d.State], Requester: d.Requester, Message: d.Message,
		CreatedAt: timestamppb.New(d.CreatedAt), UpdatedAt: timestamppb.New(d.UpdatedAt), IdempotencyKey: d.IdempotencyKey,
		Tenant: d.Tenant, PolicyDigest: d.PolicyDigest, BaseCommit: d.BaseCommit, ParentCommit: d.ParentCommit,
		Approvers: slices.Clone(d.Approvers), FilesDigest: d.FilesDigest,
	}
	if d.State == store.Succeeded || d.Step == store.StepPushed || d.Step == store.StepRevoked {
		out.Commit = d.Commit
	}
	for _, f := range d.Findings {
		out.Findings = append(out.Findings, &publisherv1.Finding{Rule: f.Rule, Path: f.Path, Line: int32(f.Line), Message: f.Message, Redacted: f.Redacted})
	}
	for _, st := range store.Steps {
		if at, ok := d.Steps[st]; ok {
			out.Steps = append(out.Steps, &publisherv1.DeploymentStep{Step: string(st), DoneAt: timestamppb.New(at)})
		}
	}
	return out
}
