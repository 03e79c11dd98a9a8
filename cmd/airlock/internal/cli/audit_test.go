package cli

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestAuditKindRefused checks that a --kind the authority never records is
// refused, naming every kind, before any call, and that a real one is sent.
func TestAuditKindRefused(t *testing.T) {
	f := &fakeAuthority{}
	cfg := serveFake(t, f)
	for _, cmd := range []string{"list", "export"} {
		code, _, errOut := runCLI(t, cfg, nil, "audit", cmd, "--as", "approver/alice", "--kind", "job.submitted")
		want := `airlock: --kind "job.submitted": the authority records no such kind; want one of ` + strings.Join(auditKinds, ", ") + "\n"
		if code != 2 || errOut != want {
			t.Errorf("audit %s --kind job.submitted: exit %d, stderr %q; want exit 2, %q", cmd, code, errOut, want)
		}
	}
	if got := f.sawTenants(); len(got) != 0 {
		t.Fatalf("an unknown kind reached the authority (%d requests)", len(got))
	}
	if code, _, errOut := runCLI(t, cfg, nil, "audit", "list", "--as", "approver/alice", "--kind", "rpc.denied"); code != 0 {
		t.Errorf("audit list --kind rpc.denied: exit %d\n%s", code, errOut)
	}
}

// TestAuditKindHelpNamesRealKinds checks that every kind the help of
// audit list and export names is one the authority records.
func TestAuditKindHelpNamesRealKinds(t *testing.T) {
	for _, cmd := range []string{"list", "export"} {
		root := newRoot(&globals{})
		sub, _, err := root.Find([]string{"audit", cmd})
		if err != nil {
			t.Fatal(err)
		}
		help := sub.Long + "\n" + sub.Flags().Lookup("kind").Usage
		for _, k := range regexp.MustCompile(`[a-z_]{2,}\.[a-z_]{2,}`).FindAllString(help, -1) {
			if !slices.Contains(auditKinds, k) {
				t.Errorf("audit %s help names kind %q, which the authority never records:\n%s", cmd, k, help)
			}
		}
	}
}
