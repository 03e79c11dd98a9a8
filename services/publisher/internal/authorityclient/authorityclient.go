// Package authorityclient is the publisher's client of the authority: it
// adapts the authority's gRPC API to what the publish domain asks of it
// (publish.Authority), converting messages and errors. Only the publisher's
// composition root imports it.
package authorityclient

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/seal"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
)

// rpcTimeout bounds one call to the authority.
const rpcTimeout = 30 * time.Second

// Client is publish.Authority over the authority's API.
type Client struct {
	c   authorityv1.AuthorityServiceClient
	tls *tlsconfig.Source
}

// New returns the authority adapter; tls is the publisher's own
// identity, whose key opens leased credentials.
func New(cc grpc.ClientConnInterface, tls *tlsconfig.Source) *Client {
	return &Client{c: authorityv1.NewAuthorityServiceClient(cc), tls: tls}
}

var approvalStates = map[authorityv1.ApprovalState]string{
	authorityv1.ApprovalState_APPROVAL_STATE_PENDING:  "pending",
	authorityv1.ApprovalState_APPROVAL_STATE_APPROVED: publish.ApprovalApproved,
	authorityv1.ApprovalState_APPROVAL_STATE_DENIED:   "denied",
	authorityv1.ApprovalState_APPROVAL_STATE_EXPIRED:  "expired",
	authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED: publish.ApprovalConsumed,
}

// Spec implements publish.Authority.
func (a *Client) Spec(ctx context.Context, approvalID string) (publish.Spec, error) {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := a.c.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: approvalID})
	if err != nil {
		return publish.Spec{}, errgrpc.FromPeer("authority", err)
	}
	ap, pol := resp.GetApproval(), resp.GetPolicy()
	state := approvalStates[ap.GetState()]
	if state == "" {
		state = "in an unknown state"
	}
	spec := publish.Spec{
		ApprovalID: ap.GetApprovalId(), JobID: ap.GetJobId(), Tenant: ap.GetTenant(), BundleDigest: ap.GetBundleDigest(),
		Repo: ap.GetTarget().GetRepository(), Branch: ap.GetTarget().GetBranch(), State: state,
		URL: resp.GetRepositoryUrl(), CA: resp.GetRepositoryCa(), ReadCredential: resp.GetReadCredential(),
		Base: resp.GetBaseCommit(), Approvers: resp.GetApprovers(),
		Policy: contentcheck.Policy{
			Protected: pol.GetProtected(), AllowProtected: pol.GetAllowProtected(),
			MaxFileBytes: pol.GetMaxFileBytes(), AllowBinary: pol.GetAllowBinary(),
		},
		OnMoved: pol.GetOnMoved(), PolicyDigest: resp.GetPolicyDigest(), TenantApprovers: resp.GetTenantApprovers(), DeployCredential: resp.GetDeployCredential(),
	}
	if resp.GetApprovedAt() != nil {
		spec.ApprovedAt = resp.GetApprovedAt().AsTime()
	}
	if x := resp.GetExecutor(); x != "" {
		id, err := identity.Parse(x)
		if err != nil || !id.IsExecutor() {
			return publish.Spec{}, fmt.Errorf("%w: authority: the job's executor %q is not an executor's identity", errdefs.ErrFailedPrecondition, x)
		}
		spec.Executor, spec.ExecutorAddress = id, resp.GetExecutorAddress()
	}
	return spec, nil
}

// Consume implements publish.Authority.
func (a *Client) Consume(ctx context.Context, approvalID, jobID, digest, repo, branch string) error {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := a.c.ConsumeApproval(ctx, &authorityv1.ConsumeApprovalRequest{
		ApprovalId: approvalID, JobId: jobID, BundleDigest: digest,
		Target: &typesv1.PublishTarget{Repository: repo, Branch: branch},
	})
	return errgrpc.FromPeer("authority", err)
}

var purposes = map[string]authorityv1.LeasePurpose{
	publish.LeaseRead:   authorityv1.LeasePurpose_LEASE_PURPOSE_READ,
	publish.LeaseDeploy: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY,
}

// Lease implements publish.Authority: the credential comes sealed to the
// publisher's certificate and is opened here, in memory.
func (a *Client) Lease(ctx context.Context, purpose, jobID, repo string) (publish.Lease, error) {
	p, ok := purposes[purpose]
	if !ok {
		return publish.Lease{}, fmt.Errorf("%w: lease purpose %q", errdefs.ErrInvalidArgument, purpose)
	}
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := a.c.LeaseCredential(cctx, &authorityv1.LeaseCredentialRequest{Purpose: p, JobId: jobID, Resource: repo})
	if err != nil {
		return publish.Lease{}, errgrpc.FromPeer("authority", err)
	}
	l := resp.GetLease()
	secret, err := a.open(seal.LeaseContext(l.GetLeaseId(), l.GetJobId(), l.GetResource()), resp.GetSealedCredential())
	if err != nil {
		_, _ = a.c.RevokeCredential(context.WithoutCancel(ctx), &authorityv1.RevokeCredentialRequest{LeaseId: l.GetLeaseId(), Reason: "the sealed credential did not open"})
		return publish.Lease{}, err
	}
	return publish.Lease{ID: l.GetLeaseId(), Secret: secret}, nil
}

func (a *Client) open(context, box []byte) ([]byte, error) {
	cert, err := a.tls.Certificate()
	if err != nil {
		return nil, err
	}
	return seal.OpenTLS(cert, context, box)
}

// Use implements publish.Authority.
func (a *Client) Use(ctx context.Context, leaseID, jobID, repo string) error {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := a.c.UseLease(ctx, &authorityv1.UseLeaseRequest{LeaseId: leaseID, JobId: jobID, Resource: repo})
	return errgrpc.FromPeer("authority", err)
}

// Revoke implements publish.Authority.
func (a *Client) Revoke(ctx context.Context, leaseID, reason string) error {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := a.c.RevokeCredential(ctx, &authorityv1.RevokeCredentialRequest{LeaseId: leaseID, Reason: reason})
	return errgrpc.FromPeer("authority", err)
}

// ActiveLeases implements publish.Authority.
func (a *Client) ActiveLeases(ctx context.Context, jobID string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	var ids []string
	token := ""
	for page := 0; ; page++ {
		if page == maxLeasePages {
			return nil, fmt.Errorf("%w: authority: job %s holds more than %d pages of active leases", errdefs.ErrUnavailable, jobID, maxLeasePages)
		}
		resp, err := a.c.ListLeases(ctx, &authorityv1.ListLeasesRequest{JobId: jobID, PageSize: 500, PageToken: token})
		if err != nil {
			return nil, errgrpc.FromPeer("authority", err)
		}
		for _, l := range resp.GetLeases() {
			ids = append(ids, l.GetLeaseId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			return ids, nil
		}
	}
}

// maxLeasePages bounds the pages of one job's active leases read: the
// authority keeps at most one active per approval.
const maxLeasePages = 10
