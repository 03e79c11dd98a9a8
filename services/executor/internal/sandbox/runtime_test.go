package sandbox

import (
	"slices"
	"testing"
)

// A batch job's runsc gets the batch flags; a session's, whose mounts
// take the host's uploads while it runs, never does.
func TestRunscBatchFlagsOnlyForBatchJobs(t *testing.T) {
	batch := runscBatchFlags
	if len(batch) == 0 {
		t.Fatal("no batch flags")
	}
	r := &runtimeBin{class: ClassRunsc, path: "runsc", root: "/r", platform: "ptrace", fsFlags: runscFSFlags, batchFlags: batch}
	for _, session := range []bool{false, true} {
		args := r.runCmd(t.TempDir(), "id", "", "/pid", session).Args
		for _, f := range batch {
			if got := slices.Contains(args, f); got == session {
				t.Errorf("session=%v: %s in %v: %v", session, f, args, got)
			}
		}
		for _, f := range runscFSFlags {
			if !slices.Contains(args, f) {
				t.Errorf("session=%v: no %s in %v", session, f, args)
			}
		}
		if i, j := slices.Index(args, "run"), slices.Index(args, "--platform=ptrace"); i < j {
			t.Errorf("flags after the subcommand: %v", args)
		}
	}
	if spec := (Spec{Command: IdleCommand}); !spec.isSession() {
		t.Error("a spec running IdleCommand is not a session")
	}
	if spec := (Spec{Command: []string{"make"}}); spec.isSession() {
		t.Error("a spec running make is a session")
	}
}
