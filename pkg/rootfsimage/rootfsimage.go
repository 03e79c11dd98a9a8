// Package rootfsimage turns a root filesystem tar (mmdebstrap's --format=tar,
// tools/images/build.sh's rootfs.tar, or any tar of a root) into a
// one-layer OCI image for linux/amd64 that the executor accepts: the
// device nodes a bootstrap leaves under ./dev are dropped (the runtime
// mounts its own /dev, and a layer with a device node is refused), and the
// configuration has a PATH and a fixed creation time, so the same tar makes
// the same digest. `airlock dev image push` and test/registrytest use it.
// Any package may import it.
package rootfsimage

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// DefaultPath is the image's environment when Options.Env is empty: a
// Debian system's PATH.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Created is every image's creation time: an image made twice from the
// same tar has the same digest.
var Created = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Options are an image's configuration.
type Options struct {
	// Env is the image's environment; default [DefaultPath].
	Env []string
	// Cmd is the image's default command (Airlock never runs it: a job
	// names its own); optional.
	Cmd []string
}

// FromTar makes the image of the root filesystem tar src. Its layer is
// written, gzip-compressed, to layerFile, which the image reads from: keep
// the file until the image has been pushed or saved.
func FromTar(src, layerFile string, opts Options) (v1.Image, error) {
	if err := writeLayer(src, layerFile); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(layerFile, tarball.WithMediaType(types.OCILayer), tarball.WithCompression(compression.GZip))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: Created}
	cf.Config.Env = opts.Env
	if len(cf.Config.Env) == 0 {
		cf.Config.Env = []string{DefaultPath}
	}
	cf.Config.Cmd = opts.Cmd
	return mutate.ConfigFile(img, cf)
}

// writeLayer copies the tar src to a gzip layer dst without what is under
// ./dev.
func writeLayer(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	zw := gzip.NewWriter(out)
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(in)
	entries := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", src, err)
		}
		entries++
		name := strings.TrimPrefix(hdr.Name, "./")
		if strings.HasPrefix(name, "dev/") && name != "dev/" {
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	if entries == 0 {
		return fmt.Errorf("%s: not a tar of a root filesystem (no entries)", src)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return out.Close()
}
