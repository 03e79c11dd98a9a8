package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/config/configtest"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// A tenant's brokered credentials from the file: each bad entry fails
// naming its exact field; a good one becomes the hosts, injection, source
// and bounds the authority leases it by, with the defaults filled in.
func TestCredentialPolicy(t *testing.T) {
	f := configtest.New(t, "authority")
	if err := os.WriteFile(filepath.Join(f.Dir, "gh.token"), []byte("ghp_secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(f.Dir, "adir"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AIRLOCK_TEST_NPM_TOKEN", "npm_secret")
	t.Setenv("AIRLOCK_TEST_EMPTY", "")
	base := f.Common() + `fleet: {lost_after: 1m}
tenants:
  dev:
    clients: [client/dev]
    repositories: {demo: {url: /srv/git/demo.git}}
    egress: {domains: [api.github.com, "*.npmjs.org", registry.npmjs.org]}
`
	with := func(creds string) string { return base + "    credentials:\n" + creds }
	good := with(`      github:
        hosts: [API.github.com]
        source: {file: gh.token}
        approval: required
        max_ttl: 15m
        upstream_ca: ` + pki.CAPath("pki") + `
      npm:
        hosts: ["*.npmjs.org", registry.npmjs.org]
        inject: {basic_user: robot}
        source: {env: AIRLOCK_TEST_NPM_TOKEN}
`)
	one := func(fields string) string {
		return with("      c:\n        hosts: [api.github.com]\n        source: {file: gh.token}\n" + fields)
	}
	var many strings.Builder
	for i := range maxCredentials + 1 {
		many.WriteString("      c" + string(rune('a'+i/26)) + string(rune('a'+i%26)) + ": {hosts: [api.github.com], source: {file: gh.token}}\n")
	}
	cases := []configtest.Case{
		{Name: "good credentials", Body: good, Summary: "1 tenants"},
		{Name: "a bad name", Body: with("      Bad: {hosts: [api.github.com], source: {file: gh.token}}\n"), Field: "tenants.dev.credentials.Bad"},
		{Name: "no hosts", Body: with("      c: {source: {file: gh.token}}\n"), Field: "tenants.dev.credentials.c.hosts"},
		{Name: "a host that is no name", Body: with("      c: {hosts: [api.github.com, \"a*b.com\"], source: {file: gh.token}}\n"), Field: "tenants.dev.credentials.c.hosts[1]"},
		{Name: "a host outside egress.domains", Body: with("      c: {hosts: [api.github.com, gitlab.com], source: {file: gh.token}}\n"), Field: "tenants.dev.credentials.c.hosts[1]"},
		{Name: "a wildcard wider than the ceiling", Body: with("      c: {hosts: [\"*.github.com\"], source: {file: gh.token}}\n"), Field: "tenants.dev.credentials.c.hosts[0]"},
		{Name: "a format without the value", Body: one("        inject: {format: Bearer}\n"), Field: "tenants.dev.credentials.c.inject.format"},
		{Name: "a format with the value twice", Body: one("        inject: {format: \"{value}{value}\"}\n"), Field: "tenants.dev.credentials.c.inject.format"},
		{Name: "a format with a newline", Body: one("        inject: {format: \"Bearer {value}\\r\\nX-Evil: 1\"}\n"), Field: "tenants.dev.credentials.c.inject.format"},
		{Name: "a header that is no token", Body: one("        inject: {header: \"X Token\"}\n"), Field: "tenants.dev.credentials.c.inject.header"},
		{Name: "a hop-by-hop header", Body: one("        inject: {header: Connection}\n"), Field: "tenants.dev.credentials.c.inject.header"},
		{Name: "the Host header", Body: one("        inject: {header: host}\n"), Field: "tenants.dev.credentials.c.inject.header"},
		{Name: "format and basic_user", Body: one("        inject: {format: \"Token {value}\", basic_user: robot}\n"), Field: "tenants.dev.credentials.c.inject"},
		{Name: "no source", Body: with("      c: {hosts: [api.github.com]}\n"), Field: "tenants.dev.credentials.c.source"},
		{Name: "file and env", Body: with("      c: {hosts: [api.github.com], source: {file: gh.token, env: AIRLOCK_TEST_NPM_TOKEN}}\n"), Field: "tenants.dev.credentials.c.source"},
		{Name: "a missing file", Body: with("      c: {hosts: [api.github.com], source: {file: gone.token}}\n"), Field: "tenants.dev.credentials.c.source.file"},
		{Name: "a directory for a file", Body: with("      c: {hosts: [api.github.com], source: {file: adir}}\n"), Field: "tenants.dev.credentials.c.source.file"},
		{Name: "an unset variable", Body: with("      c: {hosts: [api.github.com], source: {env: AIRLOCK_TEST_UNSET_XYZ}}\n"), Field: "tenants.dev.credentials.c.source.env"},
		{Name: "an empty variable", Body: with("      c: {hosts: [api.github.com], source: {env: AIRLOCK_TEST_EMPTY}}\n"), Field: "tenants.dev.credentials.c.source.env"},
		{Name: "a bad approval", Body: one("        approval: sometimes\n"), Field: "tenants.dev.credentials.c.approval"},
		{Name: "a max_ttl past a day", Body: one("        max_ttl: 25h\n"), Field: "tenants.dev.credentials.c.max_ttl"},
		{Name: "a max_ttl under a minute", Body: one("        max_ttl: 30s\n"), Field: "tenants.dev.credentials.c.max_ttl"},
		{Name: "an upstream_ca that is not PEM", Body: one("        upstream_ca: gh.token\n"), Field: "tenants.dev.credentials.c.upstream_ca"},
		{Name: "an unknown key", Body: one("        value: plain\n"), Field: "tenants.dev.credentials.c.value"},
		{Name: "too many", Body: with(many.String()), Field: "tenants.dev.credentials"},
		{Name: "two names, one placeholder variable", Body: with("      a-b: {hosts: [api.github.com], source: {file: gh.token}}\n      a.b: {hosts: [api.github.com], source: {file: gh.token}}\n"), Field: "tenants.dev.credentials.a.b"},
	}
	f.Run(t, Check, cases)

	path := filepath.Join(f.Dir, "good.yaml")
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	creds := cfg.Policy["dev"].Credentials
	gh := creds["github"]
	if gh.Name != "github" || len(gh.Hosts) != 1 || gh.Hosts[0] != "api.github.com" || gh.Header != "Authorization" ||
		gh.Format != "Bearer {value}" || gh.File != filepath.Join(f.Dir, "gh.token") || !gh.ApprovalRequired ||
		gh.MaxTTL != 15*time.Minute || gh.UpstreamCA == "" {
		t.Errorf("github = %+v", gh)
	}
	npm := creds["npm"]
	want := policy.Credential{Name: "npm", Hosts: []string{"*.npmjs.org", "registry.npmjs.org"}, Header: "Authorization",
		BasicUser: "robot", Env: "AIRLOCK_TEST_NPM_TOKEN", MaxTTL: time.Hour}
	if npm.Name != want.Name || strings.Join(npm.Hosts, ",") != strings.Join(want.Hosts, ",") || npm.Header != want.Header ||
		npm.Format != "" || npm.BasicUser != want.BasicUser || npm.Env != want.Env || npm.MaxTTL != want.MaxTTL || npm.ApprovalRequired {
		t.Errorf("npm = %+v, want %+v", npm, want)
	}
}
