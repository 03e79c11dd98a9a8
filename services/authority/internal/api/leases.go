package api

import (
	"context"
	"crypto/x509"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/leases"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The lease RPCs: validate, call package leases, map the error.

var leasePurposeToProto = map[string]authorityv1.LeasePurpose{
	leases.PurposeDeploy:   authorityv1.LeasePurpose_LEASE_PURPOSE_DEPLOY,
	leases.PurposeRead:     authorityv1.LeasePurpose_LEASE_PURPOSE_READ,
	leases.PurposeBrokered: authorityv1.LeasePurpose_LEASE_PURPOSE_BROKERED,
}

func leaseToProto(l store.Lease) *authorityv1.Lease {
	return &authorityv1.Lease{
		LeaseId: l.ID, Purpose: leasePurposeToProto[l.Purpose], JobId: l.JobID, Resource: l.Resource, Holder: l.Holder,
		IssuedAt: timestamppb.New(l.IssuedAt), ExpiresAt: timestamppb.New(l.ExpiresAt),
		RevokedAt: optTime(l.RevokedAt),
	}
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
	for p, v := range leasePurposeToProto {
		if req.GetPurpose() == v {
			purpose = p
		}
	}
	lr := leases.Request{Purpose: purpose, JobID: req.GetJobId(), Resource: req.GetResource()}
	if d := req.GetTtl(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "ttl: %v", err)
		}
		lr.TTL = d.AsDuration()
	}
	out, err := s.cfg.Leases.Lease(ctx, id, cert, lr)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	resp := &authorityv1.LeaseCredentialResponse{Lease: leaseToProto(out.Lease), SealedCredential: out.Sealed}
	if b := out.Brokered; b != nil {
		resp.Brokered = &authorityv1.BrokeredCredential{Name: b.Name, Hosts: b.Hosts, Header: b.Header, Format: b.Format,
			BasicUser: b.BasicUser, UpstreamCa: b.UpstreamCA}
	}
	return resp, nil
}

func (s *Service) RevokeCredential(ctx context.Context, req *authorityv1.RevokeCredentialRequest) (*authorityv1.RevokeCredentialResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.cfg.Leases.Revoke(ctx, id, req.GetLeaseId(), req.GetReason())
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
	list, next, err := s.cfg.Leases.List(ctx, id, leases.Query{
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

func (s *Service) UseLease(ctx context.Context, req *authorityv1.UseLeaseRequest) (*authorityv1.UseLeaseResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.cfg.Leases.Use(ctx, id, leases.UseRequest{LeaseID: req.GetLeaseId(), JobID: req.GetJobId(), Resource: req.GetResource()})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.UseLeaseResponse{Lease: leaseToProto(l)}, nil
}
