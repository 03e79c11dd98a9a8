package pki

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
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
	tmpl := &x509.Certificate{
		// The subject is informational; identity comes only from the URI
		// SAN. The name alone fits the 64-character CN limit.
		Subject: pkix.Name{
			Organization:       []string{"Airlock"},
			OrganizationalUnit: []string{string(id.Kind)},
			CommonName:         id.Name,
		},
		ExtKeyUsage: extKeyUsages(id.Kind),
		URIs:        []*url.URL{id.URL()},
		DNSNames:    slices.Clone(opts.DNSNames),
		IPAddresses: slices.Clone(opts.IPAddresses),
	}
	if id.Kind == identity.KindService {
		// Standard tools such as grpc-health-probe verify by host name; these
		// SANs let them check a service on its own host without weakening the
		// SPIFFE ID check our own clients do.
		tmpl.DNSNames = appendMissing(tmpl.DNSNames, "localhost")
		tmpl.IPAddresses = appendMissingIP(tmpl.IPAddresses, net.IPv4(127, 0, 0, 1), net.IPv6loopback)
	}
	kp, err := ca.sign(tmpl, opts)
	if err != nil {
		return nil, fmt.Errorf("pki: issue %s: %w", id, err)
	}
	kp.ID = id
	return kp, nil
}

// IssueHost creates a new key and a plain TLS server certificate for the
// host names and addresses in opts (at least one), for a server outside
// Airlock's SPIFFE model that standard clients such as git and curl check by
// host name: the dev stack's git server. It has no URI SAN, so it names no
// Airlock identity and every Airlock verifier, which takes the peer's
// identity from exactly one URI SAN, refuses it; and it is good for
// ServerAuth only. The returned pair's ID is the zero ID, so WriteKeyPair
// refuses it: write it with WriteHostPair.
func (ca *CA) IssueHost(opts IssueOptions) (*KeyPair, error) {
	if len(opts.DNSNames) == 0 && len(opts.IPAddresses) == 0 {
		return nil, errors.New("pki: issue host certificate: no DNS name or IP address")
	}
	var name string
	if len(opts.DNSNames) > 0 {
		name = opts.DNSNames[0]
	} else {
		name = opts.IPAddresses[0].String()
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"Airlock"}, OrganizationalUnit: []string{"host"}, CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    slices.Clone(opts.DNSNames),
		IPAddresses: slices.Clone(opts.IPAddresses),
	}
	kp, err := ca.sign(tmpl, opts)
	if err != nil {
		return nil, fmt.Errorf("pki: issue host certificate for %s: %w", name, err)
	}
	return kp, nil
}

// sign completes tmpl with a fresh key, a serial and opts' validity (never
// past the CA's own), and signs it.
func (ca *CA) sign(tmpl *x509.Certificate, opts IssueOptions) (*KeyPair, error) {
	if opts.Validity < 0 {
		return nil, fmt.Errorf("negative validity %v", opts.Validity)
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
		return nil, err
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := marshalKey(key)
	if err != nil {
		return nil, err
	}
	return &KeyPair{CertPEM: encodeCert(cert), KeyPEM: keyPEM, Cert: cert}, nil
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
