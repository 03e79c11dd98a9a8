// Package config owns the publisher's config file: the common server part
// from pkg/config plus the peers the publisher calls, its store and its
// content scan. Only the publisher's main and composition root import it.
package config

import (
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/sqldb"
)

// Config is the publisher's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Authority is where the publisher reads publish specs, consumes
	// approvals and leases credentials.
	Authority Authority `yaml:"authority"`
	// Executor was the one executor's address; a job's bundle is now
	// fetched from the executor the authority says it ran on. A file that
	// still sets it is refused with a sentence saying so.
	Executor *config.Peer `yaml:"executor"`
	// Store is where deployments are kept: sqlite (default,
	// <data_dir>/publisher.db) or postgres (for replicas).
	Store sqldb.Config `yaml:"store"`
	// Scan configures the content validation.
	Scan Scan `yaml:"scan"`
}

// Authority is the publisher's authority peer.
type Authority struct {
	config.Peer `yaml:",inline"`
	// GrantPublicKey is the set of PEM Ed25519 keys the grant inside each
	// bundle may be signed with (the authority's grant keys): a file of one
	// or more keys or a directory of *.pub files, re-read on change as the
	// executor's is.
	GrantPublicKey string `yaml:"grant_public_key"`
}

// Scan configures the content validation.
type Scan struct {
	// DecodeDepth is how many rounds of base64, hex and percent decoding
	// the secret scan makes; default 2, at most 8.
	DecodeDepth int `yaml:"decode_depth"`
}

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service.
func (c *Config) ValidatePeers() error {
	errs := []error{
		config.ValidatePeer("authority", c.Authority.Peer),
		c.Server.CheckFile("authority.grant_public_key", &c.Authority.GrantPublicKey, true),
		noExecutor(c.Executor),
		c.Store.Validate("publisher.db"),
	}
	switch d := c.Scan.DecodeDepth; {
	case d == 0:
		c.Scan.DecodeDepth = contentcheck.DefaultDecodeDepth
	case d < 0 || d > contentcheck.MaxDecodeDepth:
		errs = append(errs, config.Field("scan.decode_depth", "%d: must be between 1 and %d", d, contentcheck.MaxDecodeDepth))
	}
	return errors.Join(errs...)
}

// Load reads and validates the file at path; override applies command-line flags.
func Load(path string, override func(*config.Server)) (*Config, error) {
	var c Config
	if err := config.LoadService(path, &c, override); err != nil {
		return nil, err
	}
	return &c, nil
}

// Check is --check-config: the file at path loaded as Load does, and every
// file it names read as a start would (config.Check), creating nothing.
func Check(path string, override func(*config.Server)) (string, []error) {
	return config.Check("publisher", path, &Config{}, override)
}

// CheckFiles implements config.Checker: the grant public key must parse.
func (c *Config) CheckFiles() ([]string, error) {
	return nil, config.CheckPublicKey("authority.grant_public_key", c.Authority.GrantPublicKey)
}

// Summary implements config.Checker.
func (c *Config) Summary() string {
	return fmt.Sprintf("authority %s, store %s", c.Authority.Address, c.Store.Driver)
}

// noExecutor refuses the old executor field.
func noExecutor(p *config.Peer) error {
	if p != nil {
		return config.Field("executor", "no longer used: each bundle is fetched from the executor the authority says the job ran on; remove it")
	}
	return nil
}
