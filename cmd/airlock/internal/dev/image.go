package dev

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/rootfsimage"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

func newDevImage(g *cmdutil.Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Put images in the dev stack's registry (dev up --registry)",
	}
	cmd.AddCommand(newDevImagePush(g))
	return cmd
}

// pushedImage is what dev image push reports.
type pushedImage struct {
	// Reference is HOST/REPOSITORY:TAG@sha256:..., what a job may name.
	Reference string `json:"reference"`
	Digest    string `json:"digest"`
	// Size is the manifest's, config's and layer's bytes in the registry.
	Size int64 `json:"size"`
}

func newDevImagePush(g *cmdutil.Globals) *cobra.Command {
	var dir, rootfs, ref string
	cmd := &cobra.Command{
		Use:   "push --dir DIR --rootfs TAR --name REPO:TAG",
		Short: "Make a one-layer image of a root filesystem tar and push it to the dev stack's registry",
		Long: `Makes a one-layer OCI image (linux/amd64, PATH set, without the device nodes
a bootstrap leaves under ./dev) of a root filesystem tar, such as the
rootfs.tar tools/images/build.sh makes with mmdebstrap, and pushes it to the
registry of the dev stack in DIR (started with airlock dev up --registry),
with the stack's credential, trusting only the dev CA. --name is the
repository and tag in that registry, below dev/ (the dev tenant's part of
it). It prints the pushed reference with its digest:

  tools/images/build.sh /tmp/py python3 python3-pytest
  airlock dev image push --dir DIR --rootfs /tmp/py/rootfs.tar --name dev/python:3
  airlock job submit --repo demo --image 127.0.0.1:PORT/dev/python:3 -- python3 -m pytest -q`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			if err := checkRootfs(rootfs); err != nil {
				return err
			}
			if err := checkImageName(ref); err != nil {
				return err
			}
			addr, err := devRegistryAddress(abs)
			if err != nil {
				return cmdutil.UsageError{Err: fmt.Errorf("--dir: %w", err)}
			}
			tag, err := name.NewTag(addr+"/"+ref, name.StrictValidation)
			if err != nil {
				return cmdutil.UsageError{Err: fmt.Errorf("--name %q: %v", ref, err)}
			}
			tmp, err := os.MkdirTemp("", "airlock-image-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			img, err := rootfsimage.FromTar(rootfs, filepath.Join(tmp, "layer.tar.gz"), rootfsimage.Options{})
			if err != nil {
				return fmt.Errorf("--rootfs %s: %w", rootfs, err)
			}
			user, password, err := readRegistryCredential(devRegistryCredential(abs))
			if err != nil {
				return err
			}
			roots, err := tlsconfig.LoadRoots(pki.CAPath(filepath.Join(abs, "pki")))
			if err != nil {
				return err
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.Proxy = nil // the registry is on loopback
			tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
			defer tr.CloseIdleConnections()
			err = remote.Write(tag, img, remote.WithContext(cmd.Context()), remote.WithTransport(tr),
				remote.WithAuth(&authn.Basic{Username: user, Password: password}))
			if err != nil {
				return fmt.Errorf("push %s: %w", tag, err)
			}
			digest, err := img.Digest()
			if err != nil {
				return err
			}
			out := pushedImage{Reference: tag.String() + "@" + digest.String(), Digest: digest.String(), Size: imageSize(img)}
			return g.Print(out, func(w io.Writer) {
				fmt.Fprintf(w, "pushed %s (%d MB)\n", out.Reference, out.Size>>20)
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the directory given to dev up --registry (required)")
	cmd.Flags().StringVar(&rootfs, "rootfs", "", "a tar of the image's root filesystem, e.g. tools/images/build.sh's rootfs.tar (required)")
	cmd.Flags().StringVar(&ref, "name", "", "REPO:TAG in the stack's registry, below "+devRegistryRepoPrefix+", e.g. "+devRegistryRepoPrefix+"python:3 (required)")
	cmdutil.Required(cmd, "dir", "rootfs", "name")
	return cmd
}

// checkRootfs says what is wrong with --rootfs before anything is made.
func checkRootfs(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return cmdutil.UsageError{Err: fmt.Errorf("--rootfs %s: %w", path, err)}
	}
	if !st.Mode().IsRegular() {
		return cmdutil.UsageError{Err: fmt.Errorf("--rootfs %s: not a file (a tar of a root filesystem)", path)}
	}
	return nil
}

// checkImageName says what is wrong with --name: it is REPO:TAG below
// dev/, with no registry host (the stack's registry is the only one) and
// no digest (the push makes it).
func checkImageName(ref string) error {
	bad := func(format string, args ...any) error {
		return cmdutil.UsageError{Err: fmt.Errorf("--name %q: "+format, append([]any{ref}, args...)...)}
	}
	if strings.Contains(ref, "@") {
		return bad("a digest is the push's result; give REPO:TAG")
	}
	first, _, hasSlash := strings.Cut(ref, "/")
	if hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return bad("names a registry host (%s); give REPO:TAG, the stack's registry is the one pushed to", first)
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	if !strings.Contains(last, ":") {
		return bad("no tag; give REPO:TAG, e.g. %spython:3", devRegistryRepoPrefix)
	}
	if !strings.HasPrefix(ref, devRegistryRepoPrefix) {
		return bad("the dev tenant's images are below %s; e.g. %s%s", devRegistryRepoPrefix, devRegistryRepoPrefix, ref)
	}
	if _, err := name.NewTag("127.0.0.1:5000/"+ref, name.StrictValidation); err != nil {
		return bad("%v", err)
	}
	return nil
}

// imageSize is img's manifest, config and compressed layers in bytes, 0 if
// any is unknown.
func imageSize(img v1.Image) int64 {
	m, err := img.Manifest()
	if err != nil {
		return 0
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size
}
