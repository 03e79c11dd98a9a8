package server

import (
	"context"

	"github.com/airlockhq/airlock/services/executor/internal/authorityclient"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

// credentialLeaser is the authority client as the run manager leases
// brokered credentials through it.
func credentialLeaser(c *authorityclient.Client) runs.CredentialLeaser { return brokeredLeaser{c} }

type brokeredLeaser struct{ c *authorityclient.Client }

func (b brokeredLeaser) LeaseBrokered(ctx context.Context, jobID, name string) (runs.BrokeredLease, error) {
	l, err := b.c.LeaseBrokered(ctx, jobID, name)
	if err != nil {
		return runs.BrokeredLease{}, err
	}
	return runs.BrokeredLease{LeaseID: l.LeaseID, Name: l.Name, Hosts: l.Hosts, Header: l.Header, Format: l.Format,
		BasicUser: l.BasicUser, UpstreamCA: l.UpstreamCA, Secret: l.Secret, Expires: l.Expires}, nil
}

func (b brokeredLeaser) RevokeLease(ctx context.Context, leaseID, reason string) error {
	return b.c.RevokeLease(ctx, leaseID, reason)
}
