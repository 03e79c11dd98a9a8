package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// TestRenderedConfigsPassCheckConfig runs each service's own
// --check-config on the config the chart renders, with the files the
// config names made for real under a temp dir (a throwaway CA and each
// service's pair, the grant keys, the PostgreSQL CA, stand-in runtimes):
// the services' strict decoding and validation, not a copy of them.
//
// The chart is written to the executor fleet's config contract, which the
// binaries of this tree may predate: the authority's fleet section (and
// its executor.address, and the publisher's, gone from it). fleetDelta says which
// refusals of an older binary are those and nothing else.
func TestRenderedConfigsPassCheckConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the three service binaries")
	}
	bin := buildServices(t)
	dir := t.TempDir()
	ca, err := pki.NewCA("airlock.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(filepath.Join(dir, "ca")); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(pki.CAPath(filepath.Join(dir, "ca")))
	if err != nil {
		t.Fatal(err)
	}
	// The grant key the authority's Secret holds, its public key in the
	// grant-keys ConfigMap's directory.
	grantKey := filepath.Join(dir, "etc/grant-key/grant.key")
	if _, err := pki.LoadOrCreateEd25519(grantKey); err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(grantKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "etc/grant-keys/grant.pub"), pub, 0o644)
	write(t, filepath.Join(dir, "etc/postgres-ca/ca.crt"), caPEM, 0o644)
	write(t, filepath.Join(dir, "bin/runc"), []byte("#!/bin/sh\n"), 0o755)
	write(t, filepath.Join(dir, "bin/runsc"), []byte("#!/bin/sh\n"), 0o755)

	r := render(t, set("trustDomain", "airlock.test"))
	for _, part := range parts {
		t.Run(part, func(t *testing.T) {
			id := identity.Service("airlock.test", part)
			if part == "executor" {
				// On Kubernetes an executor is named by its node.
				if id, err = identity.Executor("airlock.test", "node-a.example"); err != nil {
					t.Fatal(err)
				}
			}
			kp, err := ca.Issue(id, pki.IssueOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tlsDir := filepath.Join(dir, "tls-"+part)
			write(t, filepath.Join(tlsDir, "ca.crt"), caPEM, 0o644)
			write(t, filepath.Join(tlsDir, "tls.crt"), kp.CertPEM, 0o644)
			write(t, filepath.Join(tlsDir, "tls.key"), kp.KeyPEM, 0o600)

			body := strings.NewReplacer(
				"/var/run/airlock/tls", tlsDir,
				"/etc/airlock/", filepath.Join(dir, "etc")+"/",
				"/var/lib/airlock/", filepath.Join(dir, "var")+"/",
				"/usr/local/lib/airlock/", filepath.Join(dir, "bin")+"/",
			).Replace(r.configMaps[name(part)].Data[part+".yaml"])
			out, err := checkConfig(t, bin, part, filepath.Join(dir, part+".yaml"), body)
			if err == nil {
				return
			}
			older, want := fleetDelta[part]
			if !want {
				t.Fatalf("%s --check-config refused the rendered config: %v\n%s\n%s", part, err, out, body)
			}
			t.Logf("%s predates the fleet contract (%s); checking the rest", part, strings.TrimSpace(out))
			body = older.strip(t, body)
			out, err = checkConfig(t, bin, part, filepath.Join(dir, part+".yaml"), body)
			if err == nil {
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if !strings.Contains(line, ": "+older.refusal+":") {
					t.Errorf("%s --check-config: %s\n(only %q is the fleet contract's delta)\n%s", part, line, older.refusal, body)
				}
			}
		})
	}
}

// delta is how a binary without the fleet contract differs: the rendered
// fields it does not know, and the one refusal left once they are gone.
type delta struct {
	fields  []string
	refusal string
}

var fleetDelta = map[string]delta{
	"authority": {fields: []string{"fleet"}, refusal: "executor.address"},
	"publisher": {refusal: "executor.address"},
}

// strip removes d.fields from the config body.
func (d delta) strip(t *testing.T, body string) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range d.fields {
		delete(m, f)
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func checkConfig(t *testing.T, bin, part, path, body string) (string, error) {
	t.Helper()
	write(t, path, []byte(body), 0o600)
	cmd := exec.Command(filepath.Join(bin, part), "--check-config", "--config", path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	buildOut  []byte
)

// buildServices builds the three service binaries once per test process.
func buildServices(t *testing.T) string {
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "airlock-deploy-bin")
		if buildErr != nil {
			return
		}
		// Without symbols and DWARF: the link is most of the time here.
		cmd := exec.Command("go", "build", "-ldflags=-s -w", "-o", buildDir+"/",
			"./services/authority/cmd/authority", "./services/executor/cmd/executor", "./services/publisher/cmd/publisher")
		cmd.Dir = ".."
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, buildOut)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}
