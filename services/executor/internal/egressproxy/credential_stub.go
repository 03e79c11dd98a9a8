package egressproxy

// Compile-only stub of the brokered credentials' API, replaced at merge by
// the real implementation (branch of the egress proxy's helper); nothing
// here intercepts, injects or records anything. Config.Credentials,
// Config.Roots and Decision.Request are fields of the real implementation
// that a second file cannot add: the run manager sets credentials with
// SetCredentials and reads requests through runs.requestOf until then.

import (
	"crypto/x509"
	"time"
)

// ModeRequest is a request line: one HTTP request inside an intercepted
// TLS connection. Replaced at merge by the real implementation.
const ModeRequest Mode = "request"

// Credential is one brokered credential the proxy adds to requests to its
// hosts. Replaced at merge by the real implementation.
type Credential struct {
	Name        string
	Hosts       []string
	Header      string
	Value       string // the header's value, format applied
	Secret      string
	Placeholder string
	Roots       *x509.CertPool
	Expires     time.Time
}

// Request is what a request line says. Replaced at merge by the real
// implementation.
type Request struct {
	Method, Path string
	Status       int
	Credential   string
	Allowed      bool
}

// CACertPEM is the per-job interception CA's certificate. The stub has
// none. Replaced at merge by the real implementation.
func (p *Proxy) CACertPEM() []byte { return nil }

// SetCredentials replaces the credentials the proxy adds. The stub keeps
// nothing. Replaced at merge by the real implementation.
func (p *Proxy) SetCredentials([]Credential) error { return nil }
