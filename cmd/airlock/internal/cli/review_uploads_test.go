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
		FileWrites: []*typesv1.FileWrite{
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

// TestSessionGetListsUploads: session get places the client's uploads
// among the execs as the review does, in the review's words, folded
// records and uploads not listed included.
func TestSessionGetListsUploads(t *testing.T) {
	exec := func(seq int64, id string) *typesv1.Exec {
		return &typesv1.Exec{Seq: seq, Spec: &typesv1.ExecSpec{ExecId: id, Argv: []string{"sh", "/work/run.sh"}}}
	}
	writes := []*typesv1.FileWrite{
		{Path: "/work/run.sh", Size: 9, Sha256: "ab", AfterExec: 0},
		{Path: "/out/a\x1b[2J", Size: 1, Sha256: "cd", Count: 2, FirstAfterExec: 0, AfterExec: 1},
	}
	f := &fakeAuthority{session: &authorityv1.GetSessionResponse{
		Session:    &authorityv1.Job{JobId: "s-1", State: authorityv1.JobState_JOB_STATE_RUNNING},
		Execs:      []*typesv1.Exec{exec(1, "t1"), exec(2, "t2")},
		ExecsTotal: 2, FileWrites: writes, FileWritesTotal: 5,
	}}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "session", "get", "s-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	checkShown(t, "session get", out)
	upload := "  upload  /work/run.sh  9 bytes, sha256 ab\n"
	folded := "  upload  /out/a⟦\\x1b⟧[2J  1 bytes, sha256 cd\n          the last of 2 uploads of this path, the first after 0 execs had started\n"
	order := []string{"execs      2, with the client's 5 uploads among them\n", upload, "    1  t1  ", folded, "    2  t2  ", "  ... and 2 more uploads, not listed here\n"}
	at := 0
	for _, want := range order {
		i := strings.Index(out[at:], want)
		if i < 0 {
			t.Fatalf("session get lacks %q after byte %d:\n%s", want, at, out)
		}
		at += i + len(want)
	}
	// The review shows the same upload in the same words.
	resp := reviewApproval()
	resp.Review.Detail = &authorityv1.ReviewDetail{Execs: f.session.Execs, ExecsTotal: 2, FileWrites: writes, FileWritesTotal: 5}
	_, review, _ := runCLI(t, serveFake(t, &fakeAuthority{approval: resp}), nil, "approval", "show", "a-1")
	for _, want := range []string{"\n" + upload, "\n" + folded} {
		if !strings.Contains(review, want) {
			t.Errorf("the review lacks %q:\n%s", want, review)
		}
	}
}
