package ocilayer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOverlayStacksLayers: two layers unpacked here and mounted as
// overlayfs lower directories (read-only) show what an image's layers
// mean: a whited-out file is gone, an opaque directory shows only the
// upper layer's entries, and the rest merges.
func TestOverlayStacksLayers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting overlayfs needs root")
	}
	base := t.TempDir()
	lower, upper, target := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "merged")
	for _, d := range []string{lower, upper, target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	layers := []struct {
		dst  string
		ents []entry
	}{
		{lower, []entry{
			dir("etc/"), reg("etc/keep", "keep"), reg("etc/gone", "gone"),
			dir("etc/gonedir/"), reg("etc/gonedir/f", "f"),
			dir("opq/"), reg("opq/old1", "1"), reg("opq/old2", "2"),
		}},
		{upper, []entry{
			dir("etc/"), reg("etc/.wh.gone", ""), reg("etc/.wh.gonedir", ""), reg("etc/new", "new"),
			dir("opq/"), reg("opq/.wh..wh..opq", ""), reg("opq/fresh", "fresh"),
			reg("implicit/.wh..wh..opq", ""),
		}},
	}
	for _, l := range layers {
		if _, err := unpackBytes(t, layerTar(t, l.ents...), MediaTypeOCILayer, l.dst, Options{}); err != nil {
			t.Fatal(err)
		}
	}
	err := unix.Mount("overlay", target, "overlay", unix.MS_RDONLY, "lowerdir="+upper+":"+lower)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENODEV) {
		t.Skipf("overlayfs unavailable: %v", err)
	}
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})

	names := func(rel string) []string {
		ents, err := os.ReadDir(filepath.Join(target, rel))
		if err != nil {
			t.Fatalf("read %s: %v", rel, err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if got, want := names("etc"), []string{"keep", "new"}; !slices.Equal(got, want) {
		t.Errorf("etc shows %v, want %v", got, want)
	}
	if got, want := names("opq"), []string{"fresh"}; !slices.Equal(got, want) {
		t.Errorf("opaque opq shows %v, want %v", got, want)
	}
	if _, err := os.Lstat(filepath.Join(target, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("etc/gone: %v, want it whited out", err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "etc/keep")); err != nil || string(b) != "keep" {
		t.Errorf("etc/keep: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(target, "etc/x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing the read-only mount: %v, want EROFS", err)
	}
}
