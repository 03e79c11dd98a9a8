// Package tlsconfig owns the mutual-TLS configuration of every Airlock
// connection: a Source that keeps the CA bundle and our own key pair current
// as their files are rotated, a server config that admits only peers with a
// valid SPIFFE ID in our trust domain, and a client config that pins the one
// server identity it expects. Peers are verified by SPIFFE ID, never by host
// name. Services, clients and test harnesses import it; it must not import
// anything that knows about RPCs or authorization (see pkg/authz).
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/airlockhq/airlock/pkg/identity"
)

// Source provides the current CA bundle and key pair from three files. It
// stats the files on every use and reloads them when any has changed, so a
// rotation needs no restart and costs each handshake only three stat calls.
//
// A reload that fails, such as a key and certificate that do not match
// because a rotation is half written, keeps the last good material in
// service and reports the error once per change of the files. A Source never
// serves a certificate with a key it does not belong to.
//
// A Source is safe for concurrent use.
type Source struct {
	caFile, certFile, keyFile string
	onError                   func(error)

	mu sync.Mutex
	// seen is the file state the last load attempt was made from, good or
	// bad; an unchanged state is not retried, so a broken file costs one
	// error report rather than one per handshake.
	seen    [3]os.FileInfo
	current *material
}

// material is one consistent, validated load of all three files.
type material struct {
	cert  *tls.Certificate
	roots *x509.CertPool
	id    identity.ID
}

// Option configures a Source.
type Option func(*Source)

// WithLogger reports reload failures to logger. Without any option they go
// to slog.Default(), because a rotation that silently fails would only be
// noticed when the old certificate expires.
func WithLogger(logger *slog.Logger) Option {
	return func(s *Source) {
		s.onError = func(err error) {
			logger.Error("tlsconfig: keeping previous certificates", "error", err)
		}
	}
}

// WithErrorHandler calls fn with each reload failure instead of logging it.
// fn is called with the Source's lock held and must not call back into it.
func WithErrorHandler(fn func(error)) Option {
	return func(s *Source) { s.onError = fn }
}

// NewFileSource loads the CA bundle (one or more PEM CA certificates), our
// certificate (leaf first, then any intermediates) and its PKCS#8 or other
// PEM private key. Unlike later reloads, this first load must succeed: a
// service that cannot read its identity at start-up should not start.
func NewFileSource(caFile, certFile, keyFile string, opts ...Option) (*Source, error) {
	s := &Source{caFile: caFile, certFile: certFile, keyFile: keyFile}
	WithLogger(slog.Default())(s)
	for _, opt := range opts {
		opt(s)
	}
	seen, err := s.stat()
	if err != nil {
		return nil, err
	}
	m, err := s.load()
	if err != nil {
		return nil, err
	}
	s.seen, s.current = seen, m
	return s, nil
}

// Certificate returns our current certificate and key.
func (s *Source) Certificate() (*tls.Certificate, error) {
	m, err := s.get()
	if err != nil {
		return nil, err
	}
	return m.cert, nil
}

// Roots returns the current CA bundle that peers must chain to.
func (s *Source) Roots() (*x509.CertPool, error) {
	m, err := s.get()
	if err != nil {
		return nil, err
	}
	return m.roots, nil
}

// ID returns our own SPIFFE ID, read from the current leaf certificate.
func (s *Source) ID() (identity.ID, error) {
	m, err := s.get()
	if err != nil {
		return identity.ID{}, err
	}
	return m.id, nil
}

// Verify checks our own certificate chain against the current CA bundle,
// as every peer will check it.
func (s *Source) Verify() error {
	m, err := s.get()
	if err != nil {
		return err
	}
	chain := []*x509.Certificate{m.cert.Leaf}
	for _, der := range m.cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("tlsconfig: %s: %w", s.certFile, err)
		}
		chain = append(chain, c)
	}
	_, err = verifyPeer(s, chain, x509.ExtKeyUsageAny)
	return err
}

func (s *Source) get() (*material, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshLocked()
	if s.current == nil {
		// Unreachable for a Source made by NewFileSource; guards the zero
		// value.
		return nil, errors.New("tlsconfig: source has no certificates loaded")
	}
	return s.current, nil
}

func (s *Source) refreshLocked() {
	seen, statErr := s.stat()
	if sameFiles(seen, s.seen) {
		return
	}
	s.seen = seen
	if statErr != nil {
		s.onError(statErr)
		return
	}
	m, err := s.load()
	if err != nil {
		s.onError(err)
		return
	}
	s.current = m
}

// stat returns the state of the three files; a file that cannot be stat'ed
// has a nil entry, so that it counts as a change when it comes back.
func (s *Source) stat() ([3]os.FileInfo, error) {
	var infos [3]os.FileInfo
	var errs []error
	for i, name := range []string{s.caFile, s.certFile, s.keyFile} {
		fi, err := os.Stat(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("tlsconfig: %w", err))
			continue
		}
		infos[i] = fi
	}
	return infos, errors.Join(errs...)
}

// sameFiles compares by inode as well as size and modification time: an
// atomic rename replaces the inode, and two quick rewrites can share an mtime
// on file systems with coarse timestamps.
func sameFiles(a, b [3]os.FileInfo) bool {
	for i := range a {
		switch {
		case a[i] == nil && b[i] == nil:
		case a[i] == nil || b[i] == nil:
			return false
		case !os.SameFile(a[i], b[i]) || a[i].Size() != b[i].Size() || !a[i].ModTime().Equal(b[i].ModTime()):
			return false
		}
	}
	return true
}

func (s *Source) load() (*material, error) {
	roots, err := LoadRoots(s.caFile)
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(s.certFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: %w", err)
	}
	keyPEM, err := os.ReadFile(s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: %w", err)
	}
	// X509KeyPair refuses a key that does not belong to the certificate,
	// which is what makes a half-finished rotation harmless.
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: key pair %s + %s: %w", s.certFile, s.keyFile, err)
	}
	id, err := identity.FromCertificate(cert.Leaf)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: %s: %w", s.certFile, err)
	}
	return &material{cert: &cert, roots: roots, id: id}, nil
}

// LoadRoots parses every block of a CA bundle and rejects the whole bundle
// if any block is not a CA certificate: x509.CertPool.AppendCertsFromPEM
// would skip a bad block silently, and a mistaken bundle is better found at
// load time than as a mysterious handshake failure.
func LoadRoots(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("tlsconfig: CA bundle %s: PEM block %d is %q, want CERTIFICATE", file, n+1, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: CA bundle %s: certificate %d: %w", file, n+1, err)
		}
		// A leaf in the bundle would be trusted as a root, letting whoever
		// holds its key present it directly.
		if !cert.IsCA {
			return nil, fmt.Errorf("tlsconfig: CA bundle %s: certificate %d (%s) is not a CA", file, n+1, cert.Subject)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("tlsconfig: CA bundle %s: no certificates", file)
	}
	return pool, nil
}
