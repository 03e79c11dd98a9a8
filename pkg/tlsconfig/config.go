package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/identity"
)

// ErrPeerRejected is wrapped by every handshake failure of our own making
// (as opposed to a TLS protocol error), so a caller can tell "the peer's
// certificate was not acceptable" from "the network broke".
var ErrPeerRejected = errors.New("tlsconfig: peer rejected")

// alpnH2 is the only application protocol Airlock speaks. grpc's
// credentials.NewTLS appends it too, but a config used with anything else
// (a health probe, a test) must still negotiate HTTP/2.
const alpnH2 = "h2"

// ServerConfig returns a server config that requires every client to present
// a certificate that chains to src's current CA bundle, is valid now, allows
// client authentication, and has exactly one URI SAN naming an identity in
// trustDomain. Which identities may call which RPC is pkg/authz's decision,
// not this one's.
//
// Chain verification is done by hand in VerifyConnection rather than by
// setting ClientCAs, because ClientCAs is fixed when the config is built and
// would not see a rotated CA bundle. VerifyConnection rather than
// VerifyPeerCertificate because the latter is skipped on resumed sessions,
// which would let a client that was once admitted back in after its CA has
// been removed from the bundle.
func ServerConfig(src *Source, trustDomain string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{alpnH2},
		// RequireAnyClientCert makes a certificate mandatory while leaving
		// its verification to VerifyConnection below.
		ClientAuth: tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return src.Certificate()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := verifyPeer(src, cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
			if err != nil {
				return fmt.Errorf("%w: client: %w", ErrPeerRejected, err)
			}
			if !id.MemberOf(trustDomain) {
				return fmt.Errorf("%w: client %s: trust domain %q, want %q", ErrPeerRejected, id, id.TrustDomain, trustDomain)
			}
			return nil
		},
	}
}

// ClientConfig returns a client config that presents src's current
// certificate and accepts only the server whose certificate chains to src's
// current CA bundle, allows server authentication, and has exactly one URI
// SAN equal to server.
//
// InsecureSkipVerify is set, yet the connection is not insecure: it turns
// off only Go's built-in verification, which checks the host name and reads
// RootCAs once. VerifyConnection then performs the complete chain
// verification itself, against the roots current at handshake time, and
// pins the server's SPIFFE ID, which is a stronger check than a host name.
// VerifyConnection runs on every handshake, resumed or not, and any error it
// returns aborts the handshake.
func ClientConfig(src *Source, server identity.ID) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{alpnH2},
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return src.Certificate()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := verifyPeer(src, cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return fmt.Errorf("%w: server: %w", ErrPeerRejected, err)
			}
			if id != server {
				return fmt.Errorf("%w: server is %s, want %s", ErrPeerRejected, id, server)
			}
			return nil
		},
	}
}

// verifyPeer verifies a peer's certificate chain against src's current roots
// for usage eku and returns the identity of its leaf.
func verifyPeer(src *Source, chain []*x509.Certificate, eku x509.ExtKeyUsage) (identity.ID, error) {
	if len(chain) == 0 {
		return identity.ID{}, errors.New("no certificate presented")
	}
	roots, err := src.Roots()
	if err != nil {
		return identity.ID{}, err
	}
	leaf := chain[0]
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	_, err = leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: intermediates,
		CurrentTime:   time.Now(),
		KeyUsages:     []x509.ExtKeyUsage{eku},
	})
	if err != nil {
		return identity.ID{}, fmt.Errorf("certificate %s: %w", describe(leaf), err)
	}
	return identity.FromCertificate(leaf)
}

// describe names a certificate in an error by its URI SANs, which is what an
// operator will recognise, falling back to the subject.
func describe(c *x509.Certificate) string {
	if len(c.URIs) > 0 {
		return fmt.Sprint(c.URIs)
	}
	return fmt.Sprintf("%q", c.Subject.String())
}
