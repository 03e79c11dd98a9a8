//go:build linux

package e2e

import (
	"strings"
	"testing"

	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

// reapplySection is a section of a config file; both sections of the
// file have the same lines around their flag.
func reapplySection(flag string) string {
	return "[service]\nreplicas = 2\nport = 8080\ntimeout = 30\nflag = " + flag + "\nretries = 3\nlog = info\nmode = strict\n"
}

// TestPublishReappliesExactlyOnAMovedBranch is issue 20's attack through
// the real services: two approved results of the same base, Y (a header
// above both sections) and X (the SECOND section's flag turned on).
// Published Y then X, X must turn on the second section's flag: placed by
// line number and context on Y's tip it landed in the first. A third
// approved result, Z, changes the same flag differently: refused before
// its approval is spent.
func TestPublishReappliesExactlyOnAMovedBranch(t *testing.T) {
	t.Parallel()
	p := startPublishStack(t)
	base := p.pushByHand(t, "config.ini", reapplySection("off")+reapplySection("off"), "two sections")

	header := strings.Repeat("# managed by the platform team\n", 8)
	write := func(content string) string { return "printf '%s' '" + content + "' > config.ini" }
	jobY, approvalY, _ := p.submitJob(t, write(header+reapplySection("off")+reapplySection("off")))
	jobX, approvalX, _ := p.submitJob(t, write(reapplySection("off")+reapplySection("on")))
	jobZ, approvalZ, _ := p.submitJob(t, write(reapplySection("off")+reapplySection("maybe")))
	for _, j := range []string{jobY.GetCommit(), jobX.GetCommit(), jobZ.GetCommit()} {
		if j != base {
			t.Fatalf("a job ran on %s, want main's %s", j, base)
		}
	}
	for _, id := range []string{approvalY, approvalX, approvalZ} {
		p.approve(t, id)
	}

	for _, id := range []string{approvalY, approvalX} {
		if res, d := p.publish(t, id); res.code != 0 || d.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED {
			t.Fatalf("publish %s: exit %d, %v %q\n%s", id, res.code, d.GetState(), d.GetMessage(), res.stderr)
		}
	}
	want := header + reapplySection("off") + reapplySection("on")
	if got := p.bareGit(t, "show", "main:config.ini"); got != want {
		t.Fatalf("main's config.ini after Y then X:\n%s\nwant (the second section's flag on):\n%s", got, want)
	}

	tip := p.tip(t)
	res, d := p.publish(t, approvalZ)
	if res.code != 1 || !strings.Contains(d.GetMessage(), "conflicting paths: config.ini") {
		t.Errorf("publish of Z over X's change to the same line: exit %d, message %q; want 1, naming config.ini\n%s", res.code, d.GetMessage(), res.stderr)
	}
	p.checkUnspentRefusal(t, d, jobZ, approvalZ, tip)
}
