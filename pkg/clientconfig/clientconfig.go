// Package clientconfig owns the config file the airlock CLI (and any Go
// program acting as a caller) uses to reach an Airlock deployment: where the
// three services listen, the trust domain, and which identity to present.
// `airlock dev up` writes one; `airlock --config` or AIRLOCK_CONFIG reads it.
package clientconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// EnvVar names the environment variable that points at a client config.
const EnvVar = "AIRLOCK_CONFIG"

// Config is a client config file.
type Config struct {
	// Version must be 1.
	Version int `yaml:"version"`
	// TrustDomain is the deployment's SPIFFE trust domain.
	TrustDomain string `yaml:"trust_domain"`
	// PKIDir, when set, is a directory laid out by `airlock pki init`; an
	// identity given as KIND/NAME is looked up there.
	PKIDir string `yaml:"pki_dir,omitempty"`
	// Identity is the KIND/NAME to present when TLS is not set, e.g. client/dev.
	Identity string `yaml:"identity,omitempty"`
	// Tenant is the tenant commands act for when --tenant is not given.
	Tenant string `yaml:"tenant,omitempty"`
	// TLS names certificate files directly, overriding PKIDir and Identity.
	TLS *config.TLS `yaml:"tls,omitempty"`
	// Authority, Executor and Publisher are where the services listen.
	Authority config.Peer `yaml:"authority"`
	Executor  config.Peer `yaml:"executor"`
	Publisher config.Peer `yaml:"publisher"`
}

// Load reads and validates the file at path; relative paths in it are taken
// relative to its directory.
func Load(path string) (*Config, error) {
	var c Config
	if err := config.Load(path, &c); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if err := c.validate(filepath.Dir(abs)); err != nil {
		return nil, fmt.Errorf("client config %s: %w", path, err)
	}
	return &c, nil
}

func (c *Config) validate(base string) error {
	var errs []error
	if err := identity.ValidateTrustDomain(c.TrustDomain); err != nil {
		errs = append(errs, config.Field("trust_domain", "%v", err))
	}
	if c.PKIDir != "" && !filepath.IsAbs(c.PKIDir) {
		c.PKIDir = filepath.Join(base, c.PKIDir)
	}
	if c.TLS == nil && (c.PKIDir == "" || c.Identity == "") {
		errs = append(errs, config.Field("tls", "required unless pki_dir and identity are both set"))
	}
	if c.TLS != nil {
		for _, f := range []*string{&c.TLS.CA, &c.TLS.Cert, &c.TLS.Key} {
			if *f != "" && !filepath.IsAbs(*f) {
				*f = filepath.Join(base, *f)
			}
		}
	}
	for name, p := range map[string]config.Peer{"authority": c.Authority, "executor": c.Executor, "publisher": c.Publisher} {
		if p.Address != "" {
			if err := config.ValidatePeer(name, p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Save writes c to path atomically (0600: it names key files).
func (c *Config) Save(path string) error {
	data, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	return pki.WriteFileAtomic(path, data, 0o600)
}

// Source returns the TLS source for the identity to present: as, when not
// empty (KIND/NAME, looked up in PKIDir), else the config's own.
func (c *Config) Source(as string) (*tlsconfig.Source, error) {
	if as == "" && c.TLS != nil {
		return tlsconfig.NewFileSource(c.TLS.CA, c.TLS.Cert, c.TLS.Key)
	}
	if as == "" {
		as = c.Identity
	}
	if c.PKIDir == "" {
		return nil, fmt.Errorf("identity %q: the client config has no pki_dir to find it in", as)
	}
	id, err := identity.Parse("spiffe://" + c.TrustDomain + "/" + as)
	if err != nil {
		return nil, fmt.Errorf("identity %q: want KIND/NAME, e.g. client/dev: %w", as, err)
	}
	cert, key := pki.Paths(c.PKIDir, id)
	if _, err := os.Stat(cert); err != nil {
		return nil, fmt.Errorf("identity %s: no certificate in %s (issue one with `airlock pki issue --dir %s --id %s`)", as, c.PKIDir, c.PKIDir, as)
	}
	return tlsconfig.NewFileSource(pki.CAPath(c.PKIDir), cert, key)
}

// Address returns where the named service listens.
func (c *Config) Address(service string) (string, error) {
	var p config.Peer
	switch service {
	case "authority":
		p = c.Authority
	case "executor":
		p = c.Executor
	case "publisher":
		p = c.Publisher
	default:
		return "", fmt.Errorf("unknown service %q", service)
	}
	if p.Address == "" {
		return "", fmt.Errorf("the client config has no %s.address", service)
	}
	return p.Address, nil
}
