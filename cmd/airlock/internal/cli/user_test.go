package cli

import (
	"strings"
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestJobGetUser: job get says who a granted job runs as.
func TestJobGetUser(t *testing.T) {
	f := &fakeAuthority{job: &authorityv1.Job{JobId: "j1", User: &typesv1.JobUser{Uid: 1000, Gid: 1000}}}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "job", "get", "j1")
	if code != 0 || !strings.Contains(out, "user       agent (1000:1000)\n") {
		t.Errorf("job get: %d %q %q; want a line saying agent (1000:1000)", code, out, errOut)
	}
}

// TestSubmitUser: --user (shared by job submit and session create, which
// build their spec with the same flags) reaches the spec as uid and gid;
// without it the spec names no one (the tenant's default); ids no sandbox
// maps are refused before any call, naming the flag.
func TestSubmitUser(t *testing.T) {
	f := &fakeAuthority{job: &authorityv1.Job{JobId: "j1"}}
	cfg := serveFake(t, f)
	for _, tc := range []struct {
		flag     string
		uid, gid uint32
	}{
		{"agent", 1000, 1000}, {"root", 0, 0}, {"1000", 1000, 1000}, {"2000:3000", 2000, 3000}, {"0:5", 0, 5},
	} {
		n := len(f.specs)
		if code, _, errOut := runCLI(t, cfg, nil, "job", "submit", "--repo", "demo", "--user", tc.flag, "--", "true"); code != 0 {
			t.Fatalf("--user %s: %d %s", tc.flag, code, errOut)
		}
		u := f.specs[n].GetUser()
		if u == nil || u.GetUid() != tc.uid || u.GetGid() != tc.gid {
			t.Errorf("--user %s: spec user %v, want %d:%d", tc.flag, u, tc.uid, tc.gid)
		}
	}
	n := len(f.specs)
	if code, _, errOut := runCLI(t, cfg, nil, "job", "submit", "--repo", "demo", "--", "true"); code != 0 {
		t.Fatalf("no --user: %d %s", code, errOut)
	}
	if u := f.specs[n].GetUser(); u != nil {
		t.Errorf("no --user: spec user %v, want none (the tenant's default)", u)
	}
	for _, bad := range []string{"65534", "1000:65535", "-1", "agent:1", "1000:", "nobody", "4294967296"} {
		n := len(f.specs)
		code, _, errOut := runCLI(t, cfg, nil, "job", "submit", "--repo", "demo", "--user", bad, "--", "true")
		if code != 2 || !strings.Contains(errOut, "--user") {
			t.Errorf("--user %s: exit %d, %q; want 2 naming --user", bad, code, errOut)
		}
		if len(f.specs) != n {
			t.Errorf("--user %s: submitted anyway", bad)
		}
	}
}
