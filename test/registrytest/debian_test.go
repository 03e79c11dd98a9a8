package registrytest

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"
)

// TestDebianImage builds (or loads from the cache) the toolchain image and
// checks it is Debian, carries the toolchain and no device node, and
// survives a push to and a pull from the real registry. The first run on a
// machine takes minutes; set AIRLOCK_SKIP_DEBIAN=1 to leave it out.
func TestDebianImage(t *testing.T) {
	if os.Getenv("AIRLOCK_SKIP_DEBIAN") != "" {
		t.Skip("AIRLOCK_SKIP_DEBIAN is set")
	}
	img := DebianImage(t, ToolchainPackages...)
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, %v; want 1", len(layers), err)
	}
	root := unpack(t, layers[0])
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
			t.Errorf("%s in the image is a %v", strings.TrimPrefix(path, root), d.Type())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// /etc/os-release is a link to ../usr/lib/os-release, resolved in the
	// image.
	osRelease, err := os.ReadFile(filepath.Join(root, "usr", "lib", "os-release"))
	if err != nil || !strings.Contains(string(osRelease), "ID=debian") || !strings.Contains(string(osRelease), DebianSuite) {
		t.Errorf("usr/lib/os-release: %q, %v; want Debian %s", osRelease, err, DebianSuite)
	}
	if link, err := os.Readlink(filepath.Join(root, "etc", "os-release")); err != nil || link != "../usr/lib/os-release" {
		t.Errorf("etc/os-release links to %q (%v)", link, err)
	}
	t.Run("self-contained", func(t *testing.T) { runInChroot(t, root) })

	r := Start(t, Options{})
	digest := r.Push(t, "debian/toolchain", "latest", img)
	pulled, err := remote.Image(r.Ref(t, "debian/toolchain", "@"+digest), r.Remote(t.Context(), "")...)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := pulled.Digest(); err != nil || d.String() != digest {
		t.Fatalf("pulled %v (%v), pushed %s", d, err, digest)
	}
	size, _ := layers[0].Size()
	t.Logf("Debian toolchain image %s: layer %d MB compressed", digest, size>>20)
}

// unpack extracts layer (gzip) into a new directory with the system's tar,
// much faster than archive/tar under the race detector.
func unpack(t *testing.T, layer v1.Layer) string {
	root := t.TempDir()
	rc, err := layer.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	untar := exec.Command("tar", "-xzf", "-", "--no-same-owner", "-C", root)
	untar.Stdin = rc
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("unpack: %v: %s", err, out)
	}
	return root
}

// runInChroot runs the toolchain in a chroot of root with an empty
// environment and nothing of the host but /dev/null (a runtime mounts
// /dev): the image depends on nothing outside itself.
func runInChroot(t *testing.T, root string) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	if err := syscall.Mknod(filepath.Join(root, "dev", "null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	c := "int main(void) { puts(\"hello from c\"); return 0; }"
	g := "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"hello from go\") }\n"
	script := `set -e
printf '#include <stdio.h>\n%s\n' "$C" > /tmp/h.c && gcc -o /tmp/h /tmp/h.c && /tmp/h
printf '%s' "$G" > /tmp/h.go && go run /tmp/h.go
node -e 'console.log("hello from node " + process.version)'
git --version
make --version | head -n1
. /etc/os-release && echo "$PRETTY_NAME"`
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "GOCACHE=/tmp/gocache", "GO111MODULE=off", "C=" + c, "G=" + g}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in the image: %v:\n%s", err, out)
	}
	for _, want := range []string{"hello from c", "hello from go", "hello from node v", "git version", "GNU Make", "Debian GNU/Linux"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("in the image: no %q in:\n%s", want, out)
		}
	}
	t.Logf("in the image:\n%s", out)
}
