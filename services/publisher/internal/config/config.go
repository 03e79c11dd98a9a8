// Package config owns the publisher's config file: the common server part
// from pkg/config plus the peers the publisher calls. Only the publisher's main
// and composition root import it.
package config

import (
	"errors"

	"github.com/airlockhq/airlock/pkg/config"
)

// Config is the publisher's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Authority is where the publisher consumes approvals and leases credentials.
	Authority config.Peer `yaml:"authority"`
	// Executor is where the publisher fetches result bundles.
	Executor config.Peer `yaml:"executor"`
}

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service.
func (c *Config) ValidatePeers() error {
	return errors.Join(config.ValidatePeer("authority", c.Authority), config.ValidatePeer("executor", c.Executor))
}

// Load reads and validates the file at path; override applies command-line flags.
func Load(path string, override func(*config.Server)) (*Config, error) {
	var c Config
	if err := config.LoadService(path, &c, override); err != nil {
		return nil, err
	}
	return &c, nil
}
