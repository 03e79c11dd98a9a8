// Package peers adapts the authority's and the executor's gRPC APIs to
// what the publisher's publish domain asks of them (publish.Authority,
// publish.Executor), converting messages and errors. Only the publisher's
// composition root imports it.
package peers

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/seal"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
)

// fromStatus maps a peer's status: what may pass by itself (the peer
// restarting, a deadline) is errdefs.ErrUnavailable, the rest its sentinel.
func fromStatus(peer string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable, codes.Aborted, codes.Internal, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted:
		return fmt.Errorf("%w: %s: %s", errdefs.ErrUnavailable, peer, st.Message())
	case codes.Canceled:
		return context.Canceled
	}
	return fmt.Errorf("%s: %w", peer, errgrpc.FromGRPC(err))
}

// rpcTimeout bounds one call to a peer; artifactTimeout a bundle's
// download.
const (
	rpcTimeout      = 30 * time.Second
	artifactTimeout = 30 * time.Minute
)

// Authority is publish.Authority over the authority's API.
type Authority struct {
	c   authorityv1.AuthorityServiceClient
	tls *tlsconfig.Source
}

// NewAuthority returns the authority adapter; tls is the publisher's own
// identity, whose key opens leased credentials.
func NewAuthority(cc grpc.ClientConnInterface, tls *tlsconfig.Source) *Authority {
	return &Authority{c: authorityv1.NewAuthorityServiceClient(cc), tls: tls}
}

var approvalStates = map[authorityv1.ApprovalState]string{
	authorityv1.ApprovalState_APPROVAL_STATE_PENDING:  "pending",
	authorityv1.ApprovalState_APPROVAL_STATE_APPROVED: publish.ApprovalApproved,
	authorityv1.ApprovalState_APPROVAL_STATE_DENIED:   "denied",
	authorityv1.ApprovalState_APPROVAL_STATE_EXPIRED:  "expired",
	authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED: publish.ApprovalConsumed,
}

// Spec implements publish.Authority.
func (a *Authority) Spec(ctx context.Context, approvalID string) (publish.Spec, error) {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := a.c.GetPublishSpec(ctx, &authorityv1.GetPublishSpecRequest{ApprovalId: approvalID})
	if err != nil {
		return publish.Spec{}, fromStatus("authority", err)
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
	return spec, nil
}

// Consume implements publish.Authority.
func (a *Authority) Consume(ctx context.Context, approvalID, jobID, digest, repo, branch string) error {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := a.c.ConsumeApproval(ctx, &authorityv1.ConsumeApprovalRequest{
		ApprovalId: approvalID, JobId: jobID, BundleDigest: digest,
		Target: &typesv1.PublishTarget{Repository: repo, Branch: branch},
	})
	return fromStatus("authority", err)
}

var purposes = map[string]authorityv1.LeasePurpose{
	publish.LeaseRead:   authorityv1.LeasePurpose_LEASE_PURPOSE_READ,
	publish.LeaseDeploy: authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY,
}

// Lease implements publish.Authority: the credential comes sealed to the
// publisher's certificate and is opened here, in memory.
func (a *Authority) Lease(ctx context.Context, purpose, jobID, repo string) (publish.Lease, error) {
	p, ok := purposes[purpose]
	if !ok {
		return publish.Lease{}, fmt.Errorf("%w: lease purpose %q", errdefs.ErrInvalidArgument, purpose)
	}
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := a.c.LeaseCredential(cctx, &authorityv1.LeaseCredentialRequest{Purpose: p, JobId: jobID, Resource: repo})
	if err != nil {
		return publish.Lease{}, fromStatus("authority", err)
	}
	l := resp.GetLease()
	secret, err := a.open(seal.LeaseContext(l.GetLeaseId(), l.GetJobId(), l.GetResource()), resp.GetSealedCredential())
	if err != nil {
		_, _ = a.c.RevokeCredential(context.WithoutCancel(ctx), &authorityv1.RevokeCredentialRequest{LeaseId: l.GetLeaseId(), Reason: "the sealed credential did not open"})
		return publish.Lease{}, err
	}
	return publish.Lease{ID: l.GetLeaseId(), Secret: secret}, nil
}

func (a *Authority) open(context, box []byte) ([]byte, error) {
	cert, err := a.tls.Certificate()
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, err
	}
	key, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("peers: the publisher's key is %T, not ECDSA: sealed credentials cannot be opened", cert.PrivateKey)
	}
	return seal.Open(leaf, key, context, box)
}

// Use implements publish.Authority.
func (a *Authority) Use(ctx context.Context, leaseID, jobID, repo string) error {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := a.c.UseLease(ctx, &authorityv1.UseLeaseRequest{LeaseId: leaseID, JobId: jobID, Resource: repo})
	return fromStatus("authority", err)
}

// Revoke implements publish.Authority.
func (a *Authority) Revoke(ctx context.Context, leaseID, reason string) error {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := a.c.RevokeCredential(ctx, &authorityv1.RevokeCredentialRequest{LeaseId: leaseID, Reason: reason})
	return fromStatus("authority", err)
}

// ActiveLeases implements publish.Authority.
func (a *Authority) ActiveLeases(ctx context.Context, jobID string) ([]string, error) {
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
			return nil, fromStatus("authority", err)
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

// Executor is publish.Executor over the executor's API.
type Executor struct {
	c executorv1.ExecutorServiceClient
}

// NewExecutor returns the executor adapter.
func NewExecutor(cc grpc.ClientConnInterface) *Executor {
	return &Executor{c: executorv1.NewExecutorServiceClient(cc)}
}

// Artifact implements publish.Executor.
func (e *Executor) Artifact(ctx context.Context, jobID, digest string, w io.Writer) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, artifactTimeout)
	defer cancel()
	stream, err := e.c.GetArtifact(ctx, &executorv1.GetArtifactRequest{JobId: jobID, BundleDigest: digest})
	if err != nil {
		return nil, fromStatus("executor", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, fromStatus("executor", err)
	}
	h := first.GetHeader()
	if h == nil {
		return nil, errors.New("peers: GetArtifact did not start with a header")
	}
	var got int64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if got != h.GetSize() {
				return nil, fmt.Errorf("%w: executor: GetArtifact sent %d bytes of a %d-byte bundle", errdefs.ErrUnavailable, got, h.GetSize())
			}
			return h.GetProvenance(), nil
		}
		if err != nil {
			return nil, fromStatus("executor", err)
		}
		if msg.GetHeader() != nil {
			return nil, errors.New("peers: GetArtifact sent a second header")
		}
		if got += int64(len(msg.GetChunk())); got > h.GetSize() {
			return nil, fmt.Errorf("%w: executor: GetArtifact sent more than the %d bytes its header announced", errdefs.ErrUnavailable, h.GetSize())
		}
		if _, err := w.Write(msg.GetChunk()); err != nil {
			return nil, err
		}
	}
}
