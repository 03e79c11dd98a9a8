package registrytest

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func testFiles() []File {
	return []File{
		{Path: "etc/", Type: tar.TypeDir, Mode: 0o755},
		{Path: "etc/os-release", Mode: 0o644, Content: []byte("ID=test\n")},
		{Path: "usr/bin/hello", Mode: 0o755, Content: []byte("#!/bin/sh\necho hello\n")},
		{Path: "usr/bin/hi", Type: tar.TypeSymlink, Linkname: "hello"},
	}
}

// verify reads img's config and every layer, compressed and uncompressed,
// checking each against its digest (validate.Image knows only gzip).
func verify(img v1.Image) error {
	if _, err := img.RawConfigFile(); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		digest, err := l.Digest()
		if err != nil {
			return err
		}
		for _, read := range []struct {
			open func() (io.ReadCloser, error)
			want func() (v1.Hash, error)
		}{{l.Compressed, l.Digest}, {l.Uncompressed, l.DiffID}} {
			rc, err := read.open()
			if err != nil {
				return fmt.Errorf("layer %s: %w", digest, err)
			}
			h := sha256.New()
			_, err = io.Copy(h, rc)
			rc.Close()
			if err != nil {
				return fmt.Errorf("layer %s: %w", digest, err)
			}
			want, err := read.want()
			if err != nil {
				return err
			}
			if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != want.String() {
				return fmt.Errorf("layer %s: read %s, want %s", digest, got, want)
			}
		}
	}
	return nil
}

// readFile is the content of path in img's flattened filesystem.
func readFile(t *testing.T, layer v1.Layer, path string) string {
	t.Helper()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in layer: %v", path, err)
		}
		if hdr.Name == path {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
}

// TestPushPull pushes an image of each kind and pulls it back by digest
// from the real server: same digest, media types, configuration and
// content, and every blob's digest checked (validate.Image).
func TestPushPull(t *testing.T) {
	r := Start(t, Options{})
	for _, tc := range []struct {
		name      string
		mt        MediaTypes
		c         Compression
		manifest  types.MediaType
		layerType types.MediaType
	}{
		{"oci-gzip", OCI, compression.GZip, types.OCIManifestSchema1, types.OCILayer},
		{"oci-zstd", OCI, compression.ZStd, types.OCIManifestSchema1, types.OCILayerZStd},
		{"docker", Docker, compression.GZip, types.DockerManifestSchema2, types.DockerLayer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := Image(t, tc.mt, Config{Env: []string{"A=1"}, User: "1000:1000", WorkingDir: "/src", Cmd: []string{"sh"}},
				LayerFromFiles(t, testFiles(), tc.c))
			digest := r.Push(t, tc.name, "v1", img)
			got, err := remote.Image(r.Ref(t, tc.name, "@"+digest), r.Remote(t.Context(), "")...)
			if err != nil {
				t.Fatal(err)
			}
			if err := verify(got); err != nil {
				t.Fatalf("pulled image does not verify: %v", err)
			}
			if d, _ := got.Digest(); d.String() != digest {
				t.Errorf("pulled digest %s, pushed %s", d, digest)
			}
			if mt, _ := got.MediaType(); mt != tc.manifest {
				t.Errorf("manifest media type %s, want %s", mt, tc.manifest)
			}
			layers, err := got.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers %d, %v", len(layers), err)
			}
			if mt, _ := layers[0].MediaType(); mt != tc.layerType {
				t.Errorf("layer media type %s, want %s", mt, tc.layerType)
			}
			if got := readFile(t, layers[0], "etc/os-release"); got != "ID=test\n" {
				t.Errorf("etc/os-release %q", got)
			}
			cf, err := got.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Config.User != "1000:1000" || cf.Config.WorkingDir != "/src" || cf.Config.Env[0] != "A=1" || cf.Architecture != "amd64" {
				t.Errorf("config %+v", cf.Config)
			}
			// The tag names the same manifest.
			desc, err := remote.Head(r.Ref(t, tc.name, ":v1"), r.Remote(t.Context(), "")...)
			if err != nil || desc.Digest.String() != digest {
				t.Errorf("tag v1 is %v (%v), want %s", desc, err, digest)
			}
		})
	}
}

// TestBasicAuth: with users, the registry refuses no credential and a
// wrong password with 401 and serves the right one, and the access log
// names the user.
func TestBasicAuth(t *testing.T) {
	r := Start(t, Options{Users: map[string]string{"alice": "s3cret"}})
	digest := r.Push(t, "private/app", "latest", Image(t, OCI, Config{}, LayerFromFiles(t, testFiles(), compression.GZip)))

	for _, tc := range []struct {
		name string
		auth func() remote.Option
	}{
		{"anonymous", func() remote.Option { return remote.WithAuth(r.Auth("")) }},
		{"wrong password", func() remote.Option {
			return remote.WithAuth(&basicAuth{"alice", "wrong"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := remote.Get(r.Ref(t, "private/app", "@"+digest), remote.WithTransport(r.Transport()), tc.auth())
			var terr *transport.Error
			if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
				t.Fatalf("err = %v, want a 401", err)
			}
		})
	}
	if _, err := remote.Image(r.Ref(t, "private/app", ":latest"), r.Remote(t.Context(), "alice")...); err != nil {
		t.Fatalf("alice: %v", err)
	}
	reqs := r.Requests(t)
	if n := Count(reqs, http.MethodGet, "/v2/private/app/manifests/"); n != 3 {
		t.Errorf("access log: %d manifest GETs, want 3 (two refused, alice's): %+v", n, reqs)
	}
	if last := reqs[len(reqs)-1]; last.Status != http.StatusOK {
		t.Errorf("access log: alice's pull ended with %+v", last)
	}
}

type basicAuth struct{ user, pass string }

func (b *basicAuth) Authorization() (*authn.AuthConfig, error) {
	return &authn.AuthConfig{Username: b.user, Password: b.pass}, nil
}

// TestIndexPlatform: a multi-arch index (OCI and a Docker manifest list)
// resolves to its linux/amd64 manifest when pulled for that platform.
func TestIndexPlatform(t *testing.T) {
	r := Start(t, Options{})
	for _, mt := range []MediaTypes{OCI, Docker} {
		images := map[string]v1.Image{}
		for _, p := range []string{"linux/amd64", "linux/arm64/v8"} {
			images[p] = Image(t, mt, Config{Env: []string{"PLATFORM=" + p}},
				LayerFromFiles(t, []File{{Path: "platform", Mode: 0o644, Content: []byte(p)}}, compression.GZip))
		}
		idx := Index(t, mt, images)
		repo := "multi" + map[MediaTypes]string{OCI: "oci", Docker: "docker"}[mt]
		digest := r.Push(t, repo, "latest", idx)
		desc, err := remote.Get(r.Ref(t, repo, ":latest"), r.Remote(t.Context(), "")...)
		if err != nil {
			t.Fatal(err)
		}
		if desc.Digest.String() != digest || !desc.MediaType.IsIndex() {
			t.Fatalf("%s: tag is %s %s, want the index %s", repo, desc.MediaType, desc.Digest, digest)
		}
		img, err := remote.Image(r.Ref(t, repo, "@"+digest), append(r.Remote(t.Context(), ""),
			remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))...)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != "amd64" || cf.Config.Env[0] != "PLATFORM=linux/amd64" {
			t.Errorf("%s: pulled %s %v, want linux/amd64", repo, cf.Architecture, cf.Config.Env)
		}
	}
}

// TestRequestsSeeBlobGets: a pull's manifest and blob GETs are in
// Requests, read from the real server's access log, and nothing more is
// logged when nothing more is asked.
func TestRequestsSeeBlobGets(t *testing.T) {
	r := Start(t, Options{})
	img := Image(t, OCI, Config{}, LayerFromFiles(t, testFiles(), compression.GZip),
		LayerFromFiles(t, []File{{Path: "b", Content: []byte("b")}}, compression.ZStd))
	digest := r.Push(t, "app", "", img)
	before := r.Requests(t)
	if n := Count(before, http.MethodPut, "/v2/app/manifests/"); n != 1 {
		t.Errorf("push: %d manifest PUTs, want 1: %+v", n, before)
	}

	pulled, err := remote.Image(r.Ref(t, "app", "@"+digest), r.Remote(t.Context(), "")...)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(pulled); err != nil {
		t.Fatal(err)
	}
	after := r.Requests(t)[len(before):]
	// Two layers and the config.
	if n := Count(after, http.MethodGet, "/v2/app/blobs/sha256:"); n < 3 {
		t.Errorf("pull: %d blob GETs, want at least 3: %+v", n, after)
	}
	cfgDigest, _ := img.ConfigName()
	if Count(after, http.MethodGet, "/v2/app/blobs/"+cfgDigest.String()) == 0 {
		t.Errorf("pull: no GET of the config blob %s: %+v", cfgDigest, after)
	}
	for _, req := range after {
		if req.Status != http.StatusOK {
			t.Errorf("pull: %+v", req)
		}
	}
	if again := r.Requests(t); len(again) != len(before)+len(after) {
		t.Errorf("Requests without a request in between grew from %d to %d", len(before)+len(after), len(again))
	}
}

// TestParseAccessLine pins the parser to lines the registry wrote (from a
// run of v3.1.2), and ignores its application log lines.
func TestParseAccessLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Request
		ok   bool
	}{
		{`127.0.0.1 - - [04/Dec/2026:19:39:06 +0000] "GET /v2/ HTTP/1.1" 200 2 "" "curl/7.88.1"`,
			Request{Method: "GET", Path: "/v2/", Status: 200}, true},
		{`127.0.0.1 - - [04/Dec/2026:19:46:59 +0000] "PUT /v2/app/blobs/uploads/01a24298?_state=2N7l%3D&digest=sha256%3A4036 HTTP/2.0" 201 0 "" "go-containerregistry"`,
			Request{Method: "PUT", Path: "/v2/app/blobs/uploads/01a24298", Query: "_state=2N7l%3D&digest=sha256%3A4036", Status: 201}, true},
		{`time="2026-12-04T19:39:06.796140981Z" level=info msg="response completed" http.request.method=GET http.request.uri=/v2/ http.response.status=200`,
			Request{}, false},
	} {
		got, ok := ParseAccessLine(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseAccessLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

// TestCorruptBlob: after CorruptBlob the registry serves changed bytes of
// the same size, and a pull that checks digests fails naming the digest.
func TestCorruptBlob(t *testing.T) {
	r := Start(t, Options{})
	layer := LayerFromFiles(t, testFiles(), compression.GZip)
	digest := r.Push(t, "app", "latest", Image(t, OCI, Config{}, layer))
	ld, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	r.CorruptBlob(t, "app", ld.String())

	img, err := remote.Image(r.Ref(t, "app", "@"+digest), r.Remote(t.Context(), "")...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := img.LayerByDigest(ld)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, rc)
	rc.Close()
	if err == nil || !strings.Contains(err.Error(), ld.Hex) {
		t.Fatalf("reading the tampered layer: %v, want a digest mismatch naming %s", err, ld)
	}
	if err := verify(img); err == nil || !strings.Contains(err.Error(), ld.Hex) {
		t.Fatalf("verify: %v, want a refusal naming %s", err, ld)
	}
}

// TestTag: Tag moves a tag to another manifest of the repository, with
// users (Push and Tag act as the first user), and a digest keeps naming
// what it named.
func TestTag(t *testing.T) {
	r := Start(t, Options{Users: map[string]string{"bob": "pw", "alice": "pw2"}})
	first := r.Push(t, "app", "stable", Image(t, OCI, Config{Env: []string{"V=1"}}, LayerFromFiles(t, testFiles(), compression.GZip)))
	second := r.Push(t, "app", "", Image(t, OCI, Config{Env: []string{"V=2"}}, LayerFromFiles(t, testFiles(), compression.GZip)))
	if first == second {
		t.Fatal("two different images have one digest")
	}
	head := func() string {
		desc, err := remote.Head(r.Ref(t, "app", ":stable"), r.Remote(t.Context(), "bob")...)
		if err != nil {
			t.Fatal(err)
		}
		return desc.Digest.String()
	}
	if got := head(); got != first {
		t.Fatalf("stable is %s, want %s", got, first)
	}
	r.Tag(t, "app", "stable", second)
	if got := head(); got != second {
		t.Fatalf("after Tag, stable is %s, want %s", got, second)
	}
	if _, err := remote.Head(r.Ref(t, "app", "@"+first), r.Remote(t.Context(), "bob")...); err != nil {
		t.Fatalf("the first image by digest: %v", err)
	}
}

// TestTamperedManifest: a registry serving another valid manifest under an
// image's digest is caught by a pull by digest.
func TestTamperedManifest(t *testing.T) {
	r := Start(t, Options{})
	digest := r.Push(t, "app", "", Image(t, OCI, Config{Env: []string{"V=1"}}, LayerFromFiles(t, testFiles(), compression.GZip)))
	other := Image(t, OCI, Config{Env: []string{"V=2"}}, LayerFromFiles(t, testFiles(), compression.GZip))
	r.Push(t, "app", "", other)
	raw, err := other.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	r.ReplaceBlob(t, "app", digest, raw)
	_, err = remote.Image(r.Ref(t, "app", "@"+digest), r.Remote(t.Context(), "")...)
	if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(digest, "sha256:")) {
		t.Fatalf("pull of the tampered manifest: %v, want a refusal naming %s", err, digest)
	}
	t.Logf("refused: %v", err)
}
