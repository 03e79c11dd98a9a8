// Package config owns the executor's config file: the common server part
// from pkg/config plus the peers the executor calls. Only the executor's main
// and composition root import it.
package config

import (
	"errors"

	"github.com/airlockhq/airlock/pkg/config"
)

// Config is the executor's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Authority is where the executor fetches source and reports results.
	Authority config.Peer `yaml:"authority"`
}

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service.
func (c *Config) ValidatePeers() error {
	return errors.Join(config.ValidatePeer("authority", c.Authority))
}

// Load reads and validates the file at path; override applies command-line flags.
func Load(path string, override func(*config.Server)) (*Config, error) {
	var c Config
	if err := config.LoadService(path, &c, override); err != nil {
		return nil, err
	}
	return &c, nil
}
