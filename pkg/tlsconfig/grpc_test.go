package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

func TestServerAcceptsGoodClient(t *testing.T) {
	p := newTestPKI(t)
	srvSrc, _ := p.source(t, authorityID)
	devSrc, _ := p.source(t, devID)
	srv := startServer(t, srvSrc)

	serial := dialTLS(t, srv.addr, ClientConfig(devSrc, authorityID)).mustServe(t)

	srvCert, err := srvSrc.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	if serial.Cmp(srvCert.Leaf.SerialNumber) != 0 {
		t.Errorf("server presented serial %v, want its source's %v", serial, srvCert.Leaf.SerialNumber)
	}
	select {
	case got := <-srv.callers:
		if got != devID {
			t.Errorf("handler saw caller %v, want %v", got, devID)
		}
	default:
		t.Error("handler did not see the caller")
	}
}

func TestServerRefuses(t *testing.T) {
	p := newTestPKI(t)
	devSrc, _ := p.source(t, devID)
	good := ClientConfig(devSrc, authorityID)

	otherCA, err := pki.NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *pki.CA, id identity.ID, opts pki.IssueOptions) *tls.Certificate {
		kp, err := ca.Issue(id, opts)
		if err != nil {
			t.Fatal(err)
		}
		return tlsCert(t, kp)
	}
	uris := func(ss ...string) []*url.URL {
		var out []*url.URL
		for _, s := range ss {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, u)
		}
		return out
	}

	tests := []struct {
		name string
		cfg  *tls.Config // nil means a plaintext client
		// wantServer is part of the server's handshake error: the proof that
		// the handshake refused the client, for the reason under test.
		wantServer string
	}{
		{
			name:       "no client certificate",
			cfg:        presenting(good, &tls.Certificate{}),
			wantServer: "client didn't provide a certificate",
		},
		{
			name:       "same SPIFFE ID from another CA",
			cfg:        presenting(good, issue(otherCA, devID, pki.IssueOptions{})),
			wantServer: "certificate signed by unknown authority",
		},
		{
			name:       "expired",
			cfg:        presenting(good, issue(p.ca, devID, pki.IssueOptions{NotBefore: time.Now().Add(-2 * time.Hour), Validity: time.Hour})),
			wantServer: "certificate has expired or is not yet valid",
		},
		{
			name:       "not yet valid",
			cfg:        presenting(good, issue(p.ca, devID, pki.IssueOptions{NotBefore: time.Now().Add(time.Hour)})),
			wantServer: "certificate has expired or is not yet valid",
		},
		{
			name: "two URI SANs",
			cfg: presenting(good, craft(t, p.ca, func(c *x509.Certificate) {
				c.URIs = uris(devID.String(), authorityID.String())
			})),
			wantServer: "2 URI SANs, want exactly 1",
		},
		{
			name:       "no URI SAN",
			cfg:        presenting(good, craft(t, p.ca, func(c *x509.Certificate) { c.URIs = nil })),
			wantServer: "no URI SAN",
		},
		{
			name: "foreign trust domain signed by our CA",
			cfg: presenting(good, craft(t, p.ca, func(c *x509.Certificate) {
				c.URIs = uris("spiffe://evil.test/client/dev")
			})),
			wantServer: `trust domain "evil.test", want "airlock.test"`,
		},
		{
			name: "URI SAN that is not a valid Airlock ID",
			cfg: presenting(good, craft(t, p.ca, func(c *x509.Certificate) {
				c.URIs = uris("spiffe://airlock.test/service/rogue")
			})),
			wantServer: `unknown service "rogue"`,
		},
		{
			name: "server-only key usage",
			cfg: presenting(good, craft(t, p.ca, func(c *x509.Certificate) {
				c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			})),
			wantServer: "incompatible key usage",
		},
		{
			name: "TLS 1.2",
			cfg: func() *tls.Config {
				c := good.Clone()
				c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
				return c
			}(),
			wantServer: "unsupported versions",
		},
		{
			name:       "plaintext",
			cfg:        nil,
			wantServer: "first record does not look like a TLS handshake",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srvSrc, _ := p.source(t, authorityID)
			srv := startServer(t, srvSrc)
			var client *testClient
			if tt.cfg == nil {
				client = dial(t, srv.addr, insecure.NewCredentials())
			} else {
				client = dialTLS(t, srv.addr, tt.cfg)
			}
			_, err := client.check(t)
			expectUnavailable(t, err)
			srv.expectHandshakeError(t, tt.wantServer)
		})
	}
}

func TestClientPinsServerIdentity(t *testing.T) {
	p := newTestPKI(t)
	devSrc, _ := p.source(t, devID)
	otherCA, err := pki.NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	otherDir := t.TempDir()
	if err := otherCA.Save(otherDir); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.IssueInto(otherDir, authorityID, pki.IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	impostorCert, impostorKey := pki.Paths(otherDir, authorityID)

	tests := []struct {
		name      string
		serverSrc func(t *testing.T) *Source
		expect    identity.ID
		// wantClient is part of the RPC's error, which carries the
		// client-side handshake failure.
		wantClient string
	}{
		{
			name:       "expects executor, gets authority",
			serverSrc:  func(t *testing.T) *Source { s, _ := p.source(t, authorityID); return s },
			expect:     executorID,
			wantClient: "server is spiffe://airlock.test/service/authority, want spiffe://airlock.test/service/executor",
		},
		{
			name: "right ID from another CA",
			serverSrc: func(t *testing.T) *Source {
				// The impostor trusts our CA, so only the client's check of
				// the server can fail.
				s, err := NewFileSource(pki.CAPath(p.dir), impostorCert, impostorKey)
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
			expect:     authorityID,
			wantClient: "certificate signed by unknown authority",
		},
		{
			name:       "server with a client-only certificate",
			serverSrc:  func(t *testing.T) *Source { s, _ := p.source(t, devID); return s },
			expect:     devID,
			wantClient: "incompatible key usage",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startServer(t, tt.serverSrc(t))
			_, err := dialTLS(t, srv.addr, ClientConfig(devSrc, tt.expect)).check(t)
			expectUnavailable(t, err)
			if !strings.Contains(err.Error(), tt.wantClient) {
				t.Fatalf("error = %q, want it to contain %q", err, tt.wantClient)
			}
			select {
			case id := <-srv.callers:
				t.Fatalf("handler was reached by %v despite the client refusing the server", id)
			default:
			}
		})
	}

	// The same client against the right server works, so the failures above
	// are the pin and not the setup.
	srvSrc, _ := p.source(t, authorityID)
	srv := startServer(t, srvSrc)
	dialTLS(t, srv.addr, ClientConfig(devSrc, authorityID)).mustServe(t)
}

func TestRotationWithoutRestart(t *testing.T) {
	p := newTestPKI(t)
	srvSrc, reloadErrs := p.source(t, authorityID)
	devSrc, _ := p.source(t, devID)
	srv := startServer(t, srvSrc)
	_, certFile, keyFile := p.paths(authorityID)
	cfg := ClientConfig(devSrc, authorityID)

	old := dialTLS(t, srv.addr, cfg)
	first := old.mustServe(t)

	rotate := func(kp *pki.KeyPair, writeCert bool) {
		t.Helper()
		if err := pki.WriteFileAtomic(keyFile, kp.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if writeCert {
			if err := pki.WriteFileAtomic(certFile, kp.CertPEM, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	issue := func() *pki.KeyPair {
		kp, err := p.ca.Issue(authorityID, pki.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}

	second := issue()
	rotate(second, true)
	if got := dialTLS(t, srv.addr, cfg).mustServe(t); got.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("new connection got serial %v, want the rotated %v (old was %v)", got, second.Cert.SerialNumber, first)
	}
	// The established connection keeps its session and keeps working.
	if got := old.mustServe(t); got.Cmp(first) != 0 {
		t.Errorf("old connection now reports serial %v, want its original %v", got, first)
	}
	if errs := reloadErrs.all(); len(errs) != 0 {
		t.Fatalf("clean rotation reported errors: %v", errs)
	}

	// Half a rotation: a new key beside the current certificate. The server
	// must keep serving the last good pair, and say why.
	third := issue()
	rotate(third, false)
	if got := dialTLS(t, srv.addr, cfg).mustServe(t); got.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("during a mismatched rotation the server presented serial %v, want the last good %v", got, second.Cert.SerialNumber)
	}
	errs := reloadErrs.all()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "private key does not match public key") {
		t.Fatalf("reload errors = %v, want one about the mismatched key", errs)
	}

	// Completing the rotation is picked up.
	rotate(third, true)
	if got := dialTLS(t, srv.addr, cfg).mustServe(t); got.Cmp(third.Cert.SerialNumber) != 0 {
		t.Fatalf("after completing the rotation the server presented %v, want %v", got, third.Cert.SerialNumber)
	}
	old.mustServe(t)
	if id, err := srvSrc.ID(); err != nil || id != authorityID {
		t.Errorf("ID() = %v, %v; want %v", id, err, authorityID)
	}
}

// TestCABundleRotation checks that the server verifies against the bundle on
// disk now, not the one it started with, in both directions: a new CA is
// admitted once added, and an old one is refused once removed.
func TestCABundleRotation(t *testing.T) {
	p := newTestPKI(t)
	devSrc, _ := p.source(t, devID)

	// The server gets a bundle file of its own, so changing it does not
	// change what the client trusts.
	oldBundle, err := os.ReadFile(pki.CAPath(p.dir))
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(t.TempDir(), "bundle.crt")
	if err := pki.WriteFileAtomic(bundle, oldBundle, 0o644); err != nil {
		t.Fatal(err)
	}
	_, certFile, keyFile := p.paths(authorityID)
	srvSrc, err := NewFileSource(bundle, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, srvSrc)

	newCA, err := pki.NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	newKP, err := newCA.Issue(devID, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newBundle := pemCert(newCA.Cert)
	oldClient := ClientConfig(devSrc, authorityID)
	newClient := presenting(oldClient, tlsCert(t, newKP))

	_, err = dialTLS(t, srv.addr, newClient).check(t)
	expectUnavailable(t, err)
	srv.expectHandshakeError(t, "certificate signed by unknown authority")

	if err := pki.WriteFileAtomic(bundle, append(append([]byte{}, oldBundle...), newBundle...), 0o644); err != nil {
		t.Fatal(err)
	}
	dialTLS(t, srv.addr, newClient).mustServe(t)
	dialTLS(t, srv.addr, oldClient).mustServe(t)

	if err := pki.WriteFileAtomic(bundle, newBundle, 0o644); err != nil {
		t.Fatal(err)
	}
	srv.drain()
	_, err = dialTLS(t, srv.addr, oldClient).check(t)
	expectUnavailable(t, err)
	srv.expectHandshakeError(t, "certificate signed by unknown authority")
	dialTLS(t, srv.addr, newClient).mustServe(t)
}

// TestResumptionIsReverified checks that a client holding a session ticket
// from before its CA was removed cannot resume its way back in. Go skips
// VerifyPeerCertificate on resumption; ServerConfig must not depend on it.
func TestResumptionIsReverified(t *testing.T) {
	p := newTestPKI(t)
	devSrc, _ := p.source(t, devID)
	bundle := filepath.Join(t.TempDir(), "bundle.crt")
	oldBundle, err := os.ReadFile(pki.CAPath(p.dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFileAtomic(bundle, oldBundle, 0o644); err != nil {
		t.Fatal(err)
	}
	_, certFile, keyFile := p.paths(authorityID)
	srvSrc, err := NewFileSource(bundle, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerConfig(srvSrc, td))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	serverErrs := make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err != nil {
					serverErrs <- err
					return
				}
				c.Write([]byte{1})
			}()
		}
	}()

	cfg := ClientConfig(devSrc, authorityID)
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(8)
	connect := func() (tls.ConnectionState, error) {
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			return tls.ConnectionState{}, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		// Reading processes the session ticket and, in TLS 1.3, is where
		// the client learns that the server refused its certificate.
		if _, err := c.Read(make([]byte, 1)); err != nil {
			return tls.ConnectionState{}, err
		}
		return c.ConnectionState(), nil
	}

	if _, err := connect(); err != nil {
		t.Fatal(err)
	}
	cs, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	if !cs.DidResume {
		t.Fatal("second connection did not resume; the test would prove nothing")
	}

	other, err := pki.NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFileAtomic(bundle, pemCert(other.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := connect(); err == nil {
		t.Fatal("a resumed session was admitted after its CA left the bundle")
	}
	select {
	case err := <-serverErrs:
		if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("server handshake error = %q, want unknown authority", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server recorded no failed handshake")
	}
}
