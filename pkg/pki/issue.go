package pki

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"

	"github.com/airlockhq/airlock/pkg/identity"
)

// IssueOptions adjusts a certificate from Issue. The zero value gives the
// defaults.
type IssueOptions struct {
	// Validity is the lifetime from NotBefore; zero means DefaultLeafValidity.
	Validity time.Duration
	// NotBefore defaults to one minute ago. Tests set it to make certificates
	// that are expired or not yet valid.
	NotBefore time.Time
	// DNSNames and IPAddresses are added to the SANs. Service certificates
	// always carry localhost, 127.0.0.1 and ::1 as well.
	DNSNames    []string
	IPAddresses []net.IP
}

// KeyPair is an issued certificate with its private key, in PEM as written to
// disk and with the certificate parsed.
type KeyPair struct {
	ID      identity.ID
	CertPEM []byte
	KeyPEM  []byte
	Cert    *x509.Certificate
}

// TLSCertificate returns the pair as a tls.Certificate, for tests and tools
// that hold a pair in memory instead of reading files.
func (kp *KeyPair) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
}

// Issue creates a new key and a certificate for id signed by the CA. The
// certificate's only URI SAN is id, because verifiers take the peer's
// identity from exactly one URI SAN and refuse anything else.
//
// Services get ServerAuth and ClientAuth since they call each other; every
// other kind only ever dials out and gets ClientAuth alone, so a stolen
// client key cannot be used to impersonate a server.
func (ca *CA) Issue(id identity.ID, opts IssueOptions) (*KeyPair, error) {
	if _, err := identity.New(id.TrustDomain, id.Kind, id.Name); err != nil {
		return nil, fmt.Errorf("pki: issue: %w", err)
	}
	if id.TrustDomain != ca.TrustDomain {
		return nil, fmt.Errorf("pki: issue %s: trust domain %q does not match CA trust domain %q", id, id.TrustDomain, ca.TrustDomain)
	}
	if opts.Validity < 0 {
		return nil, fmt.Errorf("pki: issue %s: negative validity %v", id, opts.Validity)
	}
	validity := opts.Validity
	if validity == 0 {
		validity = DefaultLeafValidity
	}
	notBefore := opts.NotBefore
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-backdate)
	}
	notAfter := notBefore.Add(validity)
	// A leaf cannot be verified once its CA has expired, so a longer
	// lifetime would only be misleading.
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}

	key, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("pki: issue %s: %w", id, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("pki: issue %s: %w", id, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// The subject is informational; identity comes only from the URI
		// SAN. The name alone fits the 64-character CN limit.
		Subject: pkix.Name{
			Organization:       []string{"Airlock"},
			OrganizationalUnit: []string{string(id.Kind)},
			CommonName:         id.Name,
		},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           extKeyUsages(id.Kind),
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id.URL()},
		DNSNames:              slices.Clone(opts.DNSNames),
		IPAddresses:           slices.Clone(opts.IPAddresses),
	}
	if id.Kind == identity.KindService {
		// Standard tools such as grpc-health-probe verify by host name; these
		// SANs let them check a service on its own host without weakening the
		// SPIFFE ID check our own clients do.
		tmpl.DNSNames = appendMissing(tmpl.DNSNames, "localhost")
		tmpl.IPAddresses = appendMissingIP(tmpl.IPAddresses, net.IPv4(127, 0, 0, 1), net.IPv6loopback)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: issue %s: %w", id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: issue %s: %w", id, err)
	}
	keyPEM, err := marshalKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: issue %s: %w", id, err)
	}
	return &KeyPair{ID: id, CertPEM: encodeCert(cert), KeyPEM: keyPEM, Cert: cert}, nil
}

func extKeyUsages(kind identity.Kind) []x509.ExtKeyUsage {
	if kind == identity.KindService {
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
}

func appendMissing(list []string, add ...string) []string {
	for _, s := range add {
		if !slices.Contains(list, s) {
			list = append(list, s)
		}
	}
	return list
}

func appendMissingIP(list []net.IP, add ...net.IP) []net.IP {
	for _, ip := range add {
		if !slices.ContainsFunc(list, ip.Equal) {
			list = append(list, ip)
		}
	}
	return list
}
