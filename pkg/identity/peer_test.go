package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// certWithURIs creates and re-parses a real certificate, so the URIs under
// test have been through the same DER encoding and parsing as a peer's.
func certWithURIs(t *testing.T, uris ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestFromCertificate(t *testing.T) {
	const dev = "spiffe://airlock.test/client/dev"
	tests := []struct {
		name     string
		uris     []string
		want     ID
		wantErr  string
		sentinel error
	}{
		{name: "one URI SAN", uris: []string{dev}, want: MustParse(dev)},
		{name: "no URI SAN", uris: nil, wantErr: "no URI SAN", sentinel: ErrNoID},
		{name: "two URI SANs", uris: []string{dev, "spiffe://airlock.test/service/authority"}, wantErr: "2 URI SANs, want exactly 1", sentinel: ErrInvalidID},
		{name: "same URI twice", uris: []string{dev, dev}, wantErr: "2 URI SANs, want exactly 1", sentinel: ErrInvalidID},
		{name: "not spiffe", uris: []string{"https://airlock.test/client/dev"}, wantErr: "must start with spiffe://", sentinel: ErrInvalidID},
		{name: "upper-case host survives parsing and is refused", uris: []string{"spiffe://AIRLOCK.test/client/dev"}, wantErr: "trust domain has character 'A'", sentinel: ErrInvalidID},
		{name: "escaped slash in name", uris: []string{"spiffe://airlock.test/client/a%2Fb"}, wantErr: "name has character '%'", sentinel: ErrInvalidID},
		{name: "trust domain only", uris: []string{"spiffe://airlock.test"}, wantErr: "path must be /KIND/NAME", sentinel: ErrInvalidID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromCertificate(certWithURIs(t, tt.uris...))
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("FromCertificate() = %v, %v; want %v", got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("FromCertificate() = %v, want error containing %q", got, tt.wantErr)
			}
			if !errors.Is(err, tt.sentinel) {
				t.Errorf("error %v does not wrap %v", err, tt.sentinel)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %q, want it to contain %q", err, tt.wantErr)
			}
		})
	}
	if _, err := FromCertificate(nil); !errors.Is(err, ErrNoID) {
		t.Errorf("FromCertificate(nil) = %v, want ErrNoID", err)
	}
}

// otherAuth is a non-TLS AuthInfo, standing in for a peer that connected
// with, say, insecure or ALTS credentials.
type otherAuth struct{}

func (otherAuth) AuthType() string { return "insecure" }

func TestFromPeer(t *testing.T) {
	dev := MustParse("spiffe://airlock.test/client/dev")
	withPeer := func(auth credentials.AuthInfo) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: auth})
	}
	tests := []struct {
		name    string
		ctx     context.Context
		want    ID
		wantErr string
	}{
		{
			name: "TLS peer with certificate",
			ctx: withPeer(credentials.TLSInfo{State: tls.ConnectionState{
				PeerCertificates: []*x509.Certificate{certWithURIs(t, dev.String())},
			}}),
			want: dev,
		},
		{name: "no peer", ctx: context.Background(), wantErr: "no peer in context"},
		{name: "peer without auth", ctx: withPeer(nil), wantErr: "not authenticated"},
		{name: "not TLS", ctx: withPeer(otherAuth{}), wantErr: `authenticated by "insecure", not TLS`},
		{name: "TLS without certificate", ctx: withPeer(credentials.TLSInfo{}), wantErr: "peer presented no certificate"},
		{
			name: "TLS with certificate lacking a URI SAN",
			ctx: withPeer(credentials.TLSInfo{State: tls.ConnectionState{
				PeerCertificates: []*x509.Certificate{certWithURIs(t)},
			}}),
			wantErr: "no URI SAN",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromPeer(tt.ctx)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("FromPeer() = %v, %v; want %v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("FromPeer() = %v, %v; want error containing %q", got, err, tt.wantErr)
			}
			if !errors.Is(err, ErrNoID) {
				t.Errorf("error %v does not wrap ErrNoID", err)
			}
		})
	}
}

func TestContextRoundTrip(t *testing.T) {
	if id, ok := FromContext(context.Background()); ok || !id.IsZero() {
		t.Fatalf("FromContext(empty) = %v, %v; want zero, false", id, ok)
	}
	want := MustParse("spiffe://airlock.test/approver/alice")
	ctx := NewContext(context.Background(), want)
	got, ok := FromContext(ctx)
	if !ok || got != want {
		t.Fatalf("FromContext() = %v, %v; want %v, true", got, ok, want)
	}
	// An ID stored under a look-alike key must not be found: only this
	// package's unexported key counts.
	type contextKey struct{}
	forged := context.WithValue(context.Background(), contextKey{}, want)
	if _, ok := FromContext(forged); ok {
		t.Fatal("FromContext found an ID stored under another package's key")
	}
	if _, ok := FromContext(NewContext(context.Background(), ID{})); ok {
		t.Fatal("FromContext reported ok for a stored zero ID")
	}
}
