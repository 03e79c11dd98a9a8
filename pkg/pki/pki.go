// Package pki owns Airlock's private certificate authority: creating it,
// issuing X.509 certificates whose single URI SAN is an identity.ID, and the
// on-disk layout of the CA and issued key pairs. It is for setup tools (an
// "airlock pki" command) and test harnesses; a service's run-time code must
// not import it, because a running service reads its files through
// pkg/tlsconfig and never holds the CA key.
//
// Layout under a directory DIR:
//
//	DIR/ca.crt, DIR/ca.key                        the CA
//	DIR/<kind>/<name>.crt, DIR/<kind>/<name>.key  one pair per identity
//
// Keys are PKCS#8 PEM ("PRIVATE KEY"), mode 0600; certificates mode 0644;
// directories 0700. Every file is replaced atomically.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/identity"
)

const (
	// DefaultCAValidity is long because replacing a CA means reissuing and
	// redistributing every certificate.
	DefaultCAValidity = 10 * 365 * 24 * time.Hour
	// DefaultLeafValidity is how long an issued certificate lasts when
	// IssueOptions.Validity is zero.
	DefaultLeafValidity = 365 * 24 * time.Hour

	// backdate absorbs clock skew between the issuing host and verifiers, so
	// a freshly issued certificate is not "not yet valid" elsewhere.
	backdate = time.Minute

	caCertFile = "ca.crt"
	caKeyFile  = "ca.key"

	pemCertificate = "CERTIFICATE"
	pemPrivateKey  = "PRIVATE KEY"
)

// ErrCAExists is returned when creating a CA where one already is. A second
// CA key would silently orphan every certificate the first one issued.
var ErrCAExists = errors.New("pki: CA key already exists")

// CA is a loaded certificate authority able to issue certificates for one
// trust domain.
type CA struct {
	Cert        *x509.Certificate
	Key         crypto.Signer
	TrustDomain string
}

// NewCA creates a self-signed CA for trustDomain. A zero validity means
// DefaultCAValidity.
//
// The trust domain is recorded in the CA certificate as its only URI SAN,
// spiffe://TRUST_DOMAIN (the X509-SVID form for a signing certificate), which
// is where LoadCA reads it back. The subject CN "Airlock CA TRUST_DOMAIN" is
// for people reading the certificate; nothing parses it.
func NewCA(trustDomain string, validity time.Duration) (*CA, error) {
	if err := identity.ValidateTrustDomain(trustDomain); err != nil {
		return nil, fmt.Errorf("pki: new CA: %w", err)
	}
	if validity < 0 {
		return nil, fmt.Errorf("pki: new CA: negative validity %v", validity)
	}
	if validity == 0 {
		validity = DefaultCAValidity
	}
	key, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("pki: new CA: %w", err)
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, fmt.Errorf("pki: new CA: %w", err)
	}
	notBefore := time.Now().Add(-backdate)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"Airlock"},
			CommonName:   "Airlock CA " + trustDomain,
		},
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		// Path length zero: this CA signs leaves only. An intermediate
		// would be a second key able to mint identities.
		MaxPathLen:     0,
		MaxPathLenZero: true,
		KeyUsage:       x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:           []*url.URL{trustDomainURL(trustDomain)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: new CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: new CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, TrustDomain: trustDomain}, nil
}

// LoadCA reads DIR/ca.crt and DIR/ca.key and checks that they belong
// together, so a CA whose files were half replaced fails here rather than
// issuing certificates nobody can verify.
func LoadCA(dir string) (*CA, error) {
	certPath, keyPath := CAPath(dir), CAKeyPath(dir)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %w", err)
	}
	cert, err := ParseCertificatePEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %s: %w", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %w", err)
	}
	key, err := ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %s: %w", keyPath, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("pki: load CA: %s is not a CA certificate", certPath)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("pki: load CA: %s does not match the public key in %s", keyPath, certPath)
	}
	td, err := caTrustDomain(cert)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %s: %w", certPath, err)
	}
	return &CA{Cert: cert, Key: key, TrustDomain: td}, nil
}

// Save writes the CA to DIR/ca.key and DIR/ca.crt, creating DIR if needed.
// It refuses, with an error wrapping ErrCAExists, if DIR/ca.key already
// exists, even if a concurrent Save creates it between the check and the
// write.
func (ca *CA) Save(dir string) error {
	keyPEM, err := marshalKey(ca.Key)
	if err != nil {
		return fmt.Errorf("pki: save CA: %w", err)
	}
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return fmt.Errorf("pki: save CA: %w", err)
	}
	// The key goes first, exclusively, so that the existence of ca.key is
	// the lock: whoever creates it owns the directory's CA, and ca.crt
	// always follows the key that won.
	if err := atomicfile.WriteExclusive(CAKeyPath(dir), keyPEM, keyPerm); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %s; refusing to overwrite it", ErrCAExists, CAKeyPath(dir))
		}
		return fmt.Errorf("pki: save CA: %w", err)
	}
	if err := WriteFileAtomic(CAPath(dir), encodeCert(ca.Cert), certPerm); err != nil {
		return fmt.Errorf("pki: save CA: %w", err)
	}
	return nil
}

// CAPath returns the path of the CA certificate under dir, the trust bundle
// every service and client reads.
func CAPath(dir string) string {
	return filepath.Join(dir, caCertFile)
}

// CAKeyPath returns the path of the CA private key under dir.
func CAKeyPath(dir string) string {
	return filepath.Join(dir, caKeyFile)
}

// ParseCertificatePEM parses exactly one PEM CERTIFICATE block.
func ParseCertificatePEM(data []byte) (*x509.Certificate, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM data")
	}
	if block.Type != pemCertificate {
		return nil, fmt.Errorf("PEM block is %q, want %q", block.Type, pemCertificate)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("trailing data after the certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// ParsePrivateKeyPEM parses one PEM "PRIVATE KEY" (PKCS#8) block holding a
// key that can sign.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM data")
	}
	if block.Type != pemPrivateKey {
		return nil, fmt.Errorf("PEM block is %q, want %q (PKCS#8)", block.Type, pemPrivateKey)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", key)
	}
	return signer, nil
}

func caTrustDomain(cert *x509.Certificate) (string, error) {
	if len(cert.URIs) != 1 {
		return "", fmt.Errorf("CA certificate has %d URI SANs, want exactly 1 (spiffe://TRUST_DOMAIN)", len(cert.URIs))
	}
	u := cert.URIs[0]
	if u.Scheme != "spiffe" || u.Path != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("CA certificate URI SAN %q is not spiffe://TRUST_DOMAIN", u)
	}
	if err := identity.ValidateTrustDomain(u.Host); err != nil {
		return "", err
	}
	return u.Host, nil
}

func trustDomainURL(td string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: td}
}

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// NewSerial returns a random positive 128-bit serial, for every certificate
// Airlock makes. Randomness, not a counter, is what keeps serials unique
// without shared state between issuers and makes them unpredictable to
// anyone trying to forge a collision.
func NewSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("generating serial: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func encodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: cert.Raw})
}

func marshalKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}
