package images

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// These tests drive the store with blobs of real OCI images (made by
// go-containerregistry) served by blobServer, which stands in for the
// authority's FetchImageBlob at the boundary between the two services.
// The whole chain, the real authority and a real registry included, is
// tested end to end in test/e2e.

// blobServer serves an image's blobs as the authority would, counting
// requests.
type blobServer struct {
	blobs map[string][]byte
	types map[string]string

	mu      sync.Mutex
	fetches map[string]int
	checks  map[string]int
	// tamper, if set, changes what is served for a digest.
	tamper func(digest string, b []byte) []byte
	// deny, if set, fails checks (another tenant's credential).
	deny bool
	// gate, if set, holds every layer fetch until closed.
	gate chan struct{}
}

func serve(t *testing.T, imgs ...v1.Image) *blobServer {
	t.Helper()
	s := &blobServer{blobs: map[string][]byte{}, types: map[string]string{}, fetches: map[string]int{}, checks: map[string]int{}}
	for _, img := range imgs {
		raw, err := img.RawManifest()
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		mt, _ := img.MediaType()
		s.blobs[d.String()], s.types[d.String()] = raw, string(mt)
		cfg, err := img.RawConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cd, _ := img.ConfigName()
		s.blobs[cd.String()], s.types[cd.String()] = cfg, "application/vnd.oci.image.config.v1+json"
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			ld, _ := l.Digest()
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			lmt, _ := l.MediaType()
			s.blobs[ld.String()], s.types[ld.String()] = b, string(lmt)
		}
	}
	return s
}

func (s *blobServer) FetchImageBlob(ctx context.Context, jobID, digest string, checkOnly bool) (Blob, io.ReadCloser, error) {
	s.mu.Lock()
	b, ok := s.blobs[digest]
	if checkOnly {
		s.checks[digest]++
	} else {
		s.fetches[digest]++
	}
	tamper, deny, gate := s.tamper, s.deny, s.gate
	s.mu.Unlock()
	if !ok {
		return Blob{}, nil, fmt.Errorf("%w: no blob %s", errdefs.ErrNotFound, digest)
	}
	if checkOnly {
		if deny {
			return Blob{}, nil, fmt.Errorf("%w: registry: HTTP 403 DENIED", errdefs.ErrUnavailable)
		}
		return Blob{MediaType: s.types[digest], Size: int64(len(b))}, io.NopCloser(bytes.NewReader(nil)), nil
	}
	if gate != nil && s.types[digest] != "application/vnd.oci.image.config.v1+json" && !isManifest(s.types[digest]) {
		select {
		case <-gate:
		case <-ctx.Done():
			return Blob{}, nil, ctx.Err()
		}
	}
	size := int64(len(b))
	if tamper != nil {
		b = tamper(digest, slices.Clone(b))
	}
	return Blob{MediaType: s.types[digest], Size: size}, io.NopCloser(bytes.NewReader(b)), nil
}

func isManifest(mt string) bool {
	return mt == "application/vnd.oci.image.manifest.v1+json" || mt == "application/vnd.docker.distribution.manifest.v2+json"
}

func (s *blobServer) count(digest string) (fetches, checks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches[digest], s.checks[digest]
}

func newStore(t *testing.T, dir string, max int64) *Store {
	t.Helper()
	s, err := New(Config{Dir: dir, MaxBytes: max, UIDBase: 100000, IDRange: 65536})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func randomImage(t *testing.T, size int64, layers int64) v1.Image {
	t.Helper()
	img, err := random.Image(size, layers)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func refOf(t *testing.T, tenant, job string, img v1.Image) Ref {
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return Ref{Tenant: tenant, JobID: job, Registry: "registry.test:5000", Repository: "team/app", Digest: d.String()}
}

func layerDigests(t *testing.T, img v1.Image) []string {
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		d, _ := l.Digest()
		out = append(out, d.String())
	}
	return out
}

// A first job pulls every blob once and gets the unpacked layers, owned
// by the sandboxes' host ids; a second job on the image fetches nothing.
func TestAcquireOnceThenFromDisk(t *testing.T) {
	img := randomImage(t, 4096, 3)
	srv := serve(t, img)
	s := newStore(t, t.TempDir(), 0)
	got, err := s.Acquire(t.Context(), refOf(t, "dev", "job1", img), srv)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Layers) != 3 {
		t.Fatalf("layers %v", got.Layers)
	}
	for i, d := range layerDigests(t, img) {
		if got.Layers[i] != s.LayerPath(d) {
			t.Errorf("layers[%d] = %s, want %s", i, got.Layers[i], s.LayerPath(d))
		}
		ents, err := os.ReadDir(got.Layers[i])
		if err != nil || len(ents) == 0 {
			t.Errorf("layer %d unpacked to nothing: %v", i, err)
		}
		if f, c := srv.count(d); f != 1 || c != 0 {
			t.Errorf("layer %d: %d fetches, %d checks; want 1, 0", i, f, c)
		}
	}
	got.Release()
	again, err := s.Acquire(t.Context(), refOf(t, "dev", "job2", img), srv)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	for d := range srv.blobs {
		if f, _ := srv.count(d); f != 1 {
			t.Errorf("%s fetched %d times over two jobs, want once", d, f)
		}
	}
	st := s.Stats()
	if st.Hits != 3 || st.Layers != 3 || st.Images != 1 {
		t.Errorf("stats %+v: want 3 hits, 3 layers, 1 image", st)
	}
	l := s.List("dev", "")
	if len(l.Images) != 1 || !slices.Equal(l.Images[0].Jobs, []string{"job2", "job1"}) || l.Images[0].InUse != 1 {
		t.Errorf("list %+v", l.Images)
	}
	if other := s.List("other", ""); len(other.Images) != 0 {
		t.Errorf("another tenant sees %+v", other.Images)
	}
}

// Jobs that want a new image at once pull each layer once.
func TestConcurrentJobsPullEachLayerOnce(t *testing.T) {
	img := randomImage(t, 1<<16, 4)
	srv := serve(t, img)
	srv.gate = make(chan struct{})
	s := newStore(t, t.TempDir(), 0)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := s.Acquire(t.Context(), refOf(t, "dev", fmt.Sprintf("job%d", i), img), srv)
			if err == nil {
				got.Release()
			}
			errs[i] = err
		}()
	}
	close(srv.gate)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, d := range layerDigests(t, img) {
		if f, _ := srv.count(d); f != 1 {
			t.Errorf("layer %s fetched %d times by 6 concurrent jobs, want once", d, f)
		}
	}
}

// What arrives is checked against its digest: a tampered layer, manifest
// or config is refused, and nothing of it stays on disk.
func TestTamperedBlobsRefused(t *testing.T) {
	img := randomImage(t, 4096, 2)
	ref := refOf(t, "dev", "job1", img)
	cfgName, _ := img.ConfigName()
	for name, target := range map[string]string{
		"layer": layerDigests(t, img)[1], "manifest": ref.Digest, "config": cfgName.String(),
	} {
		t.Run(name, func(t *testing.T) {
			srv := serve(t, img)
			srv.tamper = func(d string, b []byte) []byte {
				if d == target {
					b[len(b)/2] ^= 0xff
				}
				return b
			}
			dir := t.TempDir()
			s := newStore(t, dir, 0)
			_, err := s.Acquire(t.Context(), ref, srv)
			if err == nil {
				t.Fatal("a tampered blob was accepted")
			}
			if !errors.Is(err, errdefs.ErrDataLoss) {
				t.Errorf("error %v: want data loss", err)
			}
			if name == "layer" {
				if _, err := os.Stat(s.LayerPath(target)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the tampered layer is on disk: %v", err)
				}
			}
			if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
				t.Errorf("left in tmp: %v", ents)
			}
			if st := s.Stats(); st.Images != 0 {
				t.Errorf("an image was recorded: %+v", st)
			}
		})
	}
}

// A layer another tenant's job pulled is used only once the authority
// checked this tenant's credential reaches it; a refused check refuses
// the job and leaves the layer the first tenant's.
func TestAnotherTenantChecksAccess(t *testing.T) {
	img := randomImage(t, 4096, 2)
	srv := serve(t, img)
	s := newStore(t, t.TempDir(), 0)
	a, err := s.Acquire(t.Context(), refOf(t, "alpha", "job1", img), srv)
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	srv.deny = true
	if _, err := s.Acquire(t.Context(), refOf(t, "beta", "job2", img), srv); err == nil {
		t.Fatal("beta used alpha's layers though its credential does not reach them")
	}
	srv.deny = false
	b, err := s.Acquire(t.Context(), refOf(t, "beta", "job3", img), srv)
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
	for _, d := range layerDigests(t, img) {
		f, c := srv.count(d)
		if f != 1 || c != 2 {
			t.Errorf("layer %s: %d fetches and %d checks, want 1 fetch (alpha's) and 2 checks (beta's)", d, f, c)
		}
	}
	if _, err := s.Acquire(t.Context(), refOf(t, "beta", "job4", img), srv); err != nil {
		t.Fatal(err)
	}
	for _, d := range layerDigests(t, img) {
		if _, c := srv.count(d); c != 2 {
			t.Errorf("layer %s checked again for a tenant already checked", d)
		}
	}
}

// Past its bound the cache evicts the least recently used layers, never
// one a running job holds.
func TestEvictionSparesHeldLayers(t *testing.T) {
	a, b, c := randomImage(t, 1<<20, 1), randomImage(t, 1<<20, 1), randomImage(t, 1<<20, 1)
	srv := serve(t, a, b, c)
	s := newStore(t, t.TempDir(), 7<<19) // room for two of the three
	held, err := s.Acquire(t.Context(), refOf(t, "dev", "running", a), srv)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	for _, img := range []v1.Image{b, c} {
		got, err := s.Acquire(t.Context(), refOf(t, "dev", "next", img), srv)
		if err != nil {
			t.Fatal(err)
		}
		got.Release()
	}
	if _, err := os.Stat(held.Layers[0]); err != nil {
		t.Fatalf("a held layer was evicted: %v", err)
	}
	st := s.Stats()
	if st.Evictions == 0 {
		t.Fatalf("nothing evicted at %+v", st)
	}
	if _, err := os.Stat(s.LayerPath(layerDigests(t, b)[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the least recently used free layer (b's) is still there: %v", err)
	}
	if _, err := os.Stat(s.LayerPath(layerDigests(t, c)[0])); err != nil {
		t.Errorf("the newest layer is gone: %v", err)
	}
	if l := s.List("dev", ""); len(l.Images) != 2 {
		t.Errorf("images after eviction %d, want a and c", len(l.Images))
	}
}

// An image larger than the whole bound is refused before any layer.
func TestImageOverTheBound(t *testing.T) {
	img := randomImage(t, 1<<20, 2)
	srv := serve(t, img)
	s := newStore(t, t.TempDir(), 1<<20)
	_, err := s.Acquire(t.Context(), refOf(t, "dev", "job", img), srv)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("error %v, want failed precondition", err)
	}
	for _, d := range layerDigests(t, img) {
		if f, _ := srv.count(d); f != 0 {
			t.Errorf("layer %s fetched", d)
		}
	}
}

// The cache outlives the store: a new one on the same directory has the
// layers, and drops a tree the index does not name.
func TestReopen(t *testing.T) {
	img := randomImage(t, 4096, 2)
	srv := serve(t, img)
	dir := t.TempDir()
	s := newStore(t, dir, 0)
	got, err := s.Acquire(t.Context(), refOf(t, "dev", "job1", img), srv)
	if err != nil {
		t.Fatal(err)
	}
	got.Release()
	stray := filepath.Join(dir, "layers", "0000000000000000000000000000000000000000000000000000000000000000")
	if err := os.MkdirAll(filepath.Join(stray, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t, dir, 0)
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a stray layer tree survived: %v", err)
	}
	if _, err := s2.Acquire(t.Context(), refOf(t, "dev", "job2", img), srv); err != nil {
		t.Fatal(err)
	}
	for _, d := range layerDigests(t, img) {
		if f, _ := srv.count(d); f != 1 {
			t.Errorf("layer %s fetched %d times across a restart, want once", d, f)
		}
	}
}

// Prune drops the tenant's images no job of its runs on, and deletes
// layers no one holds.
func TestPrune(t *testing.T) {
	a, b := randomImage(t, 4096, 2), randomImage(t, 4096, 1)
	srv := serve(t, a, b)
	s := newStore(t, t.TempDir(), 0)
	running, err := s.Acquire(t.Context(), refOf(t, "dev", "running", a), srv)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Release()
	done, err := s.Acquire(t.Context(), refOf(t, "dev", "done", b), srv)
	if err != nil {
		t.Fatal(err)
	}
	done.Release()
	p, err := s.Prune("dev", "")
	if err != nil {
		t.Fatal(err)
	}
	bd, _ := b.Digest()
	ad, _ := a.Digest()
	if len(p.Images) != 1 || p.Images[0].Digest != bd.String() || !slices.Equal(p.InUse, []string{ad.String()}) || p.Freed <= 0 {
		t.Fatalf("prune %+v: want b pruned, a kept in use, bytes freed", p)
	}
	if _, err := os.Stat(s.LayerPath(layerDigests(t, b)[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("b's layer is still on disk")
	}
	for _, l := range running.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("a running job's layer was pruned: %v", err)
		}
	}
}

// An image listing one layer twice (buildkit's empty layer) stacks it once,
// at its topmost place.
func TestRepeatedLayerStackedOnce(t *testing.T) {
	base := randomImage(t, 1024, 1)
	ls, _ := base.Layers()
	extra, _ := random.Layer(1024, "application/vnd.oci.image.layer.v1.tar+gzip")
	img, err := mutate.AppendLayers(base, extra, ls[0])
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, img)
	s := newStore(t, t.TempDir(), 0)
	got, err := s.Acquire(t.Context(), refOf(t, "dev", "job", img), srv)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Release()
	ld, _ := ls[0].Digest()
	ed, _ := extra.Digest()
	want := []string{s.LayerPath(ed.String()), s.LayerPath(ld.String())}
	if !slices.Equal(got.Layers, want) {
		t.Fatalf("layers %v, want %v (the repeated layer at its top place only)", got.Layers, want)
	}
}

// Another job's failed pull is not this job's failure: it pulls itself.
func TestFailedPullNotShared(t *testing.T) {
	img := randomImage(t, 1<<16, 1)
	target := layerDigests(t, img)[0]
	srv := serve(t, img)
	srv.gate = make(chan struct{})
	var tampered atomic.Bool
	tampered.Store(true)
	srv.tamper = func(d string, b []byte) []byte {
		if d == target && tampered.Swap(false) {
			b[len(b)/2] ^= 0xff // the first fetch only
		}
		return b
	}
	s := newStore(t, t.TempDir(), 0)
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			got, err := s.Acquire(t.Context(), refOf(t, "dev", fmt.Sprintf("job%d", i), img), srv)
			if err == nil {
				got.Release()
			}
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond) // both wait on the one layer fetch
	close(srv.gate)
	var failed, ok int
	for range 2 {
		if err := <-errs; err != nil {
			failed++
		} else {
			ok++
		}
	}
	if failed != 1 || ok != 1 {
		t.Fatalf("%d failed, %d ok: want the tampered fetch's job to fail and the other to pull for itself", failed, ok)
	}
}

// Prune keeps the tenant's proof of access to the layers of the images it
// still holds, and sweeps blobs no image names.
func TestPruneKeepsSharedProofAndSweepsBlobs(t *testing.T) {
	a := randomImage(t, 1024, 1)
	la, _ := a.Layers()
	extra, _ := random.Layer(1024, "application/vnd.oci.image.layer.v1.tar+gzip")
	b, err := mutate.AppendLayers(a, extra) // b shares a's layer
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, a, b)
	dir := t.TempDir()
	s := newStore(t, dir, 0)
	for _, img := range []v1.Image{a, b} {
		got, err := s.Acquire(t.Context(), refOf(t, "dev", "job", img), srv)
		if err != nil {
			t.Fatal(err)
		}
		got.Release()
	}
	ad, _ := a.Digest()
	if _, err := s.Prune("dev", ad.String()); err != nil {
		t.Fatal(err)
	}
	shared, _ := la[0].Digest()
	// b's next job: no check for the shared layer.
	got, err := s.Acquire(t.Context(), refOf(t, "dev", "job2", b), srv)
	if err != nil {
		t.Fatal(err)
	}
	got.Release()
	if _, c := srv.count(shared.String()); c != 0 {
		t.Errorf("the shared layer was checked %d times after a's prune", c)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "blobs"))
	if len(ents) != 2 {
		t.Errorf("blobs after the prune: %d, want b's manifest and config", len(ents))
	}
}
