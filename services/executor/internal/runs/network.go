package runs

import (
	"fmt"

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
	return netpolicy.FromProto(np)
}

// netOptions says how to make the namespace of a job in class c: gVisor
// reads its interfaces once, when it starts.
func netOptions(c sandbox.Class) []netpolicy.CreateOption {
	if c == sandbox.ClassRunsc {
		return []netpolicy.CreateOption{netpolicy.FixedInterfaces()}
	}
	return nil
}
