package cli

import (
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// One word for each value of each enum the CLI prints, the same in every
// command: the value's name, lower case, without its enum's prefix.

// enumWord is an enum value's name in lower case without prefix, with
// underscores as spaces when spaced.
func enumWord(name, prefix string, spaced bool) string {
	w := strings.ToLower(strings.TrimPrefix(name, prefix))
	if spaced {
		w = strings.ReplaceAll(w, "_", " ")
	}
	return w
}

func jobStateWord(s authorityv1.JobState) string { return enumWord(s.String(), "JOB_STATE_", false) }

func stateWord(s authorityv1.ApprovalState) string {
	return enumWord(s.String(), "APPROVAL_STATE_", false)
}

func reasonWord(r typesv1.TerminationReason) string {
	return enumWord(r.String(), "TERMINATION_REASON_", false)
}

func decisionWord(d authorityv1.Decision) string { return enumWord(d.String(), "DECISION_", false) }

func purposeWord(p authorityv1.LeasePurpose) string {
	return enumWord(p.String(), "LEASE_PURPOSE_", false)
}

func deploymentState(s publisherv1.DeploymentState) string {
	return enumWord(s.String(), "DEPLOYMENT_STATE_", true)
}

func networkStateWord(s typesv1.NetworkPolicyState) string {
	return enumWord(s.String(), "NETWORK_POLICY_STATE_", false)
}

func runtimeClassWord(c typesv1.RuntimeClass) string {
	return enumWord(c.String(), "RUNTIME_CLASS_", false)
}

func partWord(p authorityv1.ReviewPart) string { return enumWord(p.String(), "REVIEW_PART_", false) }

func streamWord(s typesv1.OutputStream) string { return enumWord(s.String(), "OUTPUT_STREAM_", false) }

func outcomeWord(o authorityv1.AuditOutcome) string {
	switch o {
	case authorityv1.AuditOutcome_AUDIT_OUTCOME_ALLOWED:
		return "allowed"
	case authorityv1.AuditOutcome_AUDIT_OUTCOME_DENIED:
		return "denied"
	case authorityv1.AuditOutcome_AUDIT_OUTCOME_FAILED:
		return "failed"
	}
	return "-"
}

// commandText is a job's argv in one line, each argument escaped.
func commandText(argv []string) string {
	args := make([]string, len(argv))
	for i, a := range argv {
		args[i] = shellWord(a)
	}
	return strings.Join(args, " ")
}

// shellWord is an argument escaped (termtext.Line), and quoted where a
// POSIX shell would need it, so a reader can tell `a b` from `a` `b`.
func shellWord(a string) string {
	shown := termtext.Line(a)
	// Whether to quote depends on the argument, not on the escapes'
	// backslashes; the escaped text has no quote the argument lacks.
	if a != "" && !strings.ContainsAny(a, " \t\n'\"$&|;<>()~#!`\\") {
		return shown
	}
	return "'" + strings.ReplaceAll(shown, "'", `'\''`) + "'"
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
