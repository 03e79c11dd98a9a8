package config

import (
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// PortForwardFile is a tenant's port forward policy as the file writes it.
type PortForwardFile struct {
	// Ports are the TCP ports inside a session a forward may reach: "PORT"
	// or "FIRST-LAST"; at least one.
	Ports []string `yaml:"ports"`
	// Approval is none (the default) or required: a new forward waits,
	// PENDING, until an approver who is not its requester approves it.
	Approval string `yaml:"approval"`
	// DefaultTTL is a forward's life when it asks none; default 15m.
	DefaultTTL time.Duration `yaml:"default_ttl"`
	// MaxTTL is the most a forward may ask; default 1h, at most 24h.
	MaxTTL time.Duration `yaml:"max_ttl"`
	// MaxOpen bounds the tenant's forwards open or pending at once;
	// default 8, at most 256.
	MaxOpen int `yaml:"max_open"`
}

// Port forward bounds.
const (
	defaultForwardTTL   = 15 * time.Minute
	defaultForwardMax   = time.Hour
	minForwardTTL       = time.Minute
	maxForwardTTLCap    = 24 * time.Hour
	defaultForwardsOpen = 8
	maxForwardsOpenCap  = 256
	maxForwardPortRules = 64
)

// portForward checks a tenant's port forward policy; nil is none.
func portForward(field string, f *PortForwardFile) (*policy.PortForward, []error) {
	if f == nil {
		return nil, nil
	}
	var errs []error
	out := &policy.PortForward{DefaultTTL: f.DefaultTTL, MaxTTL: f.MaxTTL, MaxOpen: f.MaxOpen}
	switch {
	case len(f.Ports) == 0:
		errs = append(errs, config.Field(field+".ports", "at least one port or range (e.g. \"3000\", \"8000-8999\") is required"))
	case len(f.Ports) > maxForwardPortRules:
		errs = append(errs, config.Field(field+".ports", "%d entries: at most %d", len(f.Ports), maxForwardPortRules))
	}
	for i, p := range f.Ports {
		r, err := policy.ParsePortRange(p)
		if err != nil {
			errs = append(errs, config.Field(fmt.Sprintf("%s.ports[%d]", field, i), "%v", err))
			continue
		}
		out.Ports = append(out.Ports, r)
	}
	switch f.Approval {
	case "", "none":
	case "required":
		out.ApprovalRequired = true
	default:
		errs = append(errs, config.Field(field+".approval", "%q: must be none or required", f.Approval))
	}
	if out.DefaultTTL == 0 {
		out.DefaultTTL = defaultForwardTTL
	}
	if out.MaxTTL == 0 {
		out.MaxTTL = max(defaultForwardMax, out.DefaultTTL)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"default_ttl", out.DefaultTTL}, {"max_ttl", out.MaxTTL}} {
		if d.v < minForwardTTL || d.v > maxForwardTTLCap {
			errs = append(errs, config.Field(field+"."+d.name, "%v: must be between %v and %v", d.v, minForwardTTL, maxForwardTTLCap))
		}
	}
	if out.MaxTTL < out.DefaultTTL {
		errs = append(errs, config.Field(field+".max_ttl", "%v is below default_ttl %v", out.MaxTTL, out.DefaultTTL))
	}
	switch {
	case out.MaxOpen == 0:
		out.MaxOpen = defaultForwardsOpen
	case out.MaxOpen < 0 || out.MaxOpen > maxForwardsOpenCap:
		errs = append(errs, config.Field(field+".max_open", "%d: must be between 1 and %d", out.MaxOpen, maxForwardsOpenCap))
	}
	return out, errs
}
