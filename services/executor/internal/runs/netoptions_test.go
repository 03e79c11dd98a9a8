package runs

import (
	"testing"

	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// TestNetOptionsFixed: a VM, like gVisor, reads its interfaces once at
// boot, so its namespace keeps what it was made with; runc's follows its
// policy unless it is a domains job.
func TestNetOptionsFixed(t *testing.T) {
	allow := NetworkPolicy{Net: netpolicy.Policy{}}
	for _, tc := range []struct {
		class sandbox.Class
		fixed bool
	}{{sandbox.ClassRunc, false}, {sandbox.ClassRunsc, true}, {sandbox.ClassVM, true}} {
		if got := len(netOptions(tc.class, allow)) == 1; got != tc.fixed {
			t.Errorf("%s: fixed interfaces %v, want %v", tc.class, got, tc.fixed)
		}
	}
}
