// Package config owns the authority's config file: the common server part
// from pkg/config, the executor it dispatches to, the grant-signing key and
// the tenants' policies, validated once into a policy.Tenants the domain
// uses without further checks. Only the authority's main and composition
// root import it.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// DefaultGrantTTL is how long a grant may wait for an executor to accept
// it when the file does not say.
const DefaultGrantTTL = 10 * time.Minute

// Config is the authority's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Executor was the one executor's address. Executors now join the
	// fleet by their heartbeat; a file that still sets it is refused with
	// a sentence saying so.
	Executor *config.Peer `yaml:"executor"`
	// Fleet is how the authority keeps its executors.
	Fleet FleetFile `yaml:"fleet"`
	// Replica names this authority in its claims on jobs: replicas on one
	// PostgreSQL database must have different names. Default: the host
	// name and the data directory.
	Replica string `yaml:"replica"`
	// GrantKey is the Ed25519 PKCS#8 PEM key grants are signed with;
	// default <data_dir>/grant.key, created (0600, with grant.key.pub beside
	// it) when missing. It may instead name an existing directory of *.key
	// files, for a rotation: the last by name signs, and every one's public
	// key is written to <grant_key>.pub for the executors' trusted set.
	GrantKey string `yaml:"grant_key"`
	// GrantTTL is how long a grant may wait before an executor must start
	// it; default 10m.
	GrantTTL time.Duration `yaml:"grant_ttl"`
	// Tenants maps a tenant name to its policy as written.
	Tenants map[string]TenantFile `yaml:"tenants"`
	// Store is where the authority keeps jobs and the audit log; default
	// SQLite in the data directory.
	Store StoreFile `yaml:"store"`
	// Audit says who reads the whole audit log and how its head is
	// anchored outside the database.
	Audit AuditFile `yaml:"audit"`
	// Metering is the operator's prices of usage (metering.go).
	Metering MeteringFile `yaml:"metering"`

	// Policy is Tenants, validated, with defaults filled in.
	Policy policy.Tenants `yaml:"-"`
	// MeteringPolicy is Metering and the tenants' budgets, validated.
	MeteringPolicy Metering `yaml:"-"`

	// base is the config file's directory, for relative paths.
	base string
}

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service: it checks everything beyond the
// common part and builds Policy.
func (c *Config) ValidatePeers() error {
	var errs []error
	if c.Executor != nil {
		errs = append(errs, config.Field("executor", "no longer used: executors join the fleet by their own heartbeat to the authority (their authority.address); remove it"))
	}
	errs = append(errs, c.Fleet.validate())
	if len(c.Replica) > 128 {
		errs = append(errs, config.Field("replica", "%d bytes: at most 128", len(c.Replica)))
	}
	if c.GrantKey == "" {
		if c.DataDir != "" {
			c.GrantKey = filepath.Join(c.DataDir, "grant.key")
		}
	} else {
		c.GrantKey = resolve(c.base, c.GrantKey)
	}
	switch {
	case c.GrantTTL == 0:
		c.GrantTTL = DefaultGrantTTL
	case c.GrantTTL < 10*time.Second || c.GrantTTL > 24*time.Hour:
		errs = append(errs, config.Field("grant_ttl", "%v: must be between 10s and 24h", c.GrantTTL))
	}
	errs = append(errs, c.Store.Validate("authority.db"), c.Audit.validate(c), c.metering())
	c.Policy = policy.Tenants{}
	for _, name := range sortedKeys(c.Tenants) {
		t, err := c.tenant(name, c.Tenants[name])
		errs = append(errs, err)
		if err == nil {
			c.Policy[name] = t
		}
	}
	return errors.Join(errs...)
}

func resolve(base, p string) string {
	if filepath.IsAbs(p) || base == "" {
		return filepath.Clean(p)
	}
	return filepath.Join(base, p)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Load reads and validates the file at path; override applies command-line flags.
func Load(path string, override func(*config.Server)) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c := Config{base: filepath.Dir(abs)}
	if err := config.LoadService(path, &c, override); err != nil {
		return nil, err
	}
	return &c, nil
}

// Check is --check-config: the file at path loaded as Load does, and every
// file it names read as a start would (config.Check), creating nothing: a
// missing key a start would make is a note in the summary.
func Check(path string, override func(*config.Server)) (string, []error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", []error{err}
	}
	return config.Check("authority", path, &Config{base: filepath.Dir(abs)}, override)
}

// CheckFiles implements config.Checker: the grant and checkpoint keys
// parse or can be made, and the checkpoint file can be opened.
func (c *Config) CheckFiles() ([]string, error) {
	var (
		notes []string
		errs  []error
	)
	for _, k := range []struct{ field, path string }{
		{"grant_key", c.GrantKey}, {"audit.checkpoint_key", c.Audit.CheckpointKey},
	} {
		if k.path == "" {
			continue
		}
		note, err := checkKey(k.field, k.path)
		errs = append(errs, err)
		if note != "" {
			notes = append(notes, note)
		}
	}
	if f := c.Audit.CheckpointFile; f != "" {
		// Opened O_CREATE, appended to: its directory must be there, unless
		// it is the data directory, which a start makes.
		if st, err := os.Stat(f); err == nil && !st.Mode().IsRegular() {
			errs = append(errs, config.Field("audit.checkpoint_file", "%s is not a regular file", f))
		} else if dir := filepath.Dir(f); dir != c.DataDir {
			if st, err := os.Stat(dir); err != nil {
				errs = append(errs, config.Field("audit.checkpoint_file", "%v", err))
			} else if !st.IsDir() {
				errs = append(errs, config.Field("audit.checkpoint_file", "%s is not a directory", dir))
			}
		}
	}
	return notes, errors.Join(errs...)
}

// checkKey reads the Ed25519 key a start loads or creates
// (pki.LoadOrCreateEd25519), creating none.
func checkKey(field, path string) (note string, err error) {
	if st, serr := os.Stat(path); serr == nil && st.IsDir() && field == "grant_key" {
		// A directory of signing keys (grant key rotation).
		if err := grant.CheckSigningKeyDir(path); err != nil {
			return "", config.Field(field, "%v", err)
		}
		return "", nil
	}
	_, err = pki.LoadEd25519(path)
	switch {
	case err == nil:
		return "", nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", config.Field(field, "%v", err)
	}
	if err := pki.CanCreateEd25519(path); err != nil {
		return "", config.Field(field, "%v", err)
	}
	return fmt.Sprintf("%s %s will be created", field, path), nil
}

// Summary implements config.Checker.
func (c *Config) Summary() string {
	return fmt.Sprintf("fleet heartbeat %v, lost after %v, store %s, %d tenants", c.Fleet.HeartbeatInterval, c.Fleet.LostAfter, c.Store.Driver, len(c.Policy))
}
