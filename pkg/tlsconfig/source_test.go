package tlsconfig

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/pki"
)

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func TestNewFileSourceErrors(t *testing.T) {
	p := newTestPKI(t)
	caFile, certFile, keyFile := p.paths(authorityID)
	_, _, devKey := p.paths(devID)
	scratch := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(scratch, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	certPEM, _ := os.ReadFile(certFile)
	keyPEM, _ := os.ReadFile(keyFile)
	caPEM, _ := os.ReadFile(caFile)
	tests := []struct {
		name                      string
		caFile, certFile, keyFile string
		want                      string
	}{
		{name: "missing CA bundle", caFile: filepath.Join(scratch, "nope.crt"), certFile: certFile, keyFile: keyFile, want: "nope.crt: no such file"},
		{name: "missing key", caFile: caFile, certFile: certFile, keyFile: filepath.Join(scratch, "nope.key"), want: "nope.key: no such file"},
		{name: "empty CA bundle", caFile: write("empty.crt", nil), certFile: certFile, keyFile: keyFile, want: "empty.crt: no certificates"},
		{name: "leaf in CA bundle", caFile: write("leaf-bundle.crt", append(append([]byte{}, caPEM...), certPEM...)), certFile: certFile, keyFile: keyFile, want: "certificate 2 (CN=authority,OU=service,O=Airlock) is not a CA"},
		{name: "key in CA bundle", caFile: write("key-bundle.crt", keyPEM), certFile: certFile, keyFile: keyFile, want: `PEM block 1 is "PRIVATE KEY", want CERTIFICATE`},
		{name: "key of another identity", caFile: caFile, certFile: certFile, keyFile: devKey, want: "private key does not match public key"},
		{name: "garbage certificate", caFile: caFile, certFile: write("garbage.crt", []byte("nonsense")), keyFile: keyFile, want: "garbage.crt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, err := NewFileSource(tt.caFile, tt.certFile, tt.keyFile)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewFileSource = %v, %v; want error containing %q", src, err, tt.want)
			}
		})
	}
}

func TestSourceRejectsLeafWithoutID(t *testing.T) {
	p := newTestPKI(t)
	caFile, _, _ := p.paths(devID)
	dir := t.TempDir()
	noURI := craft(t, p.ca, func(c *x509.Certificate) { c.URIs = nil })
	keyDER, err := x509.MarshalPKCS8PrivateKey(noURI.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key")
	os.WriteFile(certFile, pemCert(noURI.Leaf), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	_, err = NewFileSource(caFile, certFile, keyFile)
	if err == nil || !strings.Contains(err.Error(), "c.crt") || !strings.Contains(err.Error(), "no URI SAN") {
		t.Fatalf("NewFileSource = %v, want an error naming c.crt and the missing URI SAN", err)
	}
}

func TestSourceReloads(t *testing.T) {
	p := newTestPKI(t)
	src, reloadErrs := p.source(t, devID)
	_, certFile, keyFile := p.paths(devID)
	serial := func() string {
		t.Helper()
		c, err := src.Certificate()
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.String()
	}
	start := serial()
	if id, err := src.ID(); err != nil || id != devID {
		t.Fatalf("ID() = %v, %v; want %v", id, err, devID)
	}
	if s := serial(); s != start {
		t.Fatal("certificate changed without any file changing")
	}

	next, err := p.ca.Issue(devID, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteKeyPair(p.dir, next); err != nil {
		t.Fatal(err)
	}
	if s := serial(); s != next.Cert.SerialNumber.String() {
		t.Fatalf("after rotation serial = %s, want %s", s, next.Cert.SerialNumber)
	}

	// A mismatched pair is reported once and never served.
	third, err := p.ca.Issue(devID, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFileAtomic(keyFile, third.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if s := serial(); s != next.Cert.SerialNumber.String() {
			t.Fatalf("with a mismatched pair on disk serial = %s, want the last good %s", s, next.Cert.SerialNumber)
		}
	}
	if errs := reloadErrs.all(); len(errs) != 1 {
		t.Fatalf("reload errors = %v, want exactly one for one bad change", errs)
	}

	// A vanished file is reported and the last good pair stays.
	if err := os.Remove(certFile); err != nil {
		t.Fatal(err)
	}
	if s := serial(); s != next.Cert.SerialNumber.String() {
		t.Fatalf("with the certificate missing serial = %s, want %s", s, next.Cert.SerialNumber)
	}
	if errs := reloadErrs.all(); len(errs) != 2 || !strings.Contains(errs[1].Error(), certFile) {
		t.Fatalf("reload errors = %v, want a second naming %s", errs, certFile)
	}

	if err := pki.WriteFileAtomic(certFile, third.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if s := serial(); s != third.Cert.SerialNumber.String() {
		t.Fatalf("after the pair was completed serial = %s, want %s", s, third.Cert.SerialNumber)
	}

	// Roots follow the bundle file too.
	other, err := pki.NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(pki.CAPath(p.dir))
	if err := pki.WriteFileAtomic(pki.CAPath(p.dir), append(caPEM, pemCert(other.Cert)...), 0o644); err != nil {
		t.Fatal(err)
	}
	roots, err := src.Roots()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Cert.Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		t.Fatalf("roots do not include the CA added to the bundle: %v", err)
	}
	if _, err := p.ca.Cert.Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		t.Fatalf("roots lost the original CA: %v", err)
	}
}

// TestSourceVerify checks our own certificate against the CA bundle: it
// holds for one the bundle's CA issued, and fails for another CA's.
func TestSourceVerify(t *testing.T) {
	ours, theirs := newTestPKI(t), newTestPKI(t)
	ca, _, _ := ours.paths(authorityID)
	_, cert, key := theirs.paths(authorityID)
	good, _ := ours.source(t, authorityID)
	if err := good.Verify(); err != nil {
		t.Errorf("Verify of the bundle's own certificate: %v", err)
	}
	foreign, err := NewFileSource(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := foreign.Verify(); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("Verify of another CA's certificate = %v, want unknown authority", err)
	}
}
