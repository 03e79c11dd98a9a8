package cli

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/clientconfig"
)

// TestTenantOneRule runs every command that takes --tenant and checks the
// tenant its request names: the flag when given, else a client's config
// tenant (t1), else, for an approver, none (every tenant's).
func TestTenantOneRule(t *testing.T) {
	commands := [][]string{
		{"job", "submit", "--repo", "r", "--", "true"},
		{"job", "list"},
		{"approval", "list"},
		{"audit", "list"},
		{"audit", "export"},
	}
	for _, cmd := range commands {
		for _, tc := range []struct {
			name  string
			extra []string
			want  string
		}{
			{"client default", nil, "t1"},
			{"client flag", []string{"--tenant", "other"}, "other"},
			{"approver default", []string{"--as", "approver/alice"}, ""},
			{"approver flag", []string{"--as", "approver/alice", "--tenant", "other"}, "other"},
		} {
			t.Run(strings.Join(cmd[:2], " ")+"/"+tc.name, func(t *testing.T) {
				f := &fakeAuthority{}
				cfg := serveFake(t, f)
				args := append(slices.Clone(cmd[:2]), tc.extra...)
				args = append(args, cmd[2:]...)
				code, _, errOut := runCLI(t, cfg, nil, args...)
				if code != 0 {
					t.Fatalf("airlock %v: exit %d\n%s", args, code, errOut)
				}
				if got := f.sawTenants(); len(got) != 1 || got[0] != tc.want {
					t.Errorf("airlock %v: requests named tenants %q, want [%q]", args, got, tc.want)
				}
			})
		}
	}
}

// TestTenantRequiredForAClient checks that a client whose config names no
// tenant is told to pass --tenant, by every command, before any call.
func TestTenantRequiredForAClient(t *testing.T) {
	f := &fakeAuthority{}
	path := serveFake(t, f)
	cfg, err := clientconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tenant = ""
	noTenant := filepath.Join(t.TempDir(), "client.yaml")
	if err := cfg.Save(noTenant); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"job", "submit", "--repo", "r", "--", "true"},
		{"job", "list"},
		{"approval", "list"},
		{"audit", "list"},
	} {
		code, _, errOut := runCLI(t, noTenant, nil, args...)
		if want := "airlock: --tenant is required (the client config names no default tenant)\n"; code != 2 || errOut != want {
			t.Errorf("airlock %v: exit %d, stderr %q; want exit 2, %q", args, code, errOut, want)
		}
	}
	if got := f.sawTenants(); len(got) != 0 {
		t.Errorf("requests were made, naming tenants %q", got)
	}
}
