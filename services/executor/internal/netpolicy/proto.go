package netpolicy

import (
	"fmt"
	"net/netip"

	"github.com/airlockhq/airlock/pkg/errdefs"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// FromProto converts a grant's network policy. It refuses the domains mode,
// which needs an egress proxy this executor does not have.
func FromProto(np *typesv1.NetworkPolicy) (Policy, error) {
	switch {
	case np.GetDenyAll() != nil:
		return Policy{}, nil
	case np.GetAllow() != nil:
		rules := np.GetAllow().GetRules()
		if len(rules) == 0 {
			return Policy{}, fmt.Errorf("%w: network_policy.allow.rules: need at least one rule", errdefs.ErrInvalidArgument)
		}
		var p Policy
		for i, r := range rules {
			pfx, err := netip.ParsePrefix(r.GetCidr())
			if err != nil {
				return Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].cidr %q: %v", errdefs.ErrInvalidArgument, i, r.GetCidr(), err)
			}
			if pfx != pfx.Masked() {
				return Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].cidr %q: host bits set (did you mean %s?)", errdefs.ErrInvalidArgument, i, r.GetCidr(), pfx.Masked())
			}
			rule := Rule{Prefix: pfx}
			for j, port := range r.GetPorts() {
				if port == 0 || port > 65535 {
					return Policy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].ports[%d] %d: want 1 to 65535", errdefs.ErrInvalidArgument, i, j, port)
				}
				rule.Ports = append(rule.Ports, uint16(port))
			}
			p.Allow = append(p.Allow, rule)
		}
		if _, err := p.normalize(); err != nil {
			return Policy{}, err
		}
		return p, nil
	case np.GetDomains() != nil:
		return Policy{}, fmt.Errorf("%w: network_policy.domains is not enforced by this executor (it has no egress proxy); use deny_all or allow", errdefs.ErrFailedPrecondition)
	default:
		return Policy{}, fmt.Errorf("%w: network_policy: exactly one mode is required", errdefs.ErrInvalidArgument)
	}
}
