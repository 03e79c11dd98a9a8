package egressproxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/pki"
)

// Credential is a secret the proxy adds to a job's HTTPS requests to some
// hosts, so that the job uses it without ever holding it.
type Credential struct {
	// Name names it in records and refusals; unique within a proxy.
	Name string
	// Hosts are exact names and "*.SUFFIX" patterns (any name one or more
	// labels below SUFFIX, never SUFFIX itself), normalised as
	// egress.NormalizeName does.
	Hosts []string
	// Header is the request header set to Value (e.g. "Authorization"),
	// replacing any the job sent.
	Header string
	// Value is the header's whole value, its format already applied.
	Value string
	// Secret is the raw secret, which replaces Placeholder.
	Secret string
	// Placeholder, when set ("airlock-cred:NAME:RANDOM"), is what the job
	// holds in its place; the proxy replaces the whole of Header, where a
	// tool puts it, with Value on Hosts, and never sends it elsewhere.
	Placeholder string
	// Roots verify the upstream's certificate; nil is Config.Roots.
	Roots *x509.CertPool
	// Expires is when the lease ends: a request after it is refused.
	// Zero is never.
	Expires time.Time
}

// matches reports whether name (normalised) is one of c's hosts, as a
// network policy's names match: "*.SUFFIX" is one label below SUFFIX.
func (c *Credential) matches(name string) bool {
	for _, h := range c.Hosts {
		if (egress.Name{Name: h}).Matches(name) {
			return true
		}
	}
	return false
}

// framing are the headers a reverse proxy drops or owns, none of which
// can carry a credential to the upstream.
var framing = []string{"Connection", "Content-Length", "Host", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// checkCredentials validates creds and returns them with their hosts
// normalised.
func checkCredentials(creds []Credential) ([]Credential, error) {
	out := make([]Credential, 0, len(creds))
	seen := make(map[string]bool)
	for i, c := range creds {
		where := fmt.Sprintf("egressproxy: credentials[%d]", i)
		switch {
		case c.Name == "":
			return nil, fmt.Errorf("%s: Name is empty", where)
		case seen[c.Name]:
			return nil, fmt.Errorf("%s: Name %q is given twice", where, c.Name)
		case len(c.Hosts) == 0:
			return nil, fmt.Errorf("%s (%s): Hosts is empty", where, c.Name)
		case !httpguts.ValidHeaderFieldName(c.Header):
			return nil, fmt.Errorf("%s (%s): Header %q is not an HTTP header name", where, c.Name, c.Header)
		case slices.Contains(framing, http.CanonicalHeaderKey(c.Header)):
			return nil, fmt.Errorf("%s (%s): Header %q frames the request or its connection, it cannot carry a credential", where, c.Name, c.Header)
		case strings.ContainsAny(c.Value, "\r\n\x00"):
			return nil, fmt.Errorf("%s (%s): Value has a CR, LF or NUL", where, c.Name)
		case c.Value == "":
			return nil, fmt.Errorf("%s (%s): Value is empty", where, c.Name)
		case c.Placeholder != "" && strings.ContainsAny(c.Secret, "\r\n\x00"):
			return nil, fmt.Errorf("%s (%s): Secret has a CR, LF or NUL", where, c.Name)
		case c.Placeholder != "" && c.Secret == "":
			return nil, fmt.Errorf("%s (%s): Placeholder is set and Secret is empty", where, c.Name)
		}
		seen[c.Name] = true
		hosts := make([]string, 0, len(c.Hosts))
		for j, h := range c.Hosts {
			n, err := egress.NormalizeName(h)
			if err != nil {
				return nil, fmt.Errorf("%s (%s): Hosts[%d]: %v", where, c.Name, j, err)
			}
			if !slices.Contains(hosts, n) {
				hosts = append(hosts, n)
			}
		}
		c.Hosts = hosts
		out = append(out, c)
	}
	return out, nil
}

// credentialFor is the first of creds whose hosts name is one of, or nil.
func credentialFor(creds []Credential, name string) *Credential {
	for i := range creds {
		if creds[i].matches(name) {
			return &creds[i]
		}
	}
	return nil
}

// caValidity is how long a job's CA and its leaves are valid: longer than
// any job runs, short enough that a copy of the certificate the job holds
// is worthless soon after.
const caValidity = 24 * time.Hour

// jobCA is the per-job CA the proxy terminates intercepted TLS with. Its
// key exists in this process's memory only; the job trusts its certificate
// (CACertPEM) and nothing else of it.
type jobCA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	// domains are the CA's permitted DNS name constraints.
	domains []string

	mu     sync.Mutex
	leaves map[string]*tls.Certificate // by name
}

// newJobCA makes a CA constrained to creds' hosts: an exact name permits
// that name (and, as RFC 5280 has it, names below it), "*.SUFFIX" permits
// SUFFIX's subtree.
func newJobCA(creds []Credential) (*jobCA, error) {
	var domains []string
	for _, c := range creds {
		for _, h := range c.Hosts {
			if d := strings.TrimPrefix(h, "*."); !slices.Contains(domains, d) {
				domains = append(domains, d)
			}
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egressproxy: job CA key: %w", err)
	}
	sn, err := pki.NewSerial()
	if err != nil {
		return nil, fmt.Errorf("egressproxy: job CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                sn,
		Subject:                     pkix.Name{Organization: []string{"Airlock"}, CommonName: "Airlock job egress CA"},
		NotBefore:                   now.Add(-time.Minute),
		NotAfter:                    now.Add(caValidity),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         domains,
		// And no address: a leaf for an IP literal is never made, and a
		// key that leaked could sign none.
		ExcludedIPRanges: []*net.IPNet{{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, {IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("egressproxy: job CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egressproxy: job CA: %w", err)
	}
	return &jobCA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		domains: domains,
		leaves:  make(map[string]*tls.Certificate),
	}, nil
}

// permits reports whether the CA's constraints allow a leaf for host (a
// Credential host, exact or "*.SUFFIX").
func (ca *jobCA) permits(host string) bool {
	h := strings.TrimPrefix(host, "*.")
	for _, d := range ca.domains {
		if h == d || strings.HasSuffix(h, "."+d) {
			return true
		}
	}
	return false
}

// maxLeaves bounds the leaves a job CA keeps.
const maxLeaves = 256

// leaf is a certificate for exactly name, made once (while it is among
// the last maxLeaves made).
func (ca *jobCA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if l := ca.leaves[name]; l != nil {
		return l, nil
	}
	if len(ca.leaves) >= maxLeaves {
		// A wildcard host lets a job ask for names without end.
		clear(ca.leaves)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := pki.NewSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    ca.cert.NotBefore,
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	ca.leaves[name] = l
	return l, nil
}

// CACertPEM is the certificate of the proxy's per-job CA, which the job
// must trust for the hosts of its credentials; nil when the proxy was made
// without credentials.
func (p *Proxy) CACertPEM() []byte {
	if p.ca == nil {
		return nil
	}
	return p.ca.certPEM
}

// SetCredentials makes creds the credentials in force, at once: a request
// after it returns gets a credential from creds only, and every open
// connection intercepted for a credential creds no longer has for its name
// has been cut. A credential that is gone is still intercepted for, every
// request answered 403 (a clear answer, rather than the upstream's to a
// request without it). It is for a lease revoked, expired or renewed, or a
// narrowing: a host outside what the job's CA was made for (the
// credentials New was given) is refused, and so is any credential when New
// was given none. An invalid creds changes nothing.
func (p *Proxy) SetCredentials(creds []Credential) error {
	creds, err := checkCredentials(creds)
	if err != nil {
		return err
	}
	for _, c := range creds {
		for _, h := range c.Hosts {
			if p.ca == nil || !p.ca.permits(h) {
				return fmt.Errorf("egressproxy: credential %s: host %s is outside what the job's CA was made for", c.Name, h)
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.creds
	p.creds = creds
	for _, o := range old {
		if !slices.ContainsFunc(creds, func(c Credential) bool { return c.Name == o.Name }) {
			p.revoked = append(p.revoked, Credential{Name: o.Name, Hosts: o.Hosts})
		}
	}
	p.revoked = slices.DeleteFunc(p.revoked, func(r Credential) bool {
		return slices.ContainsFunc(creds, func(c Credential) bool { return c.Name == r.Name })
	})
	for c := range p.conns {
		if c.cred == "" {
			continue
		}
		was := credentialFor(old, c.name)
		if now := credentialFor(creds, c.name); was != nil && was.Name == c.cred && (now == nil || now.Name != c.cred) {
			p.cutLocked(c, fmt.Sprintf("cut: the brokered credential %s is no longer leased for %s", c.cred, c.name))
		}
	}
	return nil
}

// credential is the credential in force for name, or nil.
func (p *Proxy) credential(name string) *Credential {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cr := credentialFor(p.creds, name); cr != nil {
		c := *cr
		return &c
	}
	return nil
}
