package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/identity"
)

const td = "airlock.test"

func checkMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("mode of %s = %#o, want %#o", path, got, want)
	}
}

func caPool(ca *CA) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

func TestInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	callers := []identity.ID{
		identity.MustParse("spiffe://airlock.test/client/dev"),
		identity.MustParse("spiffe://airlock.test/approver/alice"),
		identity.MustParse("spiffe://airlock.test/pipeline/deploy"),
		identity.MustParse("spiffe://airlock.test/client/dev"),       // duplicate
		identity.MustParse("spiffe://airlock.test/service/executor"), // already issued as a service
	}
	ca, err := Init(dir, td, callers)
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	if ca.TrustDomain != td {
		t.Errorf("CA trust domain = %q, want %q", ca.TrustDomain, td)
	}
	checkMode(t, dir, 0o700)
	checkMode(t, CAPath(dir), 0o644)
	checkMode(t, CAKeyPath(dir), 0o600)

	want := []identity.ID{
		identity.Service(td, "authority"),
		identity.Service(td, "executor"),
		identity.Service(td, "publisher"),
		callers[0], callers[1], callers[2],
	}
	serials := map[string]identity.ID{}
	for _, id := range want {
		t.Run(id.Principal(), func(t *testing.T) {
			certFile, keyFile := Paths(dir, id)
			checkMode(t, filepath.Dir(certFile), 0o700)
			checkMode(t, certFile, 0o644)
			checkMode(t, keyFile, 0o600)

			keyPEM, err := os.ReadFile(keyFile)
			if err != nil {
				t.Fatal(err)
			}
			if block, _ := pem.Decode(keyPEM); block == nil || block.Type != "PRIVATE KEY" {
				t.Errorf("%s is not a PKCS#8 PEM key", keyFile)
			}
			if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
				t.Fatalf("key and certificate do not pair: %v", err)
			}
			certPEM, err := os.ReadFile(certFile)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := ParseCertificatePEM(certPEM)
			if err != nil {
				t.Fatal(err)
			}
			if len(cert.URIs) != 1 || cert.URIs[0].String() != id.String() {
				t.Fatalf("URI SANs = %v, want exactly [%s]", cert.URIs, id)
			}
			if got, err := identity.FromCertificate(cert); err != nil || got != id {
				t.Fatalf("FromCertificate = %v, %v; want %v", got, err, id)
			}
			if cert.IsCA {
				t.Error("leaf certificate is a CA")
			}
			if cert.KeyUsage != x509.KeyUsageDigitalSignature {
				t.Errorf("KeyUsage = %v, want DigitalSignature only", cert.KeyUsage)
			}
			if bits := cert.SerialNumber.BitLen(); bits > 128 || bits < 64 {
				t.Errorf("serial has %d bits, want a random 128-bit value", bits)
			}
			if prev, dup := serials[cert.SerialNumber.String()]; dup {
				t.Errorf("serial shared with %v", prev)
			}
			serials[cert.SerialNumber.String()] = id

			wantEKU := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
			if id.Kind == identity.KindService {
				wantEKU = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
			}
			if !slices.Equal(cert.ExtKeyUsage, wantEKU) {
				t.Errorf("ExtKeyUsage = %v, want %v", cert.ExtKeyUsage, wantEKU)
			}
			for _, eku := range wantEKU {
				if _, err := cert.Verify(x509.VerifyOptions{Roots: caPool(ca), KeyUsages: []x509.ExtKeyUsage{eku}}); err != nil {
					t.Errorf("does not chain to the CA for EKU %v: %v", eku, err)
				}
			}
			if id.Kind != identity.KindService {
				_, err := cert.Verify(x509.VerifyOptions{Roots: caPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
				if err == nil {
					t.Error("a non-service certificate verifies for ServerAuth")
				}
				if len(cert.DNSNames) != 0 || len(cert.IPAddresses) != 0 {
					t.Errorf("non-service certificate has DNS %v IP %v, want none", cert.DNSNames, cert.IPAddresses)
				}
			} else {
				// Standard tools verify services by host name.
				for _, host := range []string{"localhost", "127.0.0.1", "::1"} {
					if err := cert.VerifyHostname(host); err != nil {
						t.Errorf("VerifyHostname(%s): %v", host, err)
					}
				}
			}
			if age := time.Since(cert.NotBefore); age < 30*time.Second || age > 2*time.Minute {
				t.Errorf("NotBefore is %v ago, want about a minute", age)
			}
			if life := cert.NotAfter.Sub(cert.NotBefore); life != DefaultLeafValidity {
				t.Errorf("validity = %v, want %v", life, DefaultLeafValidity)
			}
		})
	}

	// Nothing else, notably no temporary files, may be left behind.
	var files []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			files = append(files, rel)
		}
		return err
	})
	slices.Sort(files)
	wantFiles := []string{
		"approver/alice.crt", "approver/alice.key", "ca.crt", "ca.key",
		"client/dev.crt", "client/dev.key", "pipeline/deploy.crt", "pipeline/deploy.key",
		"service/authority.crt", "service/authority.key", "service/executor.crt", "service/executor.key",
		"service/publisher.crt", "service/publisher.key",
	}
	if !slices.Equal(files, wantFiles) {
		t.Errorf("files under dir = %v, want %v", files, wantFiles)
	}
}

func TestInitTwiceRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, td, nil); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(CAKeyPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Init(dir, td, nil)
	if !errors.Is(err, ErrCAExists) {
		t.Fatalf("second Init = %v, want ErrCAExists", err)
	}
	if !strings.Contains(err.Error(), CAKeyPath(dir)) || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("error %q should name %s and say it already exists", err, CAKeyPath(dir))
	}
	after, err := os.ReadFile(CAKeyPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("second Init replaced the CA key")
	}
}

func TestInitRejectsBadCallers(t *testing.T) {
	tests := []struct {
		name    string
		td      string
		callers []identity.ID
		wantErr string
	}{
		{name: "foreign trust domain", td: td, callers: []identity.ID{identity.MustParse("spiffe://other.test/client/x")}, wantErr: `trust domain "other.test" does not match "airlock.test"`},
		{name: "unvalidated ID", td: td, callers: []identity.ID{{TrustDomain: td, Kind: identity.KindService, Name: "rogue"}}, wantErr: `unknown service "rogue"`},
		{name: "zero ID", td: td, callers: []identity.ID{{}}, wantErr: "trust domain is empty"},
		{name: "bad trust domain", td: "Bad:1", wantErr: "invalid trust domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pki")
			_, err := Init(dir, tt.td, tt.callers)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Init = %v, want error containing %q", err, tt.wantErr)
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Init wrote to %s despite failing validation (stat: %v)", dir, err)
			}
		})
	}
}

func TestIssueIntoForeignTrustDomain(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, td, nil); err != nil {
		t.Fatal(err)
	}
	foreign := identity.MustParse("spiffe://other/client/x")
	_, err := IssueInto(dir, foreign, IssueOptions{})
	const want = `pki: issue spiffe://other/client/x: trust domain "other" does not match CA trust domain "airlock.test"`
	if err == nil || err.Error() != want {
		t.Fatalf("IssueInto = %v, want %q", err, want)
	}
	certFile, keyFile := Paths(dir, foreign)
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists after a refused issue", f)
		}
	}
}

func TestIssueIntoReplacesPair(t *testing.T) {
	dir := t.TempDir()
	dev := identity.MustParse("spiffe://airlock.test/client/dev")
	if _, err := Init(dir, td, []identity.ID{dev}); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := Paths(dir, dev)
	old, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := IssueInto(dir, dev, IssueOptions{Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("replaced pair does not load: %v", err)
	}
	if now.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) == 0 {
		t.Fatal("IssueInto left the old certificate in place")
	}
	if now.Leaf.SerialNumber.Cmp(kp.Cert.SerialNumber) != 0 {
		t.Fatal("file on disk is not the returned pair")
	}
	checkMode(t, keyFile, 0o600)
	checkMode(t, certFile, 0o644)
}

func TestLoadCARoundTrip(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := ca.Cert.NotAfter.Sub(ca.Cert.NotBefore); got != DefaultCAValidity {
		t.Errorf("CA validity = %v, want %v", got, DefaultCAValidity)
	}
	if !ca.Cert.IsCA || ca.Cert.Subject.CommonName != "Airlock CA airlock.test" {
		t.Errorf("CA IsCA=%v CN=%q", ca.Cert.IsCA, ca.Cert.Subject.CommonName)
	}
	if ca.Cert.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("CA KeyUsage = %v", ca.Cert.KeyUsage)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.TrustDomain != td || !loaded.Cert.Equal(ca.Cert) {
		t.Fatalf("LoadCA = %q %v, want the saved CA", loaded.TrustDomain, loaded.Cert.Subject)
	}
	// The loaded key must be the one that signs for the saved certificate.
	kp, err := loaded.Issue(identity.MustParse("spiffe://airlock.test/client/dev"), IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: caPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("certificate from the loaded CA does not verify against the original: %v", err)
	}

	if err := ca.Save(dir); !errors.Is(err, ErrCAExists) || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second Save = %v, want ErrCAExists refusing to overwrite", err)
	}
}

func TestLoadCAErrors(t *testing.T) {
	other, err := NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := marshalKey(other.Key)
	if err != nil {
		t.Fatal(err)
	}
	leafDir := t.TempDir()
	if _, err := Init(leafDir, td, nil); err != nil {
		t.Fatal(err)
	}
	leafCert, leafKey := Paths(leafDir, identity.Service(td, "authority"))

	tests := []struct {
		name    string
		mutate  func(t *testing.T, dir string)
		wantErr string
	}{
		{name: "missing directory", mutate: func(t *testing.T, dir string) { os.RemoveAll(dir) }, wantErr: "no such file"},
		{name: "key of another CA", mutate: func(t *testing.T, dir string) {
			os.WriteFile(CAKeyPath(dir), otherKey, 0o600)
		}, wantErr: "ca.key does not match the public key in"},
		{name: "garbage certificate", mutate: func(t *testing.T, dir string) {
			os.WriteFile(CAPath(dir), []byte("not pem"), 0o644)
		}, wantErr: "ca.crt: no PEM data"},
		{name: "leaf in place of CA", mutate: func(t *testing.T, dir string) {
			copyFile(t, leafCert, CAPath(dir))
			copyFile(t, leafKey, CAKeyPath(dir))
		}, wantErr: "is not a CA certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			ca, err := NewCA(td, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := ca.Save(dir); err != nil {
				t.Fatal(err)
			}
			tt.mutate(t, dir)
			if _, err := LoadCA(dir); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("LoadCA = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestIssueOptions(t *testing.T) {
	ca, err := NewCA(td, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dev := identity.MustParse("spiffe://airlock.test/client/dev")
	start := time.Now().Add(-3 * time.Hour).Truncate(time.Second)

	kp, err := ca.Issue(dev, IssueOptions{
		NotBefore:   start,
		Validity:    time.Hour,
		DNSNames:    []string{"dev.internal"},
		IPAddresses: []net.IP{net.ParseIP("10.0.0.7")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !kp.Cert.NotBefore.Equal(start) || !kp.Cert.NotAfter.Equal(start.Add(time.Hour)) {
		t.Errorf("validity = %v..%v, want %v..%v", kp.Cert.NotBefore, kp.Cert.NotAfter, start, start.Add(time.Hour))
	}
	if !slices.Equal(kp.Cert.DNSNames, []string{"dev.internal"}) || len(kp.Cert.IPAddresses) != 1 || !kp.Cert.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")) {
		t.Errorf("SANs = %v %v, want the requested extras", kp.Cert.DNSNames, kp.Cert.IPAddresses)
	}
	if _, err := kp.TLSCertificate(); err != nil {
		t.Errorf("TLSCertificate: %v", err)
	}

	svc, err := ca.Issue(identity.Service(td, "executor"), IssueOptions{DNSNames: []string{"localhost", "executor.internal"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(svc.Cert.DNSNames, []string{"localhost", "executor.internal"}) {
		t.Errorf("service DNS SANs = %v, want localhost once plus the extra", svc.Cert.DNSNames)
	}
	if len(svc.Cert.IPAddresses) != 2 {
		t.Errorf("service IP SANs = %v, want 127.0.0.1 and ::1", svc.Cert.IPAddresses)
	}

	// A leaf never outlives its CA.
	long, err := ca.Issue(dev, IssueOptions{Validity: 365 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !long.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter = %v, want clamped to the CA's %v", long.Cert.NotAfter, ca.Cert.NotAfter)
	}

	if _, err := ca.Issue(dev, IssueOptions{Validity: -time.Hour}); err == nil || !strings.Contains(err.Error(), "negative validity") {
		t.Errorf("negative validity: err = %v", err)
	}
	if _, err := ca.Issue(identity.ID{TrustDomain: td, Kind: "robot", Name: "x"}, IssueOptions{}); !errors.Is(err, identity.ErrInvalidID) {
		t.Errorf("invalid ID: err = %v, want identity.ErrInvalidID", err)
	}
}

// TestIssueHost checks that a host certificate is good for a TLS server
// checked by name, and for nothing Airlock would take as an identity.
func TestIssueHost(t *testing.T) {
	ca, err := NewCA(td, 0)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.IssueHost(IssueOptions{DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(kp.Cert.URIs) != 0 || !kp.ID.IsZero() {
		t.Errorf("host certificate carries URI SANs %v / ID %v; it must name no identity", kp.Cert.URIs, kp.ID)
	}
	if _, err := identity.FromCertificate(kp.Cert); err == nil {
		t.Error("identity.FromCertificate accepted a host certificate")
	}
	for _, name := range []string{"localhost", "127.0.0.1"} {
		if _, err := kp.Cert.Verify(x509.VerifyOptions{DNSName: name, Roots: caPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify as server %s: %v", name, err)
		}
	}
	if _, err := kp.Cert.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: caPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("host certificate verified for a name it does not carry")
	}
	if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: caPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("host certificate verified as a client certificate")
	}
	if _, err := ca.IssueHost(IssueOptions{}); err == nil {
		t.Error("IssueHost with no name or address succeeded")
	}

	dir := t.TempDir()
	if err := WriteKeyPair(dir, kp); err == nil {
		t.Error("WriteKeyPair wrote a pair that names no identity")
	}
	certFile, keyFile := filepath.Join(dir, "git", "server.crt"), filepath.Join(dir, "git", "server.key")
	if err := WriteHostPair(certFile, keyFile, kp); err != nil {
		t.Fatal(err)
	}
	checkMode(t, keyFile, 0o600)
	checkMode(t, certFile, 0o644)
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Errorf("written host pair does not load: %v", err)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.key")
	if err := WriteFileAtomic(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(path, []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "two" {
		t.Fatalf("contents = %q, %v; want two", got, err)
	}
	checkMode(t, path, 0o644)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the target (temporary file left behind?)", len(entries))
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}
