package identity

import (
	"context"
	"crypto/x509"
	"fmt"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// FromCertificate reads the ID from a certificate's URI SAN. It does not
// verify the certificate; that is the TLS layer's job (see pkg/tlsconfig).
// Exactly one URI SAN is required, as the X509-SVID specification says:
// with two, which one names the holder would be a matter of convention,
// and conventions differ between verifiers.
func FromCertificate(cert *x509.Certificate) (ID, error) {
	if cert == nil {
		return ID{}, fmt.Errorf("%w: no certificate", ErrNoID)
	}
	switch n := len(cert.URIs); n {
	case 0:
		return ID{}, fmt.Errorf("%w: certificate has no URI SAN", ErrNoID)
	case 1:
		return Parse(cert.URIs[0].String())
	default:
		return ID{}, fmt.Errorf("%w: certificate has %d URI SANs, want exactly 1", ErrInvalidID, n)
	}
}

// FromPeer reads the ID of the gRPC peer in ctx from the leaf certificate it
// presented. It trusts that the transport verified that certificate: a server
// built with pkg/tlsconfig refuses the handshake otherwise, so by the time a
// handler runs the leaf is one our CA issued.
func FromPeer(ctx context.Context) (ID, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ID{}, fmt.Errorf("%w: no peer in context", ErrNoID)
	}
	if p.AuthInfo == nil {
		return ID{}, fmt.Errorf("%w: peer is not authenticated", ErrNoID)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return ID{}, fmt.Errorf("%w: peer is authenticated by %q, not TLS", ErrNoID, p.AuthInfo.AuthType())
	}
	if len(info.State.PeerCertificates) == 0 {
		return ID{}, fmt.Errorf("%w: peer presented no certificate", ErrNoID)
	}
	return FromCertificate(info.State.PeerCertificates[0])
}

// contextKey is unexported so no other package can read or forge the
// caller's ID except through NewContext and FromContext.
type contextKey struct{}

// NewContext returns a copy of ctx carrying id. The server stores the caller's
// ID once, after extracting it from the peer, so that nothing downstream
// re-derives it from the transport.
func NewContext(ctx context.Context, id ID) context.Context {
	return context.WithValue(ctx, contextKey{}, id)
}

// FromContext returns the ID stored by NewContext. ok is false when there is
// none, or when the stored ID is the zero ID, so a caller cannot mistake "no
// identity" for an identity.
func FromContext(ctx context.Context) (id ID, ok bool) {
	id, ok = ctx.Value(contextKey{}).(ID)
	return id, ok && !id.IsZero()
}
