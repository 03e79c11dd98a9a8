// Package netpolicy enforces a job's network policy from outside its
// sandbox. Every job gets a network namespace the executor makes (the
// sandbox joins it, so it is owned by the host's user namespace and nothing
// inside can reconfigure it). Deny-all is loopback only. An allow policy adds
// a veth pair to the host, and nftables rules in the host's namespace — out
// of the job's reach — let through exactly the listed destinations and
// ports; link-local, metadata and the executor's own addresses are always
// refused. Apply replaces a running job's rules atomically and returns only
// once they are in the kernel.
package netpolicy

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
)

// Rule permits egress to one prefix.
type Rule struct {
	Prefix netip.Prefix
	// Ports are TCP destination ports; empty means every port and protocol.
	Ports []uint16
}

// Policy is what a job may reach. No rules means deny-all: loopback only.
type Policy struct {
	Allow []Rule
}

// DenyAll reports whether p permits nothing but loopback.
func (p Policy) DenyAll() bool { return len(p.Allow) == 0 }

// Config configures the Manager.
type Config struct {
	// Dir holds the namespaces' bind mounts and the manager's state; it
	// must be the executor's alone.
	Dir string
	// Logger receives what the manager does.
	Logger *slog.Logger
}

// Manager makes and tracks the network namespaces of jobs.
type Manager struct {
	cfg Config
}

// ErrUnavailable is returned when this machine cannot enforce policies.
var ErrUnavailable = errors.New("netpolicy: not available")

// New checks the host can enforce policies and prepares Dir.
func New(cfg Config) (*Manager, error) {
	return nil, ErrUnavailable
}

// Net is one job's network namespace and the rules in force for it.
type Net struct {
	m *Manager
}

// Create makes job id's namespace with p in force as generation 1.
func (m *Manager) Create(ctx context.Context, id string, p Policy) (*Net, error) {
	return nil, ErrUnavailable
}

// Path is the namespace's path, for the OCI spec's network namespace.
func (n *Net) Path() string { return "" }

// Apply puts p in force as generation gen (higher than the current one)
// and returns once the rules are in the kernel. On error the previous
// policy stays in force.
func (n *Net) Apply(ctx context.Context, p Policy, gen int64) error { return ErrUnavailable }

// Current returns the policy in force and its generation.
func (n *Net) Current() (Policy, int64) { return Policy{}, 0 }

// Close removes the namespace, its interfaces and its rules.
func (n *Net) Close() error { return ErrUnavailable }

// Recover removes what jobs of an earlier, killed executor left behind and
// returns their ids.
func (m *Manager) Recover(ctx context.Context) ([]string, error) { return nil, ErrUnavailable }

// Close releases the manager; jobs' namespaces must be closed first.
func (m *Manager) Close() error { return nil }
