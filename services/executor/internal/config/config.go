// Package config owns the executor's config file: the common server part
// from pkg/config, the authority it serves, and its sandbox settings. Only
// the executor's main and composition root import it.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/pkg/config"
)

// Config is the executor's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Authority is where the executor fetches source and reports results.
	Authority Authority `yaml:"authority"`
	// Sandbox configures the OCI runtimes.
	Sandbox Sandbox `yaml:"sandbox"`
	// OutputLimit caps each of a job's stdout and stderr, in bytes; default 4 MiB.
	OutputLimit int64 `yaml:"output_limit"`
}

// Authority is the executor's authority peer.
type Authority struct {
	config.Peer `yaml:",inline"`
	// GrantPublicKey is the PEM Ed25519 key grants must be signed with.
	GrantPublicKey string `yaml:"grant_public_key"`
}

// Sandbox configures the runtimes.
type Sandbox struct {
	// Runc is the runc binary (built from the pinned module by tools/sandbox/build.sh).
	Runc string `yaml:"runc"`
	// Runsc is the gVisor runsc binary; empty disables the runsc class.
	Runsc string `yaml:"runsc"`
	// UIDBase is the host uid and gid that root inside a sandbox maps to; default 1000000.
	UIDBase uint32 `yaml:"uid_base"`
	// CgroupParent is the cgroup under which job cgroups are made. It must
	// be this executor's alone: at start the executor removes every job
	// cgroup under it as a leftover. Default /airlock/<hash of data_dir>.
	CgroupParent string `yaml:"cgroup_parent"`
}

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service.
func (c *Config) ValidatePeers() error {
	var errs []error
	errs = append(errs, config.ValidatePeer("authority", c.Authority.Peer))
	errs = append(errs, c.file("authority.grant_public_key", &c.Authority.GrantPublicKey, true))
	errs = append(errs, c.file("sandbox.runc", &c.Sandbox.Runc, true))
	errs = append(errs, c.file("sandbox.runsc", &c.Sandbox.Runsc, false))
	if c.Sandbox.UIDBase == 0 {
		c.Sandbox.UIDBase = 1000000
	} else if c.Sandbox.UIDBase < 65536 {
		errs = append(errs, config.Field("sandbox.uid_base", "%d: must be at least 65536 so no sandbox uid is a real host user", c.Sandbox.UIDBase))
	}
	if c.Sandbox.CgroupParent == "" {
		sum := sha256.Sum256([]byte(c.DataDir))
		c.Sandbox.CgroupParent = "/airlock/" + hex.EncodeToString(sum[:6])
	} else if !filepath.IsAbs(c.Sandbox.CgroupParent) {
		errs = append(errs, config.Field("sandbox.cgroup_parent", "%q: must be an absolute cgroup path", c.Sandbox.CgroupParent))
	}
	if c.OutputLimit < 0 {
		errs = append(errs, config.Field("output_limit", "must not be negative"))
	}
	return errors.Join(errs...)
}

// file makes a path absolute relative to the data directory's config base
// (already absolute paths stay) and checks it exists.
func (c *Config) file(field string, p *string, required bool) error {
	if *p == "" {
		if required {
			return config.Field(field, "required")
		}
		return nil
	}
	if !filepath.IsAbs(*p) {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return config.Field(field, "%v", err)
		}
		*p = abs
	}
	if _, err := os.Stat(*p); err != nil {
		return config.Field(field, "%v", err)
	}
	return nil
}

// Load reads and validates the file at path; override applies command-line flags.
func Load(path string, override func(*config.Server)) (*Config, error) {
	var c Config
	if err := config.LoadService(path, &c, override); err != nil {
		return nil, err
	}
	return &c, nil
}
