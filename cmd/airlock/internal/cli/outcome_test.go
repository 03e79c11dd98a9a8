package cli

import (
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestCancelledOutcomeSaysItOnce: a cancelled job's outcome says
// "cancelled" once, then who cancelled it and what the executor did.
func TestCancelledOutcomeSaysItOnce(t *testing.T) {
	cancelled := authorityv1.JobState_JOB_STATE_CANCELLED
	result := &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_CANCELLED, ExitCode: -1, Message: "every process of the job was killed"}
	for _, tc := range []struct {
		job  *authorityv1.Job
		want string
	}{
		{&authorityv1.Job{State: cancelled, Message: "cancelled by client/dev: too slow; every process of the job was killed", Result: result},
			"cancelled by client/dev: too slow; every process of the job was killed"},
		{&authorityv1.Job{State: cancelled, Message: "cancelled; every process of the job was killed", Result: result},
			"cancelled; every process of the job was killed"},
		{&authorityv1.Job{State: cancelled, Message: "cancelled by client/dev: changed my mind"}, "cancelled by client/dev: changed my mind"},
		{&authorityv1.Job{State: authorityv1.JobState_JOB_STATE_FAILED, Message: "the sandbox could not be set up"}, "failed: the sandbox could not be set up"},
	} {
		if got := outcome(tc.job); got != tc.want {
			t.Errorf("outcome = %q, want %q", got, tc.want)
		}
	}
}
