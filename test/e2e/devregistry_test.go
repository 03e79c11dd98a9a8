//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/test/registrytest"
)

// binDirWith is a directory holding the e2e binaries and, by name, the
// extra ones given, for dev up's --bin-dir: it finds the registry and
// airlock-vm only beside the services, and TestMain's binDir holds
// neither, so that only the tests that ask for them get them.
func binDirWith(t *testing.T, extra map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(binDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(binDir, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	for name, path := range extra {
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startRegistryStack is startStack with --registry: it also returns the
// registry's pid and address, and reaps the registry after the stack's dev
// down, so no registry process outlives the test.
func startRegistryStack(t *testing.T, args ...string) (s *stack, registry proc, addr string) {
	t.Helper()
	// Registered first, so it runs after startStack's dev down.
	t.Cleanup(func() {
		if registry.pid > 0 && procStart(registry.pid) == registry.start {
			if _, err := reap(registry.pid, stopTimeout); err != nil {
				t.Errorf("cleanup: registry: %v", err)
			}
		}
	})
	s = startStack(t, append(args, "--registry", "--bin-dir", binDirWith(t, map[string]string{"registry": registrytest.Binary(t)}))...)
	pid, err := os.ReadFile(filepath.Join(s.dir, "registry", "registry.pid"))
	if err != nil {
		t.Fatalf("dev up --registry: %v", err)
	}
	registry.pid, _ = strconv.Atoi(strings.TrimSpace(string(pid)))
	registry.start = procStart(registry.pid)
	if registry.start == "" {
		t.Fatalf("dev up --registry: pid %d is not running", registry.pid)
	}
	config, err := os.ReadFile(filepath.Join(s.dir, "registry", "config.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(config), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "addr: "); ok {
			addr, _ = strconv.Unquote(v)
		}
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("registry listens on %q, want 127.0.0.1:PORT", addr)
	}
	return s, registry, addr
}

// TestDevRegistry: dev up --registry runs a registry the dev tenant may
// pull from; dev image push makes an image of a root filesystem tar (a few
// host programs) and pushes it with the stack's credential; a job runs on
// it by tag, its command finding the image's files and the repository;
// job get names the pushed digest; dev down stops the registry, and no
// registry process is left.
func TestDevRegistry(t *testing.T) {
	repo, _ := sampleRepo(t)
	s, registry, addr := startRegistryStack(t, "--repo", "sample="+repo)

	cred, err := os.ReadFile(filepath.Join(s.dir, "authority", "credentials", "registry.cred"))
	if err != nil {
		t.Fatal(err)
	}
	if user, password, _ := strings.Cut(strings.TrimSpace(string(cred)), ":"); user != "dev" || len(password) < 32 {
		t.Fatalf("registry.cred is not dev:PASSWORD with a random password")
	}
	if st, _ := os.Stat(filepath.Join(s.dir, "authority", "credentials", "registry.cred")); st.Mode().Perm() != 0o600 {
		t.Errorf("registry.cred mode %v, want 0600", st.Mode().Perm())
	}
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(registry.pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if e := strings.ToLower(string(environ)); strings.Contains(e, "proxy") || !strings.Contains(e, "otel_sdk_disabled=true") {
		t.Errorf("registry's environment is not the minimal one: %q", environ)
	}

	rootfs := filepath.Join(t.TempDir(), "rootfs.tar")
	files := registrytest.HostPrograms(t, "ID=airlock-dev-registry\n", "cat")
	if err := os.WriteFile(rootfs, registrytest.Tar(t, files), 0o600); err != nil {
		t.Fatal(err)
	}
	res := s.airlock(t, "dev", "image", "push", "--dir", s.dir, "--rootfs", rootfs, "--name", "dev/tiny:1", "-o", "json")
	if res.code != 0 {
		t.Fatalf("dev image push: exit %d\n%s", res.code, res.stderr)
	}
	var pushed struct{ Reference, Digest string }
	if err := json.Unmarshal([]byte(res.stdout), &pushed); err != nil {
		t.Fatalf("dev image push -o json: %v\n%s", err, res.stdout)
	}
	if !strings.HasPrefix(pushed.Digest, "sha256:") || pushed.Reference != addr+"/dev/tiny:1@"+pushed.Digest {
		t.Fatalf("pushed %+v, want %s/dev/tiny:1@sha256:...", pushed, addr)
	}

	res = s.airlock(t, "job", "submit", "--repo", "sample", "--image", addr+"/dev/tiny:1", "--wait", "--",
		"sh", "-c", "cat /etc/os-release lib/greet.txt")
	if res.code != 0 {
		t.Fatalf("job on the pushed image: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	for _, want := range []string{"ID=airlock-dev-registry\n", "hello\n", addr + "/dev/tiny@" + pushed.Digest} {
		if !strings.Contains(res.stdout+res.stderr, want) {
			t.Errorf("job output lacks %q:\nstdout:\n%s\nstderr:\n%s", want, res.stdout, res.stderr)
		}
	}

	// Outside dev/ is not the dev tenant's.
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--image", addr+"/other/tiny:1", "--", "true")
	if res.code == 0 || !strings.Contains(res.stderr, "spec.image") {
		t.Errorf("a job on %s/other/tiny:1: exit %d, stderr %q; want a refusal naming spec.image", addr, res.code, res.stderr)
	}

	res = runCommand(t, nil, bin("airlock"), "dev", "down", "--dir", s.dir, "-o", "json")
	var down struct{ Registry *devService }
	if err := json.Unmarshal([]byte(res.stdout), &down); res.code != 0 || err != nil {
		t.Fatalf("dev down: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	if down.Registry == nil || down.Registry.PID != registry.pid || down.Registry.Status != "stopped" {
		t.Errorf("dev down reports the registry as %+v, want pid %d stopped", down.Registry, registry.pid)
	}
	if _, err := reap(registry.pid, stopTimeout); err != nil {
		t.Errorf("registry after dev down: %v", err)
	}
	if st := procState(registry.pid); st != "" {
		t.Errorf("registry (pid %d) still in the process table after dev down (state %s)", registry.pid, st)
	}
}
