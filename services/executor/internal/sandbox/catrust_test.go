package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/pki"
)

// TestTrustStore: under each class, a job finds the configured CA bundle,
// and only it, at every path where a distribution's tools look (the same
// bytes through each), read-only, with SSL_CERT_FILE and
// NODE_EXTRA_CA_CERTS naming it; OpenSSL, by its default paths with and
// without the variable (the host's /usr/lib/ssl/cert.pem links to the
// Debian path), verifies a certificate the configured CA issued.
func TestTrustStore(t *testing.T) {
	ca, err := pki.NewCA("trust.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.IssueHost(pki.IssueOptions{DNSNames: []string{"registry.test"}})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := caPEM(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bundle)
	e := newEnv(t, func(c *Config) { c.CABundle = bundle })
	var script strings.Builder
	script.WriteString("b=/etc/ssl/certs/ca-certificates.crt\nsha256sum $b | cut -d' ' -f1\nstat -c %a $b\n")
	for _, p := range caBundleLinks {
		fmt.Fprintf(&script, "cmp -s $b /%s && echo same /%s || echo DIFFERENT /%s\n", p, p, p)
	}
	script.WriteString(`echo "env $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE"
(echo x >> $b) 2>/dev/null && echo WROTE || echo write refused
(rm -f /etc/ssl/cert.pem && ln -s /tmp/mine /etc/ssl/cert.pem) 2>/dev/null && echo RELINKED || echo relink refused
openssl verify /work/leaf.pem 2>&1
env -u SSL_CERT_FILE openssl verify /work/leaf.pem 2>&1
`)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, map[string]string{"leaf.pem": string(leaf.CertPEM)}),
				cmd: []string{"sh", "-c", script.String()}})
			wantExit(t, r, 0)
			var want strings.Builder
			fmt.Fprintf(&want, "%s\n644\n", hex.EncodeToString(sum[:]))
			for _, p := range caBundleLinks {
				fmt.Fprintf(&want, "same /%s\n", p)
			}
			b := "/etc/ssl/certs/ca-certificates.crt"
			fmt.Fprintf(&want, "env %s %s %s\nwrite refused\nrelink refused\n/work/leaf.pem: OK\n/work/leaf.pem: OK\n", b, b, b)
			if r.stdout != want.String() {
				t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want.String())
			}
		})
	}
}

// TestJobCAs: under each class, a job given CAs of its own (Spec.ExtraCAs,
// as a job with brokered credentials gets its egress proxy's) finds the
// trust store followed by them at the bundle's path and through every
// link, cannot write it, has GIT_SSL_CAINFO naming it, and OpenSSL
// verifies a certificate the extra CA issued; a job without them still
// sees the trust store alone.
func TestJobCAs(t *testing.T) {
	caPEMOf := func(name string) (*pki.CA, []byte) {
		ca, err := pki.NewCA(name, 0)
		if err != nil {
			t.Fatal(err)
		}
		return ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	}
	_, store := caPEMOf("store.test")
	jobCA, extra := caPEMOf("job-proxy.test")
	leaf, err := jobCA.IssueHost(pki.IssueOptions{DNSNames: []string{"api.test"}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.CABundle = store })
	withExtra := sha256.Sum256(append(append([]byte{}, store...), extra...))
	storeOnly := sha256.Sum256(store)
	var script strings.Builder
	script.WriteString("b=/etc/ssl/certs/ca-certificates.crt\nsha256sum $b | cut -d' ' -f1\n")
	for _, p := range caBundleLinks {
		fmt.Fprintf(&script, "sha256sum /%s | cut -d' ' -f1\n", p)
	}
	script.WriteString(`echo "git=$GIT_SSL_CAINFO"
(echo x >> $b) 2>/dev/null && echo WROTE || echo write refused
(cat /dev/null > $b) 2>/dev/null && echo TRUNCATED || echo truncate refused
(mv $b /tmp/x) 2>/dev/null && echo MOVED || echo move refused
openssl verify /work/leaf.pem >/dev/null 2>&1 && echo verified || echo not verified
`)
	src := e.source(t, map[string]string{"leaf.pem": string(leaf.CertPEM)})
	for _, c := range testClasses(t, e) {
		for _, tc := range []struct {
			name  string
			extra []byte
			sum   [32]byte
			git   string
			ok    string
		}{
			{"extra", extra, withExtra, "/etc/ssl/certs/ca-certificates.crt", "verified"},
			{"none", nil, storeOnly, "", "not verified"},
		} {
			t.Run(string(c)+"/"+tc.name, func(t *testing.T) {
				r := e.run(t, context.Background(), job{class: c, src: src, extraCAs: tc.extra, cmd: []string{"sh", "-c", script.String()}})
				wantExit(t, r, 0)
				var want strings.Builder
				for range len(caBundleLinks) + 1 {
					fmt.Fprintf(&want, "%s\n", hex.EncodeToString(tc.sum[:]))
				}
				fmt.Fprintf(&want, "git=%s\nwrite refused\ntruncate refused\nmove refused\n%s\n", tc.git, tc.ok)
				if r.stdout != want.String() {
					t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want.String())
				}
			})
		}
	}
}

// TestJobCAsRefused: Create refuses a spec whose own CAs are not CA
// certificates alone (a key beside them, a leaf), and any under the vm
// class.
func TestJobCAsRefused(t *testing.T) {
	ca, err := pki.NewCA("refused.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	caCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	leaf, err := ca.IssueHost(pki.IssueOptions{DNSNames: []string{"api.test"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		class Class
		cas   []byte
		want  string
	}{
		{"key", ClassRunc, append(append([]byte{}, caCert...), leaf.KeyPEM...), "want only CERTIFICATE blocks"},
		{"leaf", ClassRunsc, leaf.CertPEM, "not a CA certificate"},
		{"vm", ClassVM, caCert, "does not take a job's own CAs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec{ID: "job-cas", Class: tc.class, Source: "/nonexistent", Command: []string{"true"}, Limits: defaultLimits, ExtraCAs: tc.cas}
			err := s.validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("validate: %v, want an invalid argument saying %q", err, tc.want)
			}
		})
	}
}
