package runs

import (
	"context"
	"fmt"
	"slices"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// NetworkPolicy is a grant's network policy as the executor enforces it:
// the kernel's rules, and for the domains mode the names the job's egress
// proxy and DNS server allow. The zero value is deny-all. The adapter
// builds it, checking it as the authority does (package egress).
type NetworkPolicy struct {
	Net   netpolicy.Policy `json:"net"`
	Names egress.Policy    `json:"names"`
}

// domains reports whether p is the domains mode.
func (p NetworkPolicy) domains() bool { return p.Net.Proxied }

// denyAll reports whether p allows nothing beyond loopback.
func (p NetworkPolicy) denyAll() bool { return !p.Net.Proxied && len(p.Net.Allow) == 0 }

// equal reports whether p and q allow the same, rule for rule.
func (p NetworkPolicy) equal(q NetworkPolicy) bool {
	return p.Net.Proxied == q.Net.Proxied &&
		slices.EqualFunc(p.Net.Allow, q.Net.Allow, func(a, b netpolicy.Rule) bool {
			return a.Prefix == b.Prefix && slices.Equal(a.Ports, b.Ports)
		}) &&
		slices.EqualFunc(p.Names.Rules, q.Names.Rules, func(a, b egress.Rule) bool {
			return a.Prefix == b.Prefix && slices.Equal(a.Ports, b.Ports)
		}) &&
		slices.EqualFunc(p.Names.Names, q.Names.Names, func(a, b egress.Name) bool {
			return a.Name == b.Name && slices.Equal(a.Ports, b.Ports)
		})
}

// checkEnforceable refuses a policy this executor cannot enforce: with no
// network manager only deny-all can be, since every sandbox then gets a
// namespace of its own with loopback alone.
func (m *Manager) checkEnforceable(p NetworkPolicy) error {
	if m.cfg.Network == nil && !p.denyAll() {
		return fmt.Errorf("%w: network_policy: only deny_all is enforced by this executor", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// netOptions says how to make the namespace of a job in class c with
// policy p. gVisor and a VM read their interfaces once, when they start
// (runspec.FixedInterfaces); a domains
// job keeps its veth, and so its egress services' addresses, for good
// (a narrowing to deny-all drops everything at the host end instead).
func netOptions(c sandbox.Class, p NetworkPolicy) []netpolicy.CreateOption {
	if runspec.FixedInterfaces(string(c)) || p.domains() {
		return []netpolicy.CreateOption{netpolicy.FixedInterfaces()}
	}
	return nil
}

// checkModeChange refuses a change of network policy a running job's
// egress setup cannot follow: its environment and /etc/resolv.conf were
// set when it started, so a job started with a domains policy can move
// between domains and deny_all only, and one started otherwise cannot
// move to domains.
func checkModeChange(started, next NetworkPolicy) error {
	switch {
	case started.domains() && len(next.Net.Allow) > 0:
		return fmt.Errorf("%w: network_policy.allow: this job started with a domains policy; while it runs it can change to other domains or to deny_all only", errdefs.ErrFailedPrecondition)
	case !started.domains() && next.domains():
		return fmt.Errorf("%w: network_policy.domains: this job did not start with a domains policy, so it has no egress proxy or DNS server; submit the job with --allow-domain to use names", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// applyNetwork puts p in force for e's running job as generation gen: the
// kernel's rules first, then (for a job with egress services) the names
// its proxy and DNS server allow, which cuts the proxied connections p no
// longer allows. It returns once both enforce p. Callers hold e.updateMu.
func (m *Manager) applyNetwork(ctx context.Context, e *entry, p NetworkPolicy, gen int64) error {
	if err := e.net.Apply(ctx, p.Net, gen); err != nil {
		return err
	}
	if e.egress == nil {
		return nil
	}
	if err := e.egress.setPolicy(p.Names); err != nil {
		// The names were checked when p was made; the kernel's rules are
		// in force and the services keep the names before. Stop the job
		// rather than let it run on a policy no grant gave it.
		m.abort(e, fmt.Sprintf("network policy generation %d: the egress proxy refused its names (%v); the job was stopped", gen, err))
		return err
	}
	return nil
}
