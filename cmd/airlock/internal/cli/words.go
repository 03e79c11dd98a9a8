package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

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

// runtimeClassOf is the class runtimeClassWord names word; false for a
// word that names none (unspecified included: no flag means that).
func runtimeClassOf(word string) (typesv1.RuntimeClass, bool) {
	c, ok := typesv1.RuntimeClass_value["RUNTIME_CLASS_"+strings.ToUpper(word)]
	if !ok || c == int32(typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED) || runtimeClassWord(typesv1.RuntimeClass(c)) != word {
		return 0, false
	}
	return typesv1.RuntimeClass(c), true
}

// runtimeClassWords are the words of every runtime class, for help and
// errors: "runc, runsc or vm".
func runtimeClassWords() string {
	var words []string
	for c := range len(typesv1.RuntimeClass_name) {
		if rc := typesv1.RuntimeClass(c); rc != typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED {
			words = append(words, runtimeClassWord(rc))
		}
	}
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

func executorStateWord(s authorityv1.ExecutorState) string {
	return enumWord(s.String(), "EXECUTOR_STATE_", false)
}

// executorState is an executor's state as every command shows it: up or
// lost, with an up executor that is draining shown as draining.
func executorState(e *authorityv1.Executor) string {
	switch {
	case !e.GetDraining():
		return executorStateWord(e.GetState())
	case e.GetState() == authorityv1.ExecutorState_EXECUTOR_STATE_UP:
		return "draining"
	}
	return executorStateWord(e.GetState()) + ", draining"
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

// cores is CPU millis as cores: 1500 is 1.5.
func cores(millis int64) string { return strconv.FormatFloat(float64(millis)/1000, 'f', -1, 64) }

// ago is how long before now t was, in its largest whole unit: "12s ago",
// "5m ago", "3h ago", "2d ago"; "never" for no time.
func ago(t *timestamppb.Timestamp, now time.Time) string {
	if t.AsTime().Unix() <= 0 {
		return "never"
	}
	d := max(now.Sub(t.AsTime()), 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// suspensionWord says how a running session is suspended, and since when:
// "asleep" when it fell asleep idle (its next exec or file call wakes
// it), "suspended" otherwise.
func suspensionWord(reason typesv1.TerminationReason, since *timestamppb.Timestamp) string {
	w := "suspended"
	if reason == typesv1.TerminationReason_TERMINATION_REASON_IDLE_TIMEOUT {
		w = "asleep"
	}
	if since != nil {
		w += " since " + since.AsTime().Local().Format(time.DateTime)
	}
	return w
}

// idleActionOf is the IdleAction --on-idle names ("" for the tenant's
// default); false for a word that names none.
func idleActionOf(word string) (typesv1.IdleAction, bool) {
	if word == "" {
		return typesv1.IdleAction_IDLE_ACTION_UNSPECIFIED, true
	}
	a, ok := typesv1.IdleAction_value["IDLE_ACTION_"+strings.ToUpper(word)]
	if !ok || a == int32(typesv1.IdleAction_IDLE_ACTION_UNSPECIFIED) || strings.ToLower(word) != word {
		return 0, false
	}
	return typesv1.IdleAction(a), true
}
