package config

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// LoadTLS loads the files of tls (the CA bundle, the certificate and its
// key) and checks the certificate is the named service's in trust_domain.
// A start and --check-config both call it, so a config that checks is one
// whose identity loads. opts go to the file source (a start passes its
// logger, so a failed certificate reload is logged where its logs go).
func (s *Server) LoadTLS(name string, opts ...tlsconfig.Option) (*tlsconfig.Source, identity.ID, error) {
	// The bundle first, on its own, so its problems name tls.ca.
	if _, err := tlsconfig.LoadRoots(s.TLS.CA); err != nil {
		return nil, identity.ID{}, Field("tls.ca", "%v", err)
	}
	src, err := tlsconfig.NewFileSource(s.TLS.CA, s.TLS.Cert, s.TLS.Key, opts...)
	if err != nil {
		field := "tls.cert"
		if msg := err.Error(); strings.Contains(msg, "key input") || strings.Contains(msg, "private key") {
			field = "tls.key"
		}
		return nil, identity.ID{}, Field(field, "%v", err)
	}
	self, err := checkIdentity(src, *s, name)
	if err != nil {
		return nil, identity.ID{}, err
	}
	return src, self, nil
}

// checkIdentity returns our identity, or an error when tls.cert is not the
// named service's that says what to fix: the files, trust_domain, or the
// certificate (reissued with `airlock pki issue`).
func checkIdentity(src *tlsconfig.Source, cfg Server, name string) (identity.ID, error) {
	self, err := src.ID()
	if err != nil {
		return identity.ID{}, err
	}
	want := identity.Service(cfg.TrustDomain, name)
	if self == want {
		return self, nil
	}
	if self.IsExecutor() && name == identity.ServiceExecutor && self.TrustDomain == cfg.TrustDomain {
		return self, nil // an executor of a fleet, named by its certificate
	}
	dir := "DIR"
	if pki.CAPath(filepath.Dir(cfg.TLS.CA)) == cfg.TLS.CA {
		dir = filepath.Dir(cfg.TLS.CA)
	}
	issue := fmt.Sprintf("`airlock pki issue --dir %s --id %s`", dir, want.Principal())
	switch {
	case self.Kind != want.Kind || self.Name != want.Name:
		return identity.ID{}, fmt.Errorf("tls.cert is for %s, not the %s (%s): point tls.cert and tls.key at the %s's certificate and key, or issue them with %s",
			self, name, want, name, issue)
	case src.Verify() == nil:
		return identity.ID{}, fmt.Errorf("tls.cert is for %s, but trust_domain is %s: the certificate and the CA in tls.ca are both of trust domain %s, so fix trust_domain in the config (trust_domain: %s)",
			self, cfg.TrustDomain, self.TrustDomain, self.TrustDomain)
	default:
		return identity.ID{}, fmt.Errorf("tls.cert is for %s, but trust_domain is %s, and the certificate does not verify against the CA in tls.ca: reissue it from that CA with %s",
			self, cfg.TrustDomain, issue)
	}
}
