package jobs

import (
	"strings"
	"testing"
)

// TestDiskFullOutcomeSaysWhy: a job that ends disk_full because what it
// would export is over its disk limit by apparent size says which file
// (as the job sees it) in its message, as the executor reported it.
func TestDiskFullOutcomeSaysWhy(t *testing.T) {
	r := Report{Reason: ReasonDiskFull, Message: "exited with status 0; ... the largest is /out/big, 3221225472 bytes"}
	if _, msg := r.outcome(); !strings.Contains(msg, "the disk limit was reached") || !strings.Contains(msg, "/out/big, 3221225472 bytes") {
		t.Fatalf("disk_full outcome: %q", msg)
	}
}
