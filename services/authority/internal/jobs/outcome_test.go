package jobs

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// TestDiskFullOutcomeSaysWhy: a job that ends disk_full because what it
// would export is over its disk limit by apparent size says which file
// (as the job sees it) in its message, as the executor reported it.
func TestDiskFullOutcomeSaysWhy(t *testing.T) {
	r := Report{Reason: ReasonDiskFull, Message: "exited with status 0; ... the largest is /out/big, 3221225472 bytes"}
	if _, msg := r.outcome(""); !strings.Contains(msg, "the disk limit was reached") || !strings.Contains(msg, "/out/big, 3221225472 bytes") {
		t.Fatalf("disk_full outcome: %q", msg)
	}
}

// TestCancelledOutcomeSaysItOnce: a cancelled job's message says who
// cancelled it and what the executor did, without repeating "cancelled"
// (the state says it).
func TestCancelledOutcomeSaysItOnce(t *testing.T) {
	for _, tc := range []struct {
		prior, executor, want string
	}{
		{cancelRequested + "cancelled by client/dev: too slow", "every process of the job was killed", "cancelled by client/dev: too slow; every process of the job was killed"},
		{cancelRequested + "cancelled by client/dev", "", "cancelled by client/dev"},
		{"", "every process of the job was killed", "cancelled; every process of the job was killed"},
		{"the executor refused the job's latest grant: x", "", "cancelled"},
	} {
		st, msg := Report{Reason: ReasonCancelled, Message: tc.executor}.outcome(tc.prior)
		if st != store.StateCancelled || msg != tc.want {
			t.Errorf("after %q, executor %q: %s %q, want cancelled %q", tc.prior, tc.executor, st, msg, tc.want)
		}
	}
}
