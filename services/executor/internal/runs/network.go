package runs

import (
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/egress"
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
			pfx, err := egress.ParsePrefix(r.GetCidr())
			if err != nil {
				return netpolicy.Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].cidr: %v", errdefs.ErrInvalidArgument, i, err)
			}
			ports, err := egress.Ports(r.GetPorts())
			var pe *egress.PortError
			if errors.As(err, &pe) {
				return netpolicy.Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].ports[%d]: %v", errdefs.ErrInvalidArgument, i, pe.Index, err)
			}
			p.Allow = append(p.Allow, netpolicy.Rule{Prefix: pfx, Ports: ports})
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
