package registrytest

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/google/go-containerregistry/pkg/compression"
)

// Compression of a layer: compression.GZip or compression.ZStd.
type Compression = compression.Compression

// MediaTypes says which family of media types an image or index uses.
type MediaTypes int

const (
	// OCI is application/vnd.oci.image.* (manifest, index, layers).
	OCI MediaTypes = iota
	// Docker is application/vnd.docker.distribution.manifest.v2+json, the
	// manifest list and rootfs.diff.tar.gzip layers (gzip only).
	Docker
)

// File is one entry of a layer. Type is a tar type flag (tar.TypeReg when
// zero, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, ...);
// Linkname is the target of a link; Mode holds the permission bits and
// fs.ModeSetuid, fs.ModeSetgid, fs.ModeSticky. Entries are written in the
// order given, with nothing checked or added, so a test can make a hostile
// layer (paths with .., whiteouts, device nodes) as easily as a good one.
type File struct {
	Path     string
	Mode     fs.FileMode
	Content  []byte
	Linkname string
	Type     byte
	Uid, Gid int
	// Size overrides the header's size when not zero (a header that lies
	// about its content).
	Size int64
}

// modTime is every entry's modification time, so a layer made twice from
// the same files has the same digest.
var modTime = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Tar is the uncompressed tar stream of files.
func Tar(t testing.TB, files []File) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		typ := f.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := int64(f.Mode.Perm())
		if f.Mode&fs.ModeSetuid != 0 {
			mode |= 0o4000
		}
		if f.Mode&fs.ModeSetgid != 0 {
			mode |= 0o2000
		}
		if f.Mode&fs.ModeSticky != 0 {
			mode |= 0o1000
		}
		hdr := &tar.Header{
			Typeflag: typ, Name: f.Path, Linkname: f.Linkname, Mode: mode,
			Uid: f.Uid, Gid: f.Gid, ModTime: modTime, Format: tar.FormatPAX,
		}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(f.Content))
		}
		if f.Size != 0 {
			hdr.Size = f.Size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("registrytest: tar %s: %v", f.Path, err)
		}
		if len(f.Content) > 0 {
			if _, err := tw.Write(f.Content); err != nil {
				t.Fatalf("registrytest: tar %s: %v", f.Path, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// LayerFromFiles is a layer holding files, compressed with c, with the OCI
// layer media type of c (Image gives it the Docker one for a Docker image).
func LayerFromFiles(t testing.TB, files []File, c Compression) v1.Layer {
	t.Helper()
	return LayerFromTar(t, Tar(t, files), c)
}

// LayerFromTar is a layer of the uncompressed tar stream b, compressed
// with c.
func LayerFromTar(t testing.TB, b []byte, c Compression) v1.Layer {
	t.Helper()
	mt := types.OCILayer
	switch c {
	case compression.GZip:
	case compression.ZStd:
		mt = types.OCILayerZStd
	default:
		t.Fatalf("registrytest: layer compression %q: want gzip or zstd", c)
	}
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	layer, err := tarball.LayerFromOpener(open, tarball.WithCompression(c), tarball.WithMediaType(mt), tarball.WithCompressedCaching)
	if err != nil {
		t.Fatal(err)
	}
	return layer
}

// Config is what a test sets in an image's configuration. A zero Platform
// is linux/amd64.
type Config struct {
	Env        []string
	User       string
	WorkingDir string
	Entrypoint []string
	Cmd        []string
	Platform   v1.Platform
}

// Image is an image of layers (the first at the bottom) with cfg, in the
// media types mt.
func Image(t testing.TB, mt MediaTypes, cfg Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	base := empty.Image
	if mt == Docker {
		base = mutate.MediaType(base, types.DockerManifestSchema2)
		base = mutate.ConfigMediaType(base, types.DockerConfigJSON)
	} else {
		base = mutate.MediaType(base, types.OCIManifestSchema1)
		base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	}
	adds := make([]mutate.Addendum, 0, len(layers))
	for _, l := range layers {
		add := mutate.Addendum{Layer: l}
		if mt == Docker {
			lmt, err := l.MediaType()
			if err != nil {
				t.Fatal(err)
			}
			if lmt != types.OCILayer && lmt != types.DockerLayer {
				t.Fatalf("registrytest: a Docker image has gzip layers only, not %s", lmt)
			}
			add.MediaType = types.DockerLayer
		}
		adds = append(adds, add)
	}
	img, err := mutate.Append(base, adds...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	platform := cfg.Platform
	if platform.OS == "" {
		platform = v1.Platform{OS: "linux", Architecture: "amd64"}
	}
	cf.OS, cf.Architecture, cf.Variant, cf.OSVersion = platform.OS, platform.Architecture, platform.Variant, platform.OSVersion
	cf.Created = v1.Time{Time: modTime}
	cf.Config.Env = slices.Clone(cfg.Env)
	cf.Config.User = cfg.User
	cf.Config.WorkingDir = cfg.WorkingDir
	cf.Config.Entrypoint = slices.Clone(cfg.Entrypoint)
	cf.Config.Cmd = slices.Clone(cfg.Cmd)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Index is a multi-platform index of images, keyed by platform
// ("linux/amd64", "linux/arm64/v8"), in the media types mt: an OCI image
// index or a Docker manifest list. Each image's configuration is given its
// key's platform, so the index and the configurations agree.
func Index(t testing.TB, mt MediaTypes, images map[string]v1.Image) v1.ImageIndex {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	if mt == Docker {
		idx = mutate.IndexMediaType(idx, types.DockerManifestList)
	} else {
		idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	}
	keys := make([]string, 0, len(images))
	for k := range images {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		platform, err := v1.ParsePlatform(key)
		if err != nil || strings.Count(key, "/") < 1 {
			t.Fatalf("registrytest: index platform %q: want os/arch[/variant]", key)
		}
		cf, err := images[key].ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = platform.OS, platform.Architecture, platform.Variant
		img, err := mutate.ConfigFile(images[key], cf)
		if err != nil {
			t.Fatal(err)
		}
		imt, err := img.MediaType()
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: imt, Platform: platform},
		})
	}
	return idx
}
