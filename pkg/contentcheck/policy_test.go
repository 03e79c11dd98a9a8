package contentcheck

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// The digest names what a policy checks: the same for the same checks
// however they are written, different for any change.
func TestPolicyDigest(t *testing.T) {
	base := Policy{Protected: []string{"deploy/**", "infra/*.tf"}, AllowProtected: []string{"CODEOWNERS"}}
	d := base.Digest()
	if !strings.HasPrefix(d, "sha256:") || len(d) != len("sha256:")+64 {
		t.Fatalf("Digest() = %q", d)
	}
	for name, same := range map[string]Policy{
		"reordered":                 {Protected: []string{"infra/*.tf", "deploy/**"}, AllowProtected: []string{"CODEOWNERS"}},
		"repeated":                  {Protected: []string{"deploy/**", "infra/*.tf", "deploy/**"}, AllowProtected: []string{"CODEOWNERS", "CODEOWNERS"}},
		"a default spelled out":     {Protected: []string{"deploy/**", "infra/*.tf", "CODEOWNERS"}, AllowProtected: []string{"CODEOWNERS"}},
		"default sizes spelled out": {Protected: []string{"deploy/**", "infra/*.tf"}, AllowProtected: []string{"CODEOWNERS"}, MaxFileBytes: DefaultMaxFileBytes, MaxPathBytes: DefaultMaxPathBytes, MaxComponentBytes: DefaultMaxComponentBytes},
	} {
		if got := same.Digest(); got != d {
			t.Errorf("%s: digest %s, want %s", name, got, d)
		}
	}
	seen := map[string]string{d: "base"}
	for name, other := range map[string]Policy{
		"another glob":      {Protected: []string{"deploy/**"}, AllowProtected: []string{"CODEOWNERS"}},
		"another allowance": {Protected: []string{"deploy/**", "infra/*.tf"}},
		"binaries":          {Protected: []string{"deploy/**", "infra/*.tf"}, AllowProtected: []string{"CODEOWNERS"}, AllowBinary: true},
		"file size":         {Protected: []string{"deploy/**", "infra/*.tf"}, AllowProtected: []string{"CODEOWNERS"}, MaxFileBytes: 1},
		"path size":         {Protected: []string{"deploy/**", "infra/*.tf"}, AllowProtected: []string{"CODEOWNERS"}, MaxPathBytes: 100},
		"component size":    {Protected: []string{"deploy/**", "infra/*.tf"}, AllowProtected: []string{"CODEOWNERS"}, MaxComponentBytes: 100},
		"more allowed":      {Protected: []string{"deploy/**", "infra/*.tf"}, AllowProtected: []string{"CODEOWNERS", "deploy/**"}},
	} {
		got := other.Digest()
		if prev, ok := seen[got]; ok {
			t.Errorf("%s: the same digest as %s", name, prev)
		}
		seen[got] = name
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, bad := range []Policy{
		{MaxFileBytes: -1},
		{MaxPathBytes: -1},
		{MaxComponentBytes: 2 << 20},
		{Protected: []string{""}},
		{Protected: []string{"/abs/**"}},
		{Protected: []string{"a/../b"}},
		{Protected: []string{"a//b"}},
		{Protected: []string{"a**/b"}},
		{AllowProtected: []string{"[unclosed"}},
	} {
		err := bad.Validate()
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Validate(%+v) = %v, want an invalid argument", bad, err)
		}
		if _, cerr := checkerAt(t, 2).Check(t.Context(), bad, Input{}); cerr == nil {
			t.Errorf("Check accepted the policy %+v", bad)
		}
	}
	if err := (Policy{Protected: []string{"**/secrets/*", "a/**/b", "*.pem"}}).Validate(); err != nil {
		t.Errorf("a valid policy: %v", err)
	}
}

func TestGlobs(t *testing.T) {
	f := newFolder()
	for _, tc := range []struct {
		glob, path string
		match      bool
	}{
		{".github/workflows/**", ".github/workflows/ci.yml", true},
		{".github/workflows/**", ".github/workflows/sub/x.yml", true},
		{".github/workflows/**", ".github/ci.yml", false},
		{".github/workflows/**", "x/.github/workflows/ci.yml", false},
		{"CODEOWNERS", "CODEOWNERS", true},
		{"CODEOWNERS", "a/b/codeowners", true},
		{"CODEOWNERS", "CODEOWNERS.md", false},
		{".gitleaks*", ".gitleaks.toml", true},
		{".gitleaks*", "sub/.gitleaksignore", true},
		{"**/secrets/*", "secrets/a", true},
		{"**/secrets/*", "x/y/secrets/a", true},
		{"**/secrets/*", "x/secrets/a/b", false},
		{"a/**/b", "a/b", true},
		{"a/**/b", "a/x/y/b", true},
		{"a/**/b", "a/x/y/c", false},
		{"infra/*.tf", "INFRA/Main.TF", true},
	} {
		g := parseGlobs([]string{tc.glob}, f.component)[0]
		comps := strings.Split(tc.path, "/")
		for i := range comps {
			comps[i] = f.component(comps[i])
		}
		if got := g.match(comps); got != tc.match {
			t.Errorf("%q matches %q = %v, want %v", tc.glob, tc.path, got, tc.match)
		}
	}
	// Many "**" cost a table, not a recursion per component.
	g := parseGlobs([]string{strings.Repeat("**/", 30) + "z"}, f.component)[0]
	if g.match(strings.Split(strings.Repeat("a/", 2000)+"b", "/")) {
		t.Error("matched")
	}
}
