package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// A tenant's image policy from the file: each bad entry fails naming its
// field; a good one becomes the patterns, pins and registries the
// authority checks every --image against.
func TestImagePolicy(t *testing.T) {
	f := configtest.New(t, "authority")
	if err := os.WriteFile(filepath.Join(f.Dir, "reg.cred"), []byte("robot:s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.Dir, "bad.cred"), []byte("no colon here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pin := "sha256:" + "ab12" + "00000000000000000000000000000000000000000000000000000000000000"[:60]
	base := f.Common() + `fleet: {lost_after: 1m}
tenants:
  dev:
    clients: [client/dev]
    repositories: {demo: {url: /srv/git/demo.git}}
`
	with := func(images string) string { return base + "    images:\n" + images }
	good := with(`      default: registry.test:5000/team/build:1
      allowed:
        - registry.test:5000/team/*
        - registry.test:5000/tools/python
        - registry.test:5000/tools/node@` + pin + `
        - other.test/*
      max_size: 1GiB
      registries:
        registry.test:5000: {credential: reg.cred}
`)
	cases := []configtest.Case{
		{Name: "a good image policy", Body: good, Summary: "1 tenants"},
		{Name: "a tag in a pattern", Body: with("      allowed: [registry.test:5000/team/python:3.12]\n"), Field: "tenants.dev.images.allowed[0]"},
		{Name: "no registry in a pattern", Body: with("      allowed: [python]\n"), Field: "tenants.dev.images.allowed[0]"},
		{Name: "a pin on a prefix", Body: with("      allowed: [registry.test:5000/team/*@" + pin + "]\n"), Field: "tenants.dev.images.allowed[0]"},
		{Name: "a short pin", Body: with("      allowed: [registry.test:5000/team/x@sha256:abc]\n"), Field: "tenants.dev.images.allowed[0]"},
		{Name: "a default outside the patterns", Body: with("      default: elsewhere.test/x:1\n      allowed: [registry.test:5000/team/*]\n"), Field: "tenants.dev.images.default"},
		{Name: "a default with no registry", Body: with("      default: ubuntu:24.04\n"), Field: "tenants.dev.images.default"},
		{Name: "a bad max_size", Body: with("      max_size: lots\n"), Field: "tenants.dev.images.max_size"},
		{Name: "a missing credential file", Body: with("      registries: {registry.test:5000: {credential: nowhere.cred}}\n"), Field: "tenants.dev.images.registries.registry.test:5000.credential"},
		{Name: "a credential without a colon", Body: with("      registries: {registry.test:5000: {credential: bad.cred}}\n"), Field: "tenants.dev.images.registries.registry.test:5000.credential"},
		{Name: "a CA that is not PEM", Body: with("      registries: {registry.test:5000: {ca: bad.cred}}\n"), Field: "tenants.dev.images.registries.registry.test:5000.ca"},
		{Name: "a registry with a path", Body: with("      registries: {registry.test/x: {}}\n"), Field: "tenants.dev.images.registries.registry.test/x"},
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
	img := cfg.Policy["dev"].Images
	want := []policy.ImagePattern{
		{Registry: "registry.test:5000", Repository: "team", Prefix: true},
		{Registry: "registry.test:5000", Repository: "tools/python"},
		{Registry: "registry.test:5000", Repository: "tools/node", Digest: pin},
		{Registry: "other.test", Prefix: true},
	}
	if len(img.Allowed) != len(want) {
		t.Fatalf("allowed = %+v, want %+v", img.Allowed, want)
	}
	for i := range want {
		if img.Allowed[i] != want[i] {
			t.Errorf("allowed[%d] = %+v, want %+v", i, img.Allowed[i], want[i])
		}
	}
	if img.Default != "registry.test:5000/team/build:1" || img.MaxBytes != 1<<30 {
		t.Errorf("default %q max %d", img.Default, img.MaxBytes)
	}
	if r := img.Registries["registry.test:5000"]; r.Credential != filepath.Join(f.Dir, "reg.cred") {
		t.Errorf("registry = %+v", r)
	}
	for _, c := range []struct {
		reg, repo string
		ok        bool
	}{
		{"registry.test:5000", "team/a", true},
		{"registry.test:5000", "team/a/b", true},
		{"registry.test:5000", "team", false},
		{"registry.test:5000", "teamx/a", false},
		{"registry.test:5000", "tools/python", true},
		{"registry.test:5000", "tools/python/x", false},
		{"registry.test", "team/a", false},
		{"other.test", "anything/at/all", true},
	} {
		got := false
		for _, p := range img.Allowed {
			got = got || p.Matches(c.reg, c.repo)
		}
		if got != c.ok {
			t.Errorf("%s/%s allowed = %v, want %v", c.reg, c.repo, got, c.ok)
		}
	}
}
