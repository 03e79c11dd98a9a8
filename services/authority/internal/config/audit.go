package config

import (
	"errors"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/checkpoints"
)

// AuditFile configures the audit log's readers and its checkpoints.
type AuditFile struct {
	// Auditors are approver principals (approver/NAME) who read and verify
	// the whole log; every other approver reads only the entries of the
	// tenants that list it. Default none.
	Auditors []string `yaml:"auditors"`
	// CheckpointKey is the Ed25519 PKCS#8 PEM key checkpoints of the log's
	// head are signed with; it must not live in the database, nor be the
	// grant key. Default <data_dir>/audit-checkpoint.key, created (0600,
	// with audit-checkpoint.key.pub beside it) when missing.
	CheckpointKey string `yaml:"checkpoint_key"`
	// CheckpointFile is the append-only file the signed checkpoints are
	// written to (one JSON line each); default
	// <data_dir>/audit-checkpoints.jsonl.
	CheckpointFile string `yaml:"checkpoint_file"`
	// CheckpointEvery is the most entries between two checkpoints; default
	// 100, between 1 and 100000.
	CheckpointEvery int64 `yaml:"checkpoint_every"`
	// CheckpointInterval is the longest a new entry waits for a
	// checkpoint; default 1m, between 1s and 24h.
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
}

// validate checks the audit section and fills in its defaults.
func (a *AuditFile) validate(c *Config) error {
	auditors, errs := principals("audit.auditors", c.checkedTrustDomain(), identity.KindApprover, a.Auditors)
	a.Auditors = auditors
	for _, f := range []struct {
		field, def string
		v          *string
	}{
		{"audit.checkpoint_key", "audit-checkpoint.key", &a.CheckpointKey},
		{"audit.checkpoint_file", "audit-checkpoints.jsonl", &a.CheckpointFile},
	} {
		if *f.v == "" {
			if c.DataDir != "" {
				*f.v = filepath.Join(c.DataDir, f.def)
			}
			continue
		}
		*f.v = resolve(c.base, *f.v)
	}
	if a.CheckpointKey != "" && a.CheckpointKey == c.GrantKey {
		errs = append(errs, config.Field("audit.checkpoint_key", "%s is the grant key: checkpoints need a key of their own", a.CheckpointKey))
	}
	switch {
	case a.CheckpointEvery == 0:
		a.CheckpointEvery = checkpoints.DefaultEvery
	case a.CheckpointEvery < 1 || a.CheckpointEvery > 100000:
		errs = append(errs, config.Field("audit.checkpoint_every", "%d: must be between 1 and 100000", a.CheckpointEvery))
	}
	switch {
	case a.CheckpointInterval == 0:
		a.CheckpointInterval = checkpoints.DefaultInterval
	case a.CheckpointInterval < time.Second || a.CheckpointInterval > 24*time.Hour:
		errs = append(errs, config.Field("audit.checkpoint_interval", "%v: must be between 1s and 24h", a.CheckpointInterval))
	}
	return errors.Join(errs...)
}
