package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// TestRenderedConfigsPassCheckConfig runs each service's own
// --check-config on the config the chart renders, with the files the
// config names made for real under a temp dir (a throwaway CA and each
// service's pair, the grant keys, the PostgreSQL CA, stand-in runtimes),
// and the flags each pod passes: the services' strict decoding and
// validation, not a copy of them.
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
			// The flags the pod passes besides --config, with the pod's
			// address the downward API would give.
			var flags []string
			if part == "executor" {
				args := r.daemonSets[name(part)].Spec.Template.Spec.Containers[0].Args
				for i := 0; i < len(args); i++ {
					if args[i] == "--config" {
						i++
						continue
					}
					flags = append(flags, strings.ReplaceAll(args[i], "$(POD_IP)", "10.244.1.7"))
				}
				if len(flags) == 0 {
					t.Fatal("the executor's pod passes no --advertise: the authority could not dial it")
				}
			}
			if out, err := checkConfig(t, bin, part, filepath.Join(dir, part+".yaml"), body, flags...); err != nil {
				t.Fatalf("%s --check-config refused the rendered config: %v\n%s\n%s", part, err, out, body)
			}
		})
	}
}

func checkConfig(t *testing.T, bin, part, path, body string, flags ...string) (string, error) {
	t.Helper()
	write(t, path, []byte(body), 0o600)
	cmd := exec.Command(filepath.Join(bin, part), append([]string{"--check-config", "--config", path}, flags...)...)
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
