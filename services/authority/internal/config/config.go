// Package config owns the authority's config file: the common server part
// from pkg/config plus the peers the authority calls. Only the authority's main
// and composition root import it.
package config

import (
	"errors"

	"github.com/airlockhq/airlock/pkg/config"
)

// Config is the authority's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Executor is the executor the authority dispatches grants to.
	Executor config.Peer `yaml:"executor"`
}

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service.
func (c *Config) ValidatePeers() error {
	return errors.Join(config.ValidatePeer("executor", c.Executor))
}

// Load reads and validates the file at path; override applies command-line flags.
func Load(path string, override func(*config.Server)) (*Config, error) {
	var c Config
	if err := config.LoadService(path, &c, override); err != nil {
		return nil, err
	}
	return &c, nil
}
