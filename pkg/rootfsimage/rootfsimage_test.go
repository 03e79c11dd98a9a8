package rootfsimage

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestFromTar: device nodes under ./dev are dropped (./dev itself stays),
// everything else is kept, the configuration is linux/amd64 with the PATH
// and the fixed creation time, and the same tar makes the same digest.
func TestFromTar(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "rootfs.tar")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./etc/os-release", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("ID\n"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	img, err := FromTar(src, filepath.Join(dir, "a.tar.gz"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Time.Equal(Created) || !slices.Equal(cf.Config.Env, []string{DefaultPath}) {
		t.Errorf("config: os %s arch %s created %v env %v", cf.OS, cf.Architecture, cf.Created, cf.Config.Env)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v, want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if want := []string{"./", "./dev/", "./etc/", "./etc/os-release"}; !slices.Equal(names, want) {
		t.Errorf("layer holds %v, want %v", names, want)
	}
	again, err := FromTar(src, filepath.Join(dir, "b.tar.gz"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("the same tar made %s and %s", d1, d2)
	}
	empty := filepath.Join(dir, "empty.tar")
	os.WriteFile(empty, make([]byte, 1024), 0o600)
	if _, err := FromTar(empty, filepath.Join(dir, "c.tar.gz"), Options{}); err == nil {
		t.Error("an empty tar made an image")
	}
}
