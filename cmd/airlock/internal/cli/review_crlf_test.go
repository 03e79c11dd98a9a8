package cli

import (
	"strings"
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestShowCRLFChange: a patch that changes only a line's end (CRLF to LF)
// shows the removed and the added line differently, in the summary and
// with --full, so the change cannot pass as no change.
func TestShowCRLFChange(t *testing.T) {
	const patch = "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-line1\r\n+line1\n"
	resp := reviewApproval()
	resp.Review.Patch = []byte(patch)
	resp.Review.Detail = &authorityv1.ReviewDetail{PatchSize: int64(len(patch))}
	stream := reviewStream("sha256:ab", patch)
	cfg := serveFake(t, &fakeAuthority{approval: resp, review: stream})
	for _, args := range [][]string{{"approval", "show", "a-1"}, {"approval", "show", "a-1", "--full"}} {
		code, out, errOut := runCLI(t, cfg, nil, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		if !strings.Contains(out, "| -line1⟦\\x0d⟧\n| +line1\n") || strings.Contains(out, "\r") {
			t.Errorf("%v shows the CRLF change as:\n%q", args, out)
		}
	}
}
