package seal_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/seal"
)

type holder struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func load(t *testing.T, dir string, id identity.ID) holder {
	t.Helper()
	certFile, keyFile := pki.Paths(dir, id)
	cpem, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	kpem, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.ParseCertificatePEM(cpem)
	if err != nil {
		t.Fatal(err)
	}
	k, err := pki.ParsePrivateKeyPEM(kpem)
	if err != nil {
		t.Fatal(err)
	}
	return holder{cert: cert, key: k.(*ecdsa.PrivateKey)}
}

func TestOnlyTheRecipientOpensTheBox(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, "airlock.test", nil); err != nil {
		t.Fatal(err)
	}
	publisher := load(t, dir, identity.Service("airlock.test", identity.ServicePublisher))
	executor := load(t, dir, identity.Service("airlock.test", identity.ServiceExecutor))
	secret, ctx := []byte("deploy-token-1234"), []byte("lease L1 job J1 deploy")

	box, err := seal.Seal(publisher.cert, ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(box, secret) {
		t.Fatal("the box carries the secret in clear")
	}
	got, err := seal.Open(publisher.cert, publisher.key, ctx, box)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("recipient: %q, %v", got, err)
	}
	tampered := append([]byte(nil), box...)
	tampered[len(tampered)-1] ^= 1
	for name, try := range map[string]func() ([]byte, error){
		"another identity's key":                  func() ([]byte, error) { return seal.Open(executor.cert, executor.key, ctx, box) },
		"the right key claiming another identity": func() ([]byte, error) { return seal.Open(executor.cert, publisher.key, ctx, box) },
		"another context":                         func() ([]byte, error) { return seal.Open(publisher.cert, publisher.key, []byte("lease L2"), box) },
		"altered bytes":                           func() ([]byte, error) { return seal.Open(publisher.cert, publisher.key, ctx, tampered) },
		"truncated":                               func() ([]byte, error) { return seal.Open(publisher.cert, publisher.key, ctx, box[:40]) },
	} {
		if got, err := try(); !errors.Is(err, seal.ErrOpen) || got != nil {
			t.Errorf("%s: opened %q, err %v; want ErrOpen", name, got, err)
		}
	}
	// Two seals of one secret differ (fresh ephemeral key and nonce).
	again, _ := seal.Seal(publisher.cert, ctx, secret)
	if bytes.Equal(again, box) {
		t.Error("sealing twice gave the same bytes")
	}
}

// TestOpenTLS: a holder opens a box with its mTLS certificate as the TLS
// stack holds it; another's, or none, does not.
func TestOpenTLS(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, "airlock.test", nil); err != nil {
		t.Fatal(err)
	}
	pair := func(id identity.ID) *tls.Certificate {
		certFile, keyFile := pki.Paths(dir, id)
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	executor := pair(identity.Service("airlock.test", identity.ServiceExecutor))
	publisher := pair(identity.Service("airlock.test", identity.ServicePublisher))
	leaf, err := x509.ParseCertificate(executor.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	box, err := seal.Seal(leaf, []byte("ctx"), []byte("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := seal.OpenTLS(executor, []byte("ctx"), box); err != nil || string(got) != "s3cret" {
		t.Fatalf("OpenTLS = %q, %v", got, err)
	}
	if _, err := seal.OpenTLS(publisher, []byte("ctx"), box); !errors.Is(err, seal.ErrOpen) {
		t.Fatalf("another's certificate: %v; want ErrOpen", err)
	}
	if _, err := seal.OpenTLS(&tls.Certificate{}, []byte("ctx"), box); err == nil {
		t.Fatal("no certificate opened the box")
	}
}
