package runs

import (
	"fmt"
	"net/netip"

	"github.com/airlockhq/airlock/pkg/errdefs"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// policyOf is the policy netpolicy enforces for a grant's network policy.
// With no network manager only deny-all can be enforced: every sandbox
// then gets a namespace of its own with loopback alone.
func (m *Manager) policyOf(np *typesv1.NetworkPolicy) (netpolicy.Policy, error) {
	if m.cfg.Network == nil && np.GetDenyAll() == nil {
		return netpolicy.Policy{}, fmt.Errorf("%w: network_policy: only deny_all is enforced by this executor", errdefs.ErrFailedPrecondition)
	}
	return policyFromProto(np)
}

// policyFromProto converts a grant's network policy for netpolicy. It refuses the domains mode,
// which needs an egress proxy this executor does not have.
func policyFromProto(np *typesv1.NetworkPolicy) (netpolicy.Policy, error) {
	switch {
	case np.GetDenyAll() != nil:
		return netpolicy.Policy{}, nil
	case np.GetAllow() != nil:
		rules := np.GetAllow().GetRules()
		if len(rules) == 0 {
			return netpolicy.Policy{}, fmt.Errorf("%w: network_policy.allow.rules: need at least one rule", errdefs.ErrInvalidArgument)
		}
		var p netpolicy.Policy
		for i, r := range rules {
			pfx, err := netip.ParsePrefix(r.GetCidr())
			if err != nil {
				return netpolicy.Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].cidr %q: %v", errdefs.ErrInvalidArgument, i, r.GetCidr(), err)
			}
			if pfx != pfx.Masked() {
				return netpolicy.Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].cidr %q: host bits set (did you mean %s?)", errdefs.ErrInvalidArgument, i, r.GetCidr(), pfx.Masked())
			}
			rule := netpolicy.Rule{Prefix: pfx}
			for j, port := range r.GetPorts() {
				if port == 0 || port > 65535 {
					return netpolicy.Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].ports[%d] %d: want 1 to 65535", errdefs.ErrInvalidArgument, i, j, port)
				}
				rule.Ports = append(rule.Ports, uint16(port))
			}
			p.Allow = append(p.Allow, rule)
		}
		if err := p.Validate(); err != nil {
			return netpolicy.Policy{}, err
		}
		return p, nil
	case np.GetDomains() != nil:
		return netpolicy.Policy{}, fmt.Errorf("%w: network_policy.domains is not enforced by this executor (it has no egress proxy); use deny_all or allow", errdefs.ErrFailedPrecondition)
	default:
		return netpolicy.Policy{}, fmt.Errorf("%w: network_policy: exactly one mode is required", errdefs.ErrInvalidArgument)
	}
}

// netOptions says how to make the namespace of a job in class c: gVisor
// reads its interfaces once, when it starts.
func netOptions(c sandbox.Class) []netpolicy.CreateOption {
	if c == sandbox.ClassRunsc {
		return []netpolicy.CreateOption{netpolicy.FixedInterfaces()}
	}
	return nil
}
