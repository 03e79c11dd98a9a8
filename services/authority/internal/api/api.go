// Package api is the authority's thin gRPC adapter: it validates requests,
// calls the authority's domain packages and maps their errors with
// pkg/errdefs. It is imported only by the authority's composition root.
package api

import (
	"context"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/errdefs"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// Config holds the authority's domain services. It is empty until the
// domain packages exist; each later RPC adds what it needs here.
type Config struct{}

// Service implements airlock.authority.v1.AuthorityService. Embedding the
// Unsafe interface (not the Unimplemented struct) makes a new RPC in the
// proto a compile error here until it is handled.
type Service struct {
	authorityv1.UnsafeAuthorityServiceServer
	cfg Config
}

// New returns the service.
func New(cfg Config) *Service { return &Service{cfg: cfg} }

// Register registers the service on s.
func (s *Service) Register(r grpc.ServiceRegistrar) { authorityv1.RegisterAuthorityServiceServer(r, s) }

const (
	withJobs      = "job execution (submit, grant, sandbox run, result)"
	withApprovals = "approvals, leased credentials and the audit log"
	withNetwork   = "per-job network policy enforcement"
)

func (s *Service) SubmitJob(context.Context, *authorityv1.SubmitJobRequest) (*authorityv1.SubmitJobResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_SubmitJob_FullMethodName, withJobs)
}

func (s *Service) GetJob(context.Context, *authorityv1.GetJobRequest) (*authorityv1.GetJobResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_GetJob_FullMethodName, withJobs)
}

func (s *Service) ListJobs(context.Context, *authorityv1.ListJobsRequest) (*authorityv1.ListJobsResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_ListJobs_FullMethodName, withJobs)
}

func (s *Service) WatchJob(*authorityv1.WatchJobRequest, grpc.ServerStreamingServer[authorityv1.WatchJobResponse]) error {
	return errdefs.NotImplemented(authorityv1.AuthorityService_WatchJob_FullMethodName, withJobs)
}

func (s *Service) CancelJob(context.Context, *authorityv1.CancelJobRequest) (*authorityv1.CancelJobResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_CancelJob_FullMethodName, withJobs)
}

func (s *Service) FetchSource(*authorityv1.FetchSourceRequest, grpc.ServerStreamingServer[authorityv1.FetchSourceResponse]) error {
	return errdefs.NotImplemented(authorityv1.AuthorityService_FetchSource_FullMethodName, withJobs)
}

func (s *Service) ReportResult(context.Context, *authorityv1.ReportResultRequest) (*authorityv1.ReportResultResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_ReportResult_FullMethodName, withJobs)
}

func (s *Service) ListApprovals(context.Context, *authorityv1.ListApprovalsRequest) (*authorityv1.ListApprovalsResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_ListApprovals_FullMethodName, withApprovals)
}

func (s *Service) GetApproval(context.Context, *authorityv1.GetApprovalRequest) (*authorityv1.GetApprovalResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_GetApproval_FullMethodName, withApprovals)
}

func (s *Service) DecideApproval(context.Context, *authorityv1.DecideApprovalRequest) (*authorityv1.DecideApprovalResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_DecideApproval_FullMethodName, withApprovals)
}

func (s *Service) ConsumeApproval(context.Context, *authorityv1.ConsumeApprovalRequest) (*authorityv1.ConsumeApprovalResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_ConsumeApproval_FullMethodName, withApprovals)
}

func (s *Service) LeaseCredential(context.Context, *authorityv1.LeaseCredentialRequest) (*authorityv1.LeaseCredentialResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_LeaseCredential_FullMethodName, withApprovals)
}

func (s *Service) RevokeCredential(context.Context, *authorityv1.RevokeCredentialRequest) (*authorityv1.RevokeCredentialResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_RevokeCredential_FullMethodName, withApprovals)
}

func (s *Service) ListLeases(context.Context, *authorityv1.ListLeasesRequest) (*authorityv1.ListLeasesResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_ListLeases_FullMethodName, withApprovals)
}

func (s *Service) UpdateNetworkPolicy(context.Context, *authorityv1.UpdateNetworkPolicyRequest) (*authorityv1.UpdateNetworkPolicyResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_UpdateNetworkPolicy_FullMethodName, withNetwork)
}

func (s *Service) ListAuditEvents(context.Context, *authorityv1.ListAuditEventsRequest) (*authorityv1.ListAuditEventsResponse, error) {
	return nil, errdefs.NotImplemented(authorityv1.AuthorityService_ListAuditEvents_FullMethodName, withApprovals)
}
