package registrytest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/pkg/registryserver"
)

// registryPackage is the reference registry's command, pinned as a tool in
// tools/go.mod.
const registryPackage = registryserver.Package

// CacheDir is where test helpers keep what takes minutes to make (the
// registry binary, Debian images), shared by every test process of the
// machine: $AIRLOCK_TEST_CACHE, or airlock-test under the user's cache
// directory.
func CacheDir() (string, error) {
	if dir := os.Getenv("AIRLOCK_TEST_CACHE"); dir != "" {
		return dir, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory (set AIRLOCK_TEST_CACHE): %w", err)
	}
	return filepath.Join(base, "airlock-test"), nil
}

// RepoRoot is the directory of Airlock's go.mod, found by walking up from
// the working directory (a test's is its package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/airlockhq/airlock\n")) {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("no go.mod of github.com/airlockhq/airlock above %s", dir)
		}
	}
}

var binaryOnce struct {
	sync.Once
	path string
	err  error
}

// Binary returns the path of the registry binary built from tools/go.mod,
// building it on the first call on this machine (a few minutes): it is
// cached under CacheDir keyed by the digest of tools/go.mod and
// tools/go.sum, so a change of the pinned version builds a new one.
func Binary(t testing.TB) string {
	t.Helper()
	binaryOnce.Do(func() { binaryOnce.path, binaryOnce.err = buildBinary() })
	if binaryOnce.err != nil {
		t.Fatalf("registrytest: %v", binaryOnce.err)
	}
	return binaryOnce.path
}

func buildBinary() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	modfile := filepath.Join(root, "tools", "go.mod")
	h := sha256.New()
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, "tools", name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "registry-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	// Test processes of several packages start at once; one builds while
	// the others wait for it rather than building the same thing.
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	defer os.Remove(tmp)
	cmd := exec.Command("go", "build", "-modfile="+modfile, "-o", tmp, registryPackage)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v: %s", registryPackage, err, out)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	return path, nil
}

// lockFile takes an exclusive lock on path (made if missing), waiting for
// another process holding it; unlock releases it.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
