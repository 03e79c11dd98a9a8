package cli

import (
	"strings"
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestShowFoldedUploads: an upload record that stands for several uploads
// of one path says how many and from when, sits before the exec that came
// after its last one, and the uploads not listed are counted by upload,
// not by record.
func TestShowFoldedUploads(t *testing.T) {
	resp := reviewApproval()
	resp.Review.Detail = &authorityv1.ReviewDetail{
		Execs:      []*typesv1.Exec{{Seq: 1, Spec: &typesv1.ExecSpec{ExecId: "t1", Argv: []string{"sh", "/work/run.sh"}}}},
		ExecsTotal: 1,
		FileWrites: []*authorityv1.FileWrite{
			{Path: "/out/a", Size: 1, Count: 3, FirstAfterExec: 0, AfterExec: 0},
			{Path: "/work/run.sh", Size: 9, AfterExec: 0},
		},
		FileWritesTotal: 10,
	}
	cfg := serveFake(t, &fakeAuthority{approval: resp})
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	run, exec := strings.Index(out, "upload  /work/run.sh"), strings.Index(out, "exec 1  t1")
	if run < 0 || exec < run {
		t.Errorf("run.sh is not shown uploaded before exec 1:\n%s", out)
	}
	for _, want := range []string{"the last of 3 uploads of this path, the first after 0 execs had started", "... and 6 more uploads, not listed here"} {
		if !strings.Contains(out, want) {
			t.Errorf("approval show lacks %q:\n%s", want, out)
		}
	}
}
