package configtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// ExampleDir is where the operator's guide keeps its two-host example
// configs, relative to the module root.
const ExampleDir = "docs/examples/two-host"

// exampleRoots are the absolute directories the examples name, each moved
// under a temp root by Example.
var exampleRoots = []string{"/etc/airlock/", "/var/lib/airlock/", "/usr/local/lib/airlock/", "/srv/git/"}

// exampleCallers are the callers the guide's `airlock pki init` issues.
var exampleCallers = []string{"client/ci", "approver/alice", "approver/bob", "pipeline/deploy"}

// Example copies the example config name (e.g. "executor.yaml") into a
// temp tree holding what docs/operations.md installs on the hosts, with
// every absolute path of the file moved into that tree, and returns the
// copy's path. The tree has the PKI `airlock pki init` makes (in ca/, and
// at etc/airlock/pki), the authority's grant key in its data directory
// with its public key copied to etc/airlock/grant-keys, a deploy
// credential, stand-ins for the runtimes (never run), and the repository
// directory. The file itself is
// not changed otherwise, so a field the loaders do not know, or a value
// they refuse, fails the caller's check.
func Example(t *testing.T, name string) string {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(moduleRoot(t), ExampleDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		TrustDomain string `yaml:"trust_domain"`
	}
	if err := yaml.Unmarshal(body, &head); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	root := t.TempDir()
	var callers []identity.ID
	for _, c := range exampleCallers {
		callers = append(callers, identity.MustParse("spiffe://"+head.TrustDomain+"/"+c))
	}
	if _, err := pki.Init(filepath.Join(root, "ca"), head.TrustDomain, callers); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(root, "etc/airlock"), filepath.Join(root, "etc/airlock/grant-keys"),
		filepath.Join(root, "etc/airlock/credentials"), filepath.Join(root, "usr/local/lib/airlock"), filepath.Join(root, "srv/git/demo.git"))
	if err := os.WriteFile(filepath.Join(root, "etc/airlock/credentials/demo.deploy"), []byte("token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "ca"), filepath.Join(root, "etc/airlock/pki")); err != nil {
		t.Fatal(err)
	}
	grantKey := filepath.Join(root, "var/lib/airlock/authority/grant.key")
	if _, err := pki.LoadOrCreateEd25519(grantKey); err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(grantKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/airlock/grant-keys/authority.pub"), pub, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, rt := range []string{"runc", "runsc"} {
		if err := os.WriteFile(filepath.Join(root, "usr/local/lib/airlock", rt), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	text := string(body)
	for _, r := range exampleRoots {
		text = strings.ReplaceAll(text, r, root+r)
	}
	path := filepath.Join(root, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func mkdir(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// WithUnknownField writes beside path a copy of it with one more
// top-level field, colour, that no config has, and returns the copy's
// path: a check of it must fail naming colour, or a test of an example
// could not fail on a field the loaders do not know.
func WithUnknownField(t *testing.T, path string) string {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.TrimSuffix(path, ".yaml") + "-unknown.yaml"
	if err := os.WriteFile(out, append(body, "colour: blue\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
