package authorityclient

import (
	"context"
	"errors"

	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/seal"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

// LeaseBrokered leases brokered credential name for job jobID, which
// must be placed on this executor and have asked for it. The credential
// comes sealed to the executor's certificate and is opened here; a lease
// whose credential does not open is revoked at once.
func (c *Client) LeaseBrokered(ctx context.Context, jobID, name string) (runs.BrokeredLease, error) {
	if c.tls == nil {
		return runs.BrokeredLease{}, errors.New("authorityclient: no certificate of the executor's own to open brokered credentials with")
	}
	resp, err := c.api.LeaseCredential(ctx, &authorityv1.LeaseCredentialRequest{
		Purpose: authorityv1.LeasePurpose_LEASE_PURPOSE_BROKERED, JobId: jobID, Resource: name})
	if err != nil {
		return runs.BrokeredLease{}, errgrpc.FromPeer("authority", err)
	}
	l, b := resp.GetLease(), resp.GetBrokered()
	secret, err := c.open(seal.LeaseContext(l.GetLeaseId(), l.GetJobId(), l.GetResource()), resp.GetSealedCredential())
	if err == nil && (b == nil || l.GetResource() != name || l.GetJobId() != jobID) {
		clear(secret)
		err = errors.New("authorityclient: the authority answered a brokered lease for another credential")
	}
	if err != nil {
		_ = c.RevokeLease(context.WithoutCancel(ctx), l.GetLeaseId(), "the brokered credential could not be opened")
		return runs.BrokeredLease{}, err
	}
	return runs.BrokeredLease{LeaseID: l.GetLeaseId(), Name: b.GetName(), Hosts: b.GetHosts(), Header: b.GetHeader(), Format: b.GetFormat(),
		BasicUser: b.GetBasicUser(), UpstreamCA: b.GetUpstreamCa(), Secret: secret, Expires: l.GetExpiresAt().AsTime()}, nil
}

// RevokeLease ends a lease this executor holds (a job's proxy that
// stopped needs its credential no more).
func (c *Client) RevokeLease(ctx context.Context, leaseID, reason string) error {
	_, err := c.api.RevokeCredential(ctx, &authorityv1.RevokeCredentialRequest{LeaseId: leaseID, Reason: reason})
	return errgrpc.FromPeer("authority", err)
}

func (c *Client) open(context, box []byte) ([]byte, error) {
	cert, err := c.tls.Certificate()
	if err != nil {
		return nil, err
	}
	return seal.OpenTLS(cert, context, box)
}
