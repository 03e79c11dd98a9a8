package images

import (
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/test/registrytest"
)

// Resolution and reads against the reference registry (distribution),
// on loopback over TLS with basic auth, as the authority meets one.

const password = "s3cret-pull-password"

type fixture struct {
	reg *registrytest.Registry
	pol policy.Images
	c   *Client
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	reg := registrytest.Start(t, registrytest.Options{Users: map[string]string{"robot": password}})
	cred := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(cred, []byte("robot:"+password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := New()
	t.Cleanup(c.Close)
	return &fixture{reg: reg, c: c, pol: policy.Images{
		Allowed:    []policy.ImagePattern{{Registry: reg.Host, Repository: "team", Prefix: true}},
		Registries: map[string]policy.Registry{reg.Host: {Credential: cred, CA: reg.CAFile}},
	}}
}

func TestResolve(t *testing.T) {
	f := newFixture(t)
	img := registrytest.Image(t, registrytest.OCI, registrytest.Config{Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8"}, User: "1000:1000", WorkingDir: "/src"},
		registrytest.LayerFromFiles(t, []registrytest.File{{Path: "etc/os-release", Mode: 0o644, Content: []byte("ID=test\n")}}, compression.GZip),
		registrytest.LayerFromFiles(t, []registrytest.File{{Path: "usr/bin/tool", Mode: 0o755, Content: []byte("#!/bin/sh\n")}}, compression.ZStd))
	d := f.reg.Push(t, "team/app", "v1", img)

	r, err := f.c.Resolve(t.Context(), f.pol, f.reg.Host+"/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Digest != d || r.Registry != f.reg.Host || r.Repository != "team/app" || len(r.Layers) != 2 {
		t.Fatalf("resolved %+v, want digest %s and 2 layers", r, d)
	}
	if r.Config.User != "1000:1000" {
		t.Errorf("config %+v", r.Config)
	}
	if r.Layers[1].MediaType != string(types.OCILayerZStd) {
		t.Errorf("layer media types %+v", r.Layers)
	}
	// By digest, the same.
	byDigest, err := f.c.Resolve(t.Context(), f.pol, f.reg.Host+"/team/app@"+d)
	if err != nil || byDigest.Digest != d {
		t.Fatalf("by digest: %+v %v", byDigest, err)
	}
	// Each blob reads back, checked.
	for _, b := range append(r.Layers, r.ConfigBlob) {
		rc, err := f.c.Blob(t.Context(), f.pol, r.Registry, r.Repository, b.Digest)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || n != b.Size {
			t.Errorf("blob %s: %d bytes, %v; want %d", b.Digest, n, err, b.Size)
		}
		if err := f.c.CheckBlob(t.Context(), f.pol, r.Registry, r.Repository, b.Digest, b.Size); err != nil {
			t.Errorf("check %s: %v", b.Digest, err)
		}
	}
	m, err := f.c.Manifest(t.Context(), f.pol, r.Registry, r.Repository, d)
	if err != nil || string(m.Manifest) != string(r.Manifest) {
		t.Errorf("manifest: %v", err)
	}
}

// A multi-arch index resolves to its linux/amd64 image, OCI and Docker.
func TestResolveIndex(t *testing.T) {
	f := newFixture(t)
	for _, mt := range []registrytest.MediaTypes{registrytest.OCI, registrytest.Docker} {
		mk := func(s string) registrytest.File {
			return registrytest.File{Path: "arch", Mode: 0o644, Content: []byte(s)}
		}
		amd := registrytest.Image(t, mt, registrytest.Config{}, registrytest.LayerFromFiles(t, []registrytest.File{mk("amd64")}, compression.GZip))
		arm := registrytest.Image(t, mt, registrytest.Config{}, registrytest.LayerFromFiles(t, []registrytest.File{mk("arm64")}, compression.GZip))
		idx := registrytest.Index(t, mt, map[string]v1.Image{"linux/amd64": amd, "linux/arm64/v8": arm})
		id := f.reg.Push(t, "team/multi", "latest", idx)
		r, err := f.c.Resolve(t.Context(), f.pol, f.reg.Host+"/team/multi:latest")
		if err != nil {
			t.Fatal(err)
		}
		if r.IndexDigest != id || r.Digest == id {
			t.Errorf("index %s resolved to %s (index %s)", id, r.Digest, r.IndexDigest)
		}
		got, err := remote.Image(f.reg.Ref(t, "team/multi", "@"+r.Digest), f.reg.Remote(t.Context(), "robot")...)
		if err != nil {
			t.Fatal(err)
		}
		cf, _ := got.ConfigFile()
		if cf.Architecture != "amd64" {
			t.Errorf("picked %s", cf.Architecture)
		}
	}
}

// What the policy refuses, refused before any registry request, naming
// the field; what the registry refuses, said without its words.
func TestResolveRefusals(t *testing.T) {
	f := newFixture(t)
	noise := make([]byte, 64<<10) // incompressible: the layer stays 64 KiB
	rand.Read(noise)
	big := registrytest.Image(t, registrytest.OCI, registrytest.Config{},
		registrytest.LayerFromFiles(t, []registrytest.File{{Path: "blob", Mode: 0o644, Content: noise}}, compression.GZip))
	d := f.reg.Push(t, "team/app", "v1", big)
	f.reg.Push(t, "outside/app", "v1", big)

	pinned := f.pol
	pinned.Allowed = []policy.ImagePattern{{Registry: f.reg.Host, Repository: "team/app", Digest: "sha256:" + strings.Repeat("0", 64)}}
	small := f.pol
	small.MaxBytes = 1024
	noCred := f.pol
	noCred.Registries = map[string]policy.Registry{f.reg.Host: {CA: f.reg.CAFile}}
	badCred := f.pol
	wrong := filepath.Join(t.TempDir(), "wrong")
	os.WriteFile(wrong, []byte("robot:not-the-password\n"), 0o600)
	badCred.Registries = map[string]policy.Registry{f.reg.Host: {Credential: wrong, CA: f.reg.CAFile}}
	noCA := f.pol
	noCA.Registries = map[string]policy.Registry{f.reg.Host: {Credential: f.pol.Registries[f.reg.Host].Credential}}

	for _, c := range []struct {
		name string
		pol  policy.Images
		ref  string
		kind error
		want string
	}{
		{"no registry", f.pol, "ubuntu:24.04", errdefs.ErrInvalidArgument, "spec.image: \"ubuntu:24.04\" names no registry"},
		{"outside the policy", f.pol, f.reg.Host + "/outside/app:v1", errdefs.ErrPermissionDenied, "is not allowed by the tenant's image policy"},
		{"a bad digest", f.pol, f.reg.Host + "/team/app@sha256:abc", errdefs.ErrInvalidArgument, "spec.image"},
		{"pinned elsewhere", pinned, f.reg.Host + "/team/app:v1", errdefs.ErrPermissionDenied, "pins"},
		{"too big", small, f.reg.Host + "/team/app:v1", errdefs.ErrPermissionDenied, "above the tenant's max_size of 1024"},
		{"no such tag", f.pol, f.reg.Host + "/team/app:nope", errdefs.ErrNotFound, "HTTP 404"},
		{"no credential", noCred, f.reg.Host + "/team/app:v1", errdefs.ErrUnavailable, "HTTP 401"},
		{"a wrong credential", badCred, f.reg.Host + "/team/app:v1", errdefs.ErrUnavailable, "HTTP 401"},
		{"an untrusted certificate", noCA, f.reg.Host + "/team/app@" + d, errdefs.ErrUnavailable, "not trusted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.c.Resolve(t.Context(), c.pol, c.ref)
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v: want %v containing %q", err, c.kind, c.want)
			}
			for _, secret := range []string{password, "not-the-password"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the error carries the credential: %v", err)
				}
			}
		})
	}
}

// Plain HTTP is never spoken, not even to a loopback registry where
// go-containerregistry would fall back to it: a plain-HTTP server on
// loopback that would answer anything sees no request, and so no
// credential.
func TestPlaintextRefused(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	cred := filepath.Join(t.TempDir(), "cred")
	os.WriteFile(cred, []byte("robot:"+password+"\n"), 0o600)
	pol := policy.Images{Allowed: []policy.ImagePattern{{Registry: host, Prefix: true}}, Registries: map[string]policy.Registry{host: {Credential: cred}}}
	c := New()
	defer c.Close()
	_, err := c.Resolve(t.Context(), pol, host+"/team/app:v1")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("error %v, want unavailable", err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the plain-HTTP server got %d requests", n)
	}
}
