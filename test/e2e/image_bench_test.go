//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/test/registrytest"
)

// benchImage is a stack whose dev tenant may run the Debian toolchain
// image (registrytest.ToolchainPackages: gcc, make, git, Go, Node; about
// 280 MB compressed, 870 MiB unpacked), pushed to a real registry on
// loopback that only the tenant's credential opens.
type benchImage struct {
	s      *stack
	reg    *registrytest.Registry
	ref    string // HOST/team/toolchain@sha256:...
	client authorityv1.AuthorityServiceClient
}

func newBenchImage(b *testing.B) *benchImage {
	b.Helper()
	img := registrytest.DebianImage(b, registrytest.ToolchainPackages...)
	reg := registrytest.Start(b, registrytest.Options{Users: map[string]string{"robot": registryPassword}})
	d := reg.Push(b, "team/toolchain", "bench", img)
	repo := benchRepo(b, 3)
	s := startStack(b, "--repo", "bench="+repo)
	cred := filepath.Join(s.dir, "registry.cred")
	if err := os.WriteFile(cred, []byte("robot:"+registryPassword+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	s.editTenants(b, func(tenants, dev map[string]any) {
		dev["images"] = map[string]any{
			"allowed":    []string{reg.Host + "/team/*"},
			"registries": map[string]any{reg.Host: map[string]any{"credential": cred, "ca": reg.CAFile}},
		}
	})
	s.restartService(b, "authority")
	return &benchImage{s: s, reg: reg, ref: reg.Host + "/team/toolchain@" + d,
		client: authorityv1.NewAuthorityServiceClient(s.dial(b, "client/dev", "authority"))}
}

// run submits `true` on image (none: the host template) and waits for it.
func (bi *benchImage) run(ctx context.Context, image, key string) error {
	return runSpec(ctx, bi.client, key, &authorityv1.JobSpec{Repository: "bench", Revision: "main", Command: []string{"true"}, Image: image})
}

// prune empties the executor's image cache of the tenant's images. A job
// holds its image until the executor has cleaned up after it, a moment
// after its result is reported: prune waits for that.
func (bi *benchImage) prune(ctx context.Context) error {
	for {
		resp, err := bi.client.PruneImages(ctx, &authorityv1.PruneImagesRequest{Tenant: "dev"})
		if err != nil || len(resp.GetInUse()) == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// BenchmarkImagePull is the first job on an image the executor does not
// hold (submit → result of `true`, the image pulled through the authority,
// every digest checked, every layer unpacked) against podman pulling the
// same image from the same registry into a fresh storage (which unpacks
// it too) and skopeo copying it into a directory (which only downloads
// it). benchstat -col /via gives the ratios.
func BenchmarkImagePull(b *testing.B) {
	for _, tool := range []string{"podman", "skopeo"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Fatalf("%s: %v (apt-get install %s; make bench does)", tool, err, tool)
		}
	}
	bi := newBenchImage(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := bi.run(ctx, "", "warm-up"); err != nil {
		b.Fatal(err)
	}
	certDir := b.TempDir()
	if err := os.WriteFile(filepath.Join(certDir, "ca.crt"), bi.reg.CAPEM, 0o644); err != nil {
		b.Fatal(err)
	}
	creds := "robot:" + registryPassword
	tools := map[string]func(dir string) *exec.Cmd{
		"podman": func(dir string) *exec.Cmd {
			return exec.CommandContext(ctx, "podman", "--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
				"--storage-driver", "overlay", "pull", "--quiet", "--cert-dir", certDir, "--creds", creds, bi.ref)
		},
		"skopeo": func(dir string) *exec.Cmd {
			return exec.CommandContext(ctx, "skopeo", "copy", "--quiet", "--src-cert-dir", certDir, "--src-creds", creds,
				"docker://"+bi.ref, "dir:"+filepath.Join(dir, "image"))
		},
	}
	b.Run("via=airlock", func(b *testing.B) {
		for i := range b.N {
			b.StopTimer()
			if err := bi.prune(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := bi.run(ctx, bi.ref, fmt.Sprintf("pull-%d-%d", time.Now().UnixNano(), i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, tool := range []string{"podman", "skopeo"} {
		b.Run("via="+tool, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				dir, err := os.MkdirTemp("", "airlock-bench-"+tool+"-")
				if err != nil {
					b.Fatal(err)
				}
				cmd := tools[tool](dir)
				cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir, "TMPDIR=" + dir}
				b.StartTimer()
				out, err := cmd.CombinedOutput()
				b.StopTimer()
				if err != nil {
					b.Fatalf("%s: %v\n%s", tool, err, out)
				}
				if tool == "podman" {
					exec.Command("podman", "--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "overlay", "system", "reset", "--force").Run()
					// podman's storage binds its overlay directory over itself.
					unix.Unmount(filepath.Join(dir, "root", "overlay"), unix.MNT_DETACH)
				}
				if err := os.RemoveAll(dir); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkImageJob is a `true` job on an image the executor holds against
// one on the host template: the layers are mounted, not copied, so the
// two should cost about the same. benchstat -col /on gives the ratio.
func BenchmarkImageJob(b *testing.B) {
	bi := newBenchImage(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, image := range []string{"", bi.ref} {
		if err := bi.run(ctx, image, "warm-up-"+image); err != nil {
			b.Fatal(err)
		}
	}
	// Interleaved, so load that comes and goes falls on both alike.
	for _, on := range []string{"host", "image"} {
		b.Run("on="+on, func(b *testing.B) {
			image := ""
			if on == "image" {
				image = bi.ref
			}
			for i := range b.N {
				if err := bi.run(ctx, image, fmt.Sprintf("job-%s-%d-%d", on, time.Now().UnixNano(), i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
