package runs

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// jobPolicy is a grant's network policy as the executor enforces it: the
// kernel's rules, and for the domains mode the names the job's egress
// proxy and DNS server allow.
type jobPolicy struct {
	net   netpolicy.Policy
	names egress.Policy
}

// domains reports whether p is the domains mode.
func (p jobPolicy) domains() bool { return p.net.Proxied }

// policyOf is the policy enforced for a grant's network policy. With no
// network manager only deny-all can be enforced: every sandbox then gets a
// namespace of its own with loopback alone.
func (m *Manager) policyOf(np *typesv1.NetworkPolicy) (jobPolicy, error) {
	if m.cfg.Network == nil && np.GetDenyAll() == nil {
		return jobPolicy{}, fmt.Errorf("%w: network_policy: only deny_all is enforced by this executor", errdefs.ErrFailedPrecondition)
	}
	return policyFromProto(np)
}

// policyFromProto converts a grant's network policy, checking it as the
// authority does (package egress).
func policyFromProto(np *typesv1.NetworkPolicy) (jobPolicy, error) {
	switch {
	case np.GetDenyAll() != nil:
		return jobPolicy{}, nil
	case np.GetAllow() != nil:
		rules := np.GetAllow().GetRules()
		if len(rules) == 0 {
			return jobPolicy{}, fmt.Errorf("%w: network_policy.allow.rules: need at least one rule", errdefs.ErrInvalidArgument)
		}
		var p netpolicy.Policy
		for i, r := range rules {
			pfx, err := egress.ParsePrefix(r.GetCidr())
			if err != nil {
				return jobPolicy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].cidr: %v", errdefs.ErrInvalidArgument, i, err)
			}
			ports, err := portsOf(fmt.Sprintf("network_policy.allow.rules[%d].ports", i), r.GetPorts())
			if err != nil {
				return jobPolicy{}, err
			}
			p.Allow = append(p.Allow, netpolicy.Rule{Prefix: pfx, Ports: ports})
		}
		if err := p.Validate(); err != nil {
			return jobPolicy{}, err
		}
		return jobPolicy{net: p}, nil
	case np.GetDomains() != nil:
		d := np.GetDomains()
		if len(d.GetDomains()) == 0 {
			return jobPolicy{}, fmt.Errorf("%w: network_policy.domains.domains: need at least one name", errdefs.ErrInvalidArgument)
		}
		ports, err := portsOf("network_policy.domains.ports", d.GetPorts())
		if err != nil {
			return jobPolicy{}, err
		}
		var names egress.Policy
		for _, n := range d.GetDomains() {
			names.Names = append(names.Names, egress.Name{Name: n, Ports: ports})
		}
		names, err = names.Normalize()
		if err != nil {
			return jobPolicy{}, fmt.Errorf("%w: network_policy.domains: %v", errdefs.ErrInvalidArgument, err)
		}
		return jobPolicy{net: netpolicy.Policy{Proxied: true}, names: names}, nil
	default:
		return jobPolicy{}, fmt.Errorf("%w: network_policy: exactly one mode is required", errdefs.ErrInvalidArgument)
	}
}

func portsOf(field string, in []uint32) ([]uint16, error) {
	ports, err := egress.Ports(in)
	var pe *egress.PortError
	if errors.As(err, &pe) {
		return nil, fmt.Errorf("%w: %s[%d]: %v", errdefs.ErrInvalidArgument, field, pe.Index, err)
	}
	return ports, err
}

// netOptions says how to make the namespace of a job in class c with
// policy p. gVisor reads its interfaces once, when it starts; a domains
// job keeps its veth, and so its egress services' addresses, for good
// (a narrowing to deny-all drops everything at the host end instead).
func netOptions(c sandbox.Class, p jobPolicy) []netpolicy.CreateOption {
	if c == sandbox.ClassRunsc || p.domains() {
		return []netpolicy.CreateOption{netpolicy.FixedInterfaces()}
	}
	return nil
}

// checkModeChange refuses a change of network policy a running job's
// egress setup cannot follow: its environment and /etc/resolv.conf were
// set when it started, so a job started with a domains policy can move
// between domains and deny_all only, and one started otherwise cannot
// move to domains.
func checkModeChange(started, next jobPolicy) error {
	switch {
	case started.domains() && len(next.net.Allow) > 0:
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
func (m *Manager) applyNetwork(ctx context.Context, e *entry, p jobPolicy, gen int64) error {
	if err := e.net.Apply(ctx, p.net, gen); err != nil {
		return err
	}
	if e.egress == nil {
		return nil
	}
	if err := e.egress.setPolicy(p.names); err != nil {
		// The names were checked when p was made; the kernel's rules are
		// in force and the services keep the names before. Stop the job
		// rather than let it run on a policy no grant gave it.
		m.abort(e, fmt.Sprintf("network policy generation %d: the egress proxy refused its names (%v); the job was stopped", gen, err))
		return err
	}
	return nil
}
