package registrytest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/airlockhq/airlock/pkg/rootfsimage"
)

// DebianSuite is the Debian release Debian images are built from (the
// DEBIAN_SUITE of tools/images/build.sh).
const DebianSuite = "bookworm"

// DebianPath is the PATH of a Debian image's configuration.
const DebianPath = rootfsimage.DefaultPath

// ToolchainPackages are the packages of the image the compatibility suite
// and the demo run in: DebianImage(t, ToolchainPackages...).
var ToolchainPackages = []string{"gcc", "libc6-dev", "make", "git", "golang-go", "nodejs", "ca-certificates"}

// ErrNoMmdebstrap is returned by BuildDebianImage when mmdebstrap is not
// installed.
var ErrNoMmdebstrap = errors.New("mmdebstrap is not installed (apt-get install -y mmdebstrap)")

// DebianImage is a one-layer OCI image (gzip) of Debian DebianSuite,
// variant minbase, with packages installed, for linux/amd64. It is built
// with tools/images/build.sh the first time on a machine (minutes, and
// downloads from the Debian mirror) and loaded from CacheDir afterwards.
// Without mmdebstrap the test is skipped, or fails when CI=true.
func DebianImage(t testing.TB, packages ...string) v1.Image {
	t.Helper()
	img, _, err := BuildDebianImage(t.Context(), packages, tWriter{t})
	if errors.Is(err, ErrNoMmdebstrap) && os.Getenv("CI") != "true" {
		t.Skipf("registrytest: Debian image: %v", err)
	}
	if err != nil {
		t.Fatalf("registrytest: Debian image of %v: %v", packages, err)
	}
	return img
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// BuildDebianImage is DebianImage for code that is not a test (the demo):
// it returns the image and the OCI image layout directory it is kept in,
// building it if the cache has none; the build's progress goes to log.
func BuildDebianImage(ctx context.Context, packages []string, log io.Writer) (v1.Image, string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, "", err
	}
	script := filepath.Join(root, "tools", "images", "build.sh")
	key, err := debianKey(script, packages)
	if err != nil {
		return nil, "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return nil, "", err
	}
	dir := filepath.Join(cache, "debian")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	final := filepath.Join(dir, key)
	if img, err := loadLayout(final); err == nil {
		return img, final, nil
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return nil, "", ErrNoMmdebstrap
	}
	unlock, err := lockFile(final + ".lock")
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	if img, err := loadLayout(final); err == nil {
		return img, final, nil
	}
	tmp, err := os.MkdirTemp(dir, "."+key+".tmp-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", append([]string{script, tmp}, packages...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_SUITE="+DebianSuite)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return nil, "", fmt.Errorf("%s: %w", script, err)
	}
	fmt.Fprintf(log, "mmdebstrap: %v\n", time.Since(start).Round(time.Second))
	img, err := rootfsimage.FromTar(filepath.Join(tmp, "rootfs.tar"), filepath.Join(tmp, "layer.tar.gz"), rootfsimage.Options{Env: []string{DebianPath}, Cmd: []string{"/bin/bash"}})
	if err != nil {
		return nil, "", err
	}
	lp, err := layout.Write(filepath.Join(tmp, "oci"), empty.Index)
	if err != nil {
		return nil, "", err
	}
	if err := lp.AppendImage(img); err != nil {
		return nil, "", err
	}
	if err := os.Rename(filepath.Join(tmp, "oci"), final); err != nil {
		return nil, "", err
	}
	var size int64
	if layers, err := img.Layers(); err == nil && len(layers) == 1 {
		size, _ = layers[0].Size()
	}
	fmt.Fprintf(log, "Debian image %s built in %v, layer %d MB compressed\n", final, time.Since(start).Round(time.Second), size>>20)
	img, err = loadLayout(final)
	return img, final, err
}

// debianKey names a build by everything that decides its content: the
// suite, the packages (in any order) and the build script.
func debianKey(script string, packages []string) (string, error) {
	if len(packages) == 0 {
		return "", errors.New("no packages")
	}
	b, err := os.ReadFile(script)
	if err != nil {
		return "", err
	}
	pkgs := slices.Clone(packages)
	slices.Sort(pkgs)
	h := sha256.New()
	fmt.Fprintf(h, "layer v1\n%s\n%s\n", DebianSuite, strings.Join(pkgs, ","))
	h.Write(b)
	return DebianSuite + "-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// loadLayout is the one image of the OCI image layout dir.
func loadLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d manifests, want 1", dir, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}
