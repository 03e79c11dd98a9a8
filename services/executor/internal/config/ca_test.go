package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sandbox.ca_bundle and sandbox.extra_cas are the jobs' trust store: PEM
// CA certificates and nothing else, bounded; the host's bundle by
// default, and a start without one refused; a bad file is named by its
// field and says why.
func TestSandboxCAs(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caPEM, keyPEM := testCert(t, true)
	leafPEM, _ := testCert(t, false)
	ca := write("ca.pem", caPEM)
	other, _ := testCert(t, true)
	commented := write("commented.pem", append([]byte("# Operator's egress CA\n"), other...))
	leaf := write("leaf.pem", leafPEM)
	withKey := write("with-key.pem", append(append([]byte{}, caPEM...), keyPEM...))
	notPEM := write("not.pem", []byte("hello\n"))
	broken := write("broken.pem", append(append([]byte{}, caPEM...), []byte("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")...))
	bad := write("bad-der.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")}))
	huge := write("huge.pem", append(append([]byte{}, caPEM...), make([]byte, 1<<20)...))
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// The line after the CA's, where a second block begins.
	second := fmt.Sprintf("block 2 (line %d)", 1+strings.Count(string(caPEM), "\n"))
	many := make([]string, 17)
	for i := range many {
		many[i] = ca
	}

	for _, tc := range []struct {
		name     string
		bundle   string
		extras   []string
		noHost   bool
		field    string // "" means valid
		want     string
		wantCert []string // PEM files whose certificates CAs holds
	}{
		{name: "default: the host's bundle", wantCert: []string{defaultCABundle}},
		{name: "host bundle and an extra with a comment", extras: []string{commented}, wantCert: []string{defaultCABundle, commented}},
		{name: "a bundle of its own", bundle: ca, wantCert: []string{ca}},
		{name: "no host bundle and none set", noHost: true, field: "sandbox.ca_bundle", want: "not set, and this host has no"},
		{name: "no host bundle, one set", noHost: true, bundle: ca, wantCert: []string{ca}},
		{name: "missing", bundle: filepath.Join(dir, "gone.pem"), field: "sandbox.ca_bundle", want: "no such file"},
		{name: "a leaf", bundle: leaf, field: "sandbox.ca_bundle", want: "certificate 1 (line 1, \"CN=leaf\") is not a CA certificate"},
		{name: "a private key beside the CA", extras: []string{ca, withKey}, field: "sandbox.extra_cas[1]", want: second + ` is a "EC PRIVATE KEY", want only CERTIFICATE blocks`},
		{name: "not PEM", extras: []string{notPEM}, field: "sandbox.extra_cas[0]", want: "no PEM certificate in it"},
		{name: "a block that does not decode", extras: []string{broken}, field: "sandbox.extra_cas[0]", want: second + " is not a well-formed PEM block"},
		{name: "not a certificate", extras: []string{bad}, field: "sandbox.extra_cas[0]", want: "certificate 1 (line 1): x509:"},
		{name: "too large", extras: []string{huge}, field: "sandbox.extra_cas[0]", want: "larger than 1048576 bytes"},
		{name: "not a regular file", extras: []string{fifo}, field: "sandbox.extra_cas[0]", want: "is not a regular file"},
		{name: "too many", extras: many, field: "sandbox.extra_cas", want: "17 files: at most 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.noHost {
				old := defaultCABundle
				defaultCABundle = filepath.Join(dir, "no-host-bundle.crt")
				t.Cleanup(func() { defaultCABundle = old })
			}
			c := &Config{Sandbox: Sandbox{CABundle: tc.bundle, ExtraCAs: tc.extras}}
			errs := fieldErrors(c.ValidatePeers())
			for f, e := range errs {
				if strings.HasPrefix(f, "sandbox.ca_bundle") || strings.HasPrefix(f, "sandbox.extra_cas") {
					if tc.field == "" {
						t.Errorf("refused: %s: %s", f, e)
					}
				}
			}
			if tc.field != "" {
				if got, ok := errs[tc.field]; !ok || !strings.Contains(got, tc.want) {
					t.Errorf("%s: %q (errors %v), want one saying %q", tc.field, got, errs, tc.want)
				}
				if c.Sandbox.CAs != nil {
					t.Errorf("a refused trust store kept %d bytes", len(c.Sandbox.CAs))
				}
				return
			}
			var want []byte
			for _, f := range tc.wantCert {
				want = append(want, certsOf(t, f)...)
			}
			if got := string(c.Sandbox.CAs); got != string(want) {
				t.Errorf("CAs hold %d bytes, want the %d of the certificates of %v", len(got), len(want), tc.wantCert)
			}
		})
	}
}

// testCert is a self-signed certificate, a CA or a leaf, and its key, in PEM.
func testCert(t *testing.T, isCA bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	name := "leaf"
	if isCA {
		name = "test CA"
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true, IsCA: isCA}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// certsOf is the certificates of a PEM file, re-encoded, as the trust
// store holds them.
func certsOf(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: b.Bytes})...)
	}
}
