package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"

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
