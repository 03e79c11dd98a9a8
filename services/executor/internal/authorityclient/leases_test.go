package authorityclient

import (
	"context"
	"crypto/x509"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/seal"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/test/bufconntest"
)

// leaseServer plays the authority's LeaseCredential for brokered
// credentials: it seals to the certificate it was given, as the authority
// seals to the caller's, and records revocations.
type leaseServer struct {
	authorityv1.UnimplementedAuthorityServiceServer
	to *x509.Certificate
	// context, when set, is sealed with instead of the lease's.
	context []byte

	mu      sync.Mutex
	revoked []string
}

func (s *leaseServer) LeaseCredential(_ context.Context, req *authorityv1.LeaseCredentialRequest) (*authorityv1.LeaseCredentialResponse, error) {
	if req.GetPurpose() != authorityv1.LeasePurpose_LEASE_PURPOSE_BROKERED {
		return nil, status.Error(codes.PermissionDenied, "only the publisher leases deploy credentials")
	}
	if req.GetResource() == "other" {
		return nil, status.Error(codes.PermissionDenied, `resource: job "j1" did not ask for the brokered credential "other"`)
	}
	ctx := seal.LeaseContext("l1", req.GetJobId(), req.GetResource())
	if s.context != nil {
		ctx = s.context
	}
	box, err := seal.Seal(s.to, ctx, []byte("s3cret"))
	if err != nil {
		return nil, err
	}
	return &authorityv1.LeaseCredentialResponse{
		Lease: &authorityv1.Lease{LeaseId: "l1", Purpose: req.GetPurpose(), JobId: req.GetJobId(), Resource: req.GetResource(),
			ExpiresAt: timestamppb.New(time.Date(2030, 1, 1, 1, 0, 0, 0, time.UTC))},
		SealedCredential: box,
		Brokered: &authorityv1.BrokeredCredential{Name: req.GetResource(), Hosts: []string{"api.github.test", "*.gh.test"},
			Header: "Authorization", Format: "Bearer {value}", UpstreamCa: []byte("PEM")},
	}, nil
}

func (s *leaseServer) RevokeCredential(_ context.Context, req *authorityv1.RevokeCredentialRequest) (*authorityv1.RevokeCredentialResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revoked = append(s.revoked, req.GetLeaseId()+": "+req.GetReason())
	return &authorityv1.RevokeCredentialResponse{Lease: &authorityv1.Lease{LeaseId: req.GetLeaseId()}}, nil
}

// executorIdentity makes a CA and the executor's certificate, and returns
// its source and leaf.
func executorIdentity(t *testing.T) (*tlsconfig.Source, *x509.Certificate) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	id := identity.Service("airlock.test", identity.ServiceExecutor)
	if _, err := pki.Init(dir, "airlock.test", nil); err != nil {
		t.Fatal(err)
	}
	cert, key := pki.Paths(dir, id)
	src, err := tlsconfig.NewFileSource(pki.CAPath(dir), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := src.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return src, leaf
}

func dialLeases(t *testing.T, srv *leaseServer, src *tlsconfig.Source) *Client {
	t.Helper()
	return New(bufconntest.Dial(t, func(r grpc.ServiceRegistrar) { authorityv1.RegisterAuthorityServiceServer(r, srv) }), src)
}

func TestLeaseBrokered(t *testing.T) {
	src, leaf := executorIdentity(t)
	srv := &leaseServer{to: leaf}
	c := dialLeases(t, srv, src)
	b, err := c.LeaseBrokered(t.Context(), "j1", "github")
	if err != nil {
		t.Fatal(err)
	}
	if b.LeaseID != "l1" || b.Name != "github" || string(b.Secret) != "s3cret" || len(b.Hosts) != 2 || b.Hosts[1] != "*.gh.test" ||
		b.Header != "Authorization" || b.Format != "Bearer {value}" || string(b.UpstreamCA) != "PEM" ||
		!b.Expires.Equal(time.Date(2030, 1, 1, 1, 0, 0, 0, time.UTC)) {
		t.Fatalf("brokered = %+v", b)
	}
	if err := c.RevokeLease(t.Context(), "l1", "the job ended"); err != nil {
		t.Fatal(err)
	}
	_, err = c.LeaseBrokered(t.Context(), "j1", "other")
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("a name the job did not ask for = %v; want permission denied", err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.revoked) != 1 || srv.revoked[0] != "l1: the job ended" {
		t.Fatalf("revoked = %q", srv.revoked)
	}
}

// TestLeaseBrokeredUnopenable: a credential sealed to someone else, or
// for another lease, is not returned, and its lease is revoked.
func TestLeaseBrokeredUnopenable(t *testing.T) {
	src, leaf := executorIdentity(t)
	_, otherLeaf := executorIdentity(t)
	for name, srv := range map[string]*leaseServer{
		"another certificate": {to: otherLeaf},
		"another context":     {to: leaf, context: seal.LeaseContext("l1", "j2", "github")},
	} {
		c := dialLeases(t, srv, src)
		if b, err := c.LeaseBrokered(t.Context(), "j1", "github"); err == nil || b.Secret != nil {
			t.Errorf("%s: %+v, %v; want an error", name, b, err)
		}
		srv.mu.Lock()
		if len(srv.revoked) != 1 {
			t.Errorf("%s: revoked %q; want the lease revoked", name, srv.revoked)
		}
		srv.mu.Unlock()
	}
	if _, err := New(nil, nil).LeaseBrokered(t.Context(), "j1", "github"); err == nil {
		t.Error("a client without a certificate leased")
	}
}
