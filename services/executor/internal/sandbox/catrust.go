package sandbox

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// The jobs' trust store. Every job gets the same PEM bundle of CA
// certificates, read once when the executor starts and written into the
// root filesystem template (so a change on the host reaches no running
// job, and the bundle's digest is part of TemplateVersion), read-only like
// the rest of /etc, at each path a distribution's tools look for it.

const (
	// DefaultCABundle is the host's public CA bundle (Debian's
	// ca-certificates), which jobs trust unless the operator names another.
	DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"
	// MaxCAFile bounds each CA file the operator names; Debian's whole
	// public bundle is about 220 KB.
	MaxCAFile = 1 << 20
)

// caBundlePath is where the bundle is inside the sandbox.
const caBundlePath = "etc/ssl/certs/ca-certificates.crt"

// caBundleLinks are the other paths where tools look for the bundle:
// Fedora/RHEL (tls/certs/ca-bundle.crt, ca-trust's extracted PEM),
// Alpine and the BSDs (ssl/cert.pem), openSUSE, OpenELEC. Each is a link
// to caBundlePath.
var caBundleLinks = []string{
	"etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"etc/pki/tls/cacert.pem",
	"etc/pki/tls/cert.pem",
	"etc/pki/tls/certs/ca-bundle.crt",
	"etc/ssl/ca-bundle.pem",
	"etc/ssl/cert.pem",
}

// caEnv points the tools that take their roots from the environment at
// the bundle: OpenSSL and Go (SSL_CERT_FILE); Node, whose official builds
// trust only the roots compiled into them (NODE_EXTRA_CA_CERTS adds these,
// the operator's extra CAs among them); Python's requests and pip, which
// otherwise use certifi's copy (REQUESTS_CA_BUNDLE).
var caEnv = map[string]string{
	"SSL_CERT_FILE":       "/" + caBundlePath,
	"NODE_EXTRA_CA_CERTS": "/" + caBundlePath,
	"REQUESTS_CA_BUNDLE":  "/" + caBundlePath,
}

// TrustedCAs is the jobs' trust store (Config.CABundle, checked), PEM CA
// certificates: what the executor trusts for a job's upstreams too, such
// as the hosts its egress proxy adds a brokered credential for.
func (m *Manager) TrustedCAs() []byte { return slices.Clone(m.cas) }

// gitCAEnv points git at the bundle (its http.sslCAInfo), for a job with
// CAs of its own: git built against GnuTLS or an OpenSSL with another
// default path would not read caBundlePath otherwise.
const gitCAEnv = "GIT_SSL_CAINFO"

// jobCABundle is the file of a job's own trust store in its sandbox's
// directory (Spec.ExtraCAs).
const jobCABundle = "ca-certificates.crt"

// writeCABundle writes the job's own trust store, the jobs' with
// Spec.ExtraCAs after it, into the sandbox's directory (0644: the job
// reads it through a read-only bind, owned by the host's root, so it
// cannot write it), adds gitCAEnv to the spec's environment unless the
// job sets it, and returns the file's path; "" when the spec has no CAs
// of its own. Only CA certificates go there (caPEM).
func (s *Sandbox) writeCABundle() (string, error) {
	if len(s.spec.ExtraCAs) == 0 {
		return "", nil
	}
	extra, err := caPEM(s.spec.ExtraCAs)
	if err != nil {
		return "", invalid("spec.extra_cas: %v", err)
	}
	p := filepath.Join(s.dir, jobCABundle)
	data := append(bytes.TrimRight(slices.Clone(s.m.cas), "\n"), '\n')
	if err := os.WriteFile(p, append(data, extra...), 0o644); err != nil {
		return "", fmt.Errorf("sandbox %s: the job's trust store: %w", s.spec.ID, err)
	}
	if _, ok := s.spec.Env[gitCAEnv]; !ok {
		env := maps.Clone(s.spec.Env)
		if env == nil {
			env = map[string]string{}
		}
		env[gitCAEnv] = "/" + caBundlePath
		s.spec.Env = env
	}
	return p, nil
}

// ReadCAFile reads a PEM file of CA certificates for the jobs' trust
// store, as the executor's sandbox.ca_bundle and sandbox.extra_cas name
// them: a regular file of at most MaxCAFile bytes holding at least one
// certificate and no other PEM block (a private key kept beside a proxy's
// CA would reach every job). What it returns is the certificates alone,
// re-encoded: text between the blocks (comments) is dropped.
func ReadCAFile(path string) ([]byte, error) {
	// Non-blocking, so a FIFO named here fails the check below rather
	// than hang the start.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxCAFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxCAFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxCAFile)
	}
	out, err := caPEM(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// caPEM checks that data is PEM holding CA certificates and nothing else,
// and returns them re-encoded.
func caPEM(data []byte) ([]byte, error) {
	begin := []byte("-----BEGIN")
	var out bytes.Buffer
	pos := 0
	for n := 1; ; n++ {
		i := bytes.Index(data[pos:], begin)
		if i < 0 {
			break
		}
		start := pos + i
		line := 1 + bytes.Count(data[:start], []byte("\n"))
		b, rest := pem.Decode(data[start:])
		end := len(data) - len(rest)
		// pem.Decode passes over a block it cannot decode to the next.
		if b == nil || bytes.Contains(data[start+len(begin):end], begin) {
			return nil, fmt.Errorf("block %d (line %d) is not a well-formed PEM block", n, line)
		}
		pos = end
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("block %d (line %d) is a %q, want only CERTIFICATE blocks", n, line, b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d (line %d): %v", n, line, err)
		}
		if !isCA(c) {
			return nil, fmt.Errorf("certificate %d (line %d, %q) is not a CA certificate (basic constraints CA:FALSE or absent)", n, line, c.Subject.String())
		}
		if err := pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}); err != nil {
			return nil, err
		}
	}
	if out.Len() == 0 {
		return nil, errors.New("no PEM certificate in it")
	}
	return out.Bytes(), nil
}

// isCA: basic constraints say CA, or a version 1 certificate issued by
// itself, which is how a few old roots are made.
func isCA(c *x509.Certificate) bool {
	if c.BasicConstraintsValid {
		return c.IsCA
	}
	return c.Version == 1 && bytes.Equal(c.RawIssuer, c.RawSubject)
}

// trustedCAs is the bundle Config.CABundle configures, checked (caPEM).
func trustedCAs(bundle []byte) ([]byte, error) {
	if bundle == nil {
		b, err := ReadCAFile(DefaultCABundle)
		if err != nil {
			return nil, fmt.Errorf("%w: sandbox.ca_bundle: not set, and the host's bundle cannot be used (install ca-certificates, or name a PEM file of CA certificates): %v", errdefs.ErrFailedPrecondition, err)
		}
		return b, nil
	}
	b, err := caPEM(bundle)
	if err != nil {
		return nil, invalid("sandbox.ca_bundle: %v", err)
	}
	return b, nil
}

// caEntries are the template's trust store: bundle, PEM CA certificates
// (caPEM's), at caBundlePath and a link to it at each of caBundleLinks,
// with the directories they need.
func caEntries(bundle []byte) []templateEntry {
	dirs := map[string]bool{}
	var out []templateEntry
	addDirs := func(p string) {
		for d := filepath.Dir(p); d != "etc" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			out = append(out, templateEntry{Path: d, Kind: "dir", Mode: 0o755})
		}
	}
	addDirs(caBundlePath)
	out = append(out, templateEntry{Path: caBundlePath, Kind: "file", Mode: 0o644, Content: string(bundle)})
	for _, l := range caBundleLinks {
		addDirs(l)
		target, err := filepath.Rel(filepath.Dir(l), caBundlePath)
		if err != nil {
			panic(err) // both are relative to the root
		}
		out = append(out, templateEntry{Path: l, Kind: "symlink", Target: target})
	}
	return out
}
