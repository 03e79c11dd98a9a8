package cli

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// withPatch is the review of one patch.
func withPatch(patch string) *fakeAuthority {
	resp := reviewApproval()
	resp.Review.Command = []string{"make"}
	resp.Review.Patch = []byte(patch)
	resp.Review.Detail = &authorityv1.ReviewDetail{PatchSize: int64(len(patch))}
	return &fakeAuthority{approval: resp}
}

// TestShowCodeAsItLands: a backslash in the patch is shown as itself, so
// the reviewer reads the code that lands, and with nothing escaped there
// is no legend.
func TestShowCodeAsItLands(t *testing.T) {
	const patch = "diff --git a/m.go b/m.go\n+\tfmt.Println(\"Hello airlock!\\n\")\n+\\\\ exit\\.\n"
	cfg := serveFake(t, withPatch(patch))
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"\n| +\tfmt.Println(\"Hello airlock!\\n\")\n", "\n| +\\\\ exit\\.\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("the patch is not shown as it lands: lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "legend") {
		t.Errorf("a legend with nothing escaped:\n%s", out)
	}
}

// TestShowMarksCannotBeForged: a patch that spells out the marks around
// an escape, in a file or pipe, shows its marks escaped, so they cannot
// pass for ours; the legend follows.
func TestShowMarksCannotBeForged(t *testing.T) {
	cfg := serveFake(t, withPatch("+\u27e6\\x1b\u27e7[2J is not an escape\n"))
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if want := "\n| +⟦\\u27e6⟧\\x1b⟦\\u27e7⟧[2J is not an escape\n"; !strings.Contains(out, want) {
		t.Errorf("the forged marks are not escaped: lacks %q:\n%s", want, out)
	}
	if !strings.HasSuffix(out, "\nlegend     "+termtext.Legend+"\n") {
		t.Errorf("no legend at the end:\n%s", out)
	}
}

// highlight is one escape as a terminal is sent it.
var highlight = regexp.MustCompile(`^\x1b\[7m(\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8})\x1b\[27m`)

// TestShowOnTerminal: on a terminal the review shows each escape in
// reverse video, and nothing the job wrote (an SGR 27 of its own as bytes
// or as a C1 CSI, the marks, a reset) reaches the terminal as anything
// but escaped text: every ESC sent is one of a highlight around exactly
// one escape, so the job cannot end a highlight early or start one.
func TestShowOnTerminal(t *testing.T) {
	t.Setenv("TERM", "xterm")
	t.Setenv("NO_COLOR", "")
	patch := "+a\x1b[2Jb\\n\n+\x1b[27m\x1b[0m\u009b27m\u27e7 not escaped \u27e6\n+\u202eevil\n"
	f := withPatch(patch)
	f.approval.Review.Detail.Stdout = &authorityv1.OutputTail{Size: 6, Data: []byte("\x9b27m\xff\n")}
	cfg := serveFake(t, f)
	code, out, errOut := runCLIOnTerminal(t, cfg, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var plain strings.Builder
	highlights := 0
	for i := 0; i < len(out); {
		if m := highlight.FindString(out[i:]); m != "" {
			highlights++
			i += len(m)
			continue
		}
		if out[i] == 0x1b {
			t.Fatalf("ESC at byte %d is not a highlight around one escape: %q\nall of it: %q", i, out[i:], out)
		}
		plain.WriteByte(out[i])
		i++
	}
	checkShown(t, "approval show on a terminal", plain.String())
	if strings.ContainsAny(plain.String(), "⟦⟧") {
		t.Errorf("marks reach the terminal: %q", out)
	}
	// \x1b; \x1b \x1b \u009b \u27e7 \u27e6; \u202e; \x9b \xff; and the
	// legend's example.
	if highlights != 10 {
		t.Errorf("%d highlights, want 10: %q", highlights, out)
	}
	for _, want := range []string{"| +a\x1b[7m\\x1b\x1b[27m[2Jb\\n\n", "\nlegend     \x1b[7m\\x1b\x1b[27m is a byte"} {
		if !strings.Contains(out, want) {
			t.Errorf("the terminal was not sent %q: %q", want, out)
		}
	}
}

// TestShowSession: a session's review says how many execs it ran and how
// each ended, not a blank command and the session's exit -1.
func TestShowSession(t *testing.T) {
	resp := reviewApproval()
	resp.Review.Result = &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_FINISHED, ExitCode: -1, RuntimeVersion: "runc 1.2;x"}
	ended := func(seq int64, id string, exit int32) *typesv1.Exec {
		return &typesv1.Exec{
			Seq: seq, Spec: &typesv1.ExecSpec{ExecId: id, Argv: []string{"go", "test", "./..."}}, State: typesv1.ExecState_EXEC_STATE_ENDED,
			Reason: typesv1.TerminationReason_TERMINATION_REASON_EXITED, ExitCode: exit,
			Usage: &typesv1.ResourceUsage{WallTime: durationpb.New(2 * time.Second)},
		}
	}
	resp.Review.Detail = &authorityv1.ReviewDetail{Execs: []*typesv1.Exec{ended(1, "build", 0), ended(3, "test", 1)}, ExecsTotal: 3}
	cfg := serveFake(t, &fakeAuthority{approval: resp})
	code, out, errOut := runCLI(t, cfg, nil, "approval", "show", "a-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "command    session of 3 execs\n" +
		"    1  build  exited with status 0, wall 2s  go test ./...\n" +
		"    3  test  exited with status 1, wall 2s  go test ./...\n" +
		"       ... and 1 more execs, not listed here\n" +
		"result     session finished, runc 1.2\n"
	if !strings.Contains(out, want) {
		t.Errorf("approval show lacks\n%s\nin\n%s", want, out)
	}
	if strings.Contains(out, "exit -1") {
		t.Errorf("a session's review shows exit -1:\n%s", out)
	}
}
