// Package images is the executor's image cache: the OCI images jobs run
// on, pulled through the authority (which holds the registry credential;
// this executor never does) and kept content-addressed on disk.
//
// A job's image is acquired by its manifest digest, which its signed grant
// names. The manifest and config are small blobs kept by digest; each
// layer is streamed from the authority straight into pkg/ocilayer's
// unpacker, its compressed digest checked as it arrives and its
// uncompressed digest against the config's diff_id, and kept unpacked,
// owned by the sandboxes' host ids, as a read-only overlayfs lower layer
// that every job on an image containing it shares. Nothing is used before
// its digest checked.
//
// A layer already on disk is never fetched again, and two jobs that want
// the same layer fetch it once. The cache is bounded: past its bound the
// least recently used layers no running job holds are evicted. A layer
// one tenant's job pulled is used by another tenant's job only after the
// authority checked that this tenant's credential reaches it too (a HEAD
// at the registry), so a tenant cannot run on another's private layers by
// naming their digests.
package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/imagecache"
	"github.com/airlockhq/airlock/pkg/ocilayer"
)

// Bounds on what an image may make the executor hold.
const (
	maxManifestSize = 4 << 20
	maxConfigSize   = 4 << 20
	// DefaultMaxBytes bounds the cache where the config names no bound.
	DefaultMaxBytes = 20 << 30
	// entryBytes is what each unpacked entry is counted as beyond its
	// content (an inode and a directory entry).
	entryBytes = 4 << 10
	// pullers is how many layers of one image are pulled at once.
	pullers = 3
)

// Blob is what the authority says of a blob before its bytes.
type Blob struct {
	MediaType string
	Size      int64
}

// Fetcher reads blobs of a job's image through the authority.
type Fetcher interface {
	// FetchImageBlob opens blob digest of job jobID's image; with
	// checkOnly, the authority only checks that the tenant's credential
	// reaches it and the reader is empty.
	FetchImageBlob(ctx context.Context, jobID, digest string, checkOnly bool) (Blob, io.ReadCloser, error)
}

// Config configures a Store.
type Config struct {
	// Dir holds the cache; it is made if missing.
	Dir string
	// MaxBytes bounds the cache's disk (unpacked layers, manifests and
	// configs); 0 is DefaultMaxBytes.
	MaxBytes int64
	// UIDBase and IDRange are the sandboxes' host id range: an unpacked
	// file of uid u is owned by UIDBase+u.
	UIDBase, IDRange uint32
	Logger           *slog.Logger
	Meter            metric.MeterProvider
	Now              func() time.Time
}

// Ref names the image one job runs on.
type Ref struct {
	Tenant, JobID        string
	Registry, Repository string
	// Digest is the manifest digest the job's grant names.
	Digest string
}

// Reference is "registry/repository@digest".
func (r Ref) Reference() string { return r.Registry + "/" + r.Repository + "@" + r.Digest }

// Image is an image acquired for one job: its layers stay on disk until
// Release.
type Image struct {
	// Digest and Reference name it.
	Digest, Reference string
	// Layers are the unpacked layers' directories, bottom first.
	Layers []string
	// Env and WorkingDir are its config's.
	Env        []string
	WorkingDir string

	once    sync.Once
	release func()
}

// Release lets the image's layers be evicted once no other job holds them.
func (i *Image) Release() { i.once.Do(i.release) }

// layer is one cached layer.
type layer struct {
	Digest    string    `json:"digest"`
	DiffID    string    `json:"diff_id"`
	MediaType string    `json:"media_type"`
	Size      int64     `json:"compressed_bytes"`
	Unpacked  int64     `json:"unpacked_bytes"`
	LastUsed  time.Time `json:"last_used"`
	// Tenants are those whose credential the authority checked reaches
	// the layer (or whose job pulled it).
	Tenants []string `json:"tenants"`
	inUse   int
}

// tenantUse is one tenant's hold on an image.
type tenantUse struct {
	LastUsed time.Time `json:"last_used"`
	Jobs     []string  `json:"jobs"`
	inUse    int
}

// image is one cached image.
type image struct {
	Reference string                `json:"reference"`
	Digest    string                `json:"digest"`
	Layers    []string              `json:"layers"` // digests, bottom first
	Config    string                `json:"config"` // digest
	Tenants   map[string]*tenantUse `json:"tenants"`
}

// index is what the store keeps of its cache across restarts.
type index struct {
	// UIDBase is the host id the layers were unpacked for; a cache made
	// for another base is discarded.
	UIDBase uint32            `json:"uid_base"`
	Layers  map[string]*layer `json:"layers"`
	Images  map[string]*image `json:"images"`
}

// Store is the image cache. It is safe for concurrent use.
type Store struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	mu    sync.Mutex
	idx   index
	pulls map[string]*pull // layers and blobs being fetched, by digest
	stats imagecache.Stats
}

type pull struct {
	done chan struct{}
	err  error
}

// New opens the cache at cfg.Dir, dropping whatever an interrupted pull
// or a crash left half-written.
func New(cfg Config) (*Store, error) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.IDRange == 0 {
		return nil, errors.New("images: IDRange is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Store{cfg: cfg, log: cfg.Logger, pulls: map[string]*pull{}}
	for _, d := range []string{cfg.Dir, s.blobDir(), s.layerDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("images: %w", err)
		}
	}
	// The layers' parents must be searchable by the sandboxes' root
	// (runc resolves the root filesystem from inside the user namespace).
	for _, d := range []string{cfg.Dir, s.layerDir()} {
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("images: %w", err)
		}
	}
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, fmt.Errorf("images: clear leftovers: %w", err)
	}
	if err := os.Mkdir(s.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Meter, s)
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}

func (s *Store) blobDir() string  { return filepath.Join(s.cfg.Dir, "blobs") }
func (s *Store) layerDir() string { return filepath.Join(s.cfg.Dir, "layers") }
func (s *Store) tmpDir() string   { return filepath.Join(s.cfg.Dir, "tmp") }
func (s *Store) indexPath() string {
	return filepath.Join(s.cfg.Dir, "index.json")
}

// LayerPath is where a layer's unpacked tree is.
func (s *Store) LayerPath(d string) string {
	return filepath.Join(s.layerDir(), digest.Hex(d))
}

func (s *Store) blobPath(d string) string {
	return filepath.Join(s.blobDir(), digest.Hex(d))
}

// load reads the index and makes it agree with the disk: a layer whose
// tree is missing, or a tree the index does not name, is dropped.
func (s *Store) load() error {
	s.idx = index{UIDBase: s.cfg.UIDBase, Layers: map[string]*layer{}, Images: map[string]*image{}}
	data, err := os.ReadFile(s.indexPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("images: %w", err)
	default:
		var idx index
		if err := json.Unmarshal(data, &idx); err != nil || idx.UIDBase != s.cfg.UIDBase {
			s.log.Warn("images: the cache's index is unreadable or was made for another uid base; starting empty", "error", err)
		} else {
			if idx.Layers == nil {
				idx.Layers = map[string]*layer{}
			}
			if idx.Images == nil {
				idx.Images = map[string]*image{}
			}
			s.idx = idx
		}
	}
	for d := range s.idx.Layers {
		if st, err := os.Lstat(s.LayerPath(d)); err != nil || !st.IsDir() || !digest.Valid(d) {
			delete(s.idx.Layers, d)
		}
	}
	for d, img := range s.idx.Images {
		ok := digest.Valid(d) && img.Tenants != nil
		for _, l := range img.Layers {
			if s.idx.Layers[l] == nil {
				ok = false
			}
		}
		if !ok {
			delete(s.idx.Images, d)
		}
	}
	ents, err := os.ReadDir(s.layerDir())
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	for _, e := range ents {
		if s.idx.Layers["sha256:"+e.Name()] == nil {
			if err := os.RemoveAll(filepath.Join(s.layerDir(), e.Name())); err != nil {
				return fmt.Errorf("images: remove a stray layer: %w", err)
			}
		}
	}
	if err := s.sweepBlobsLocked(); err != nil {
		return err
	}
	return s.saveLocked()
}

func (s *Store) saveLocked() error {
	data, err := json.Marshal(s.idx)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.indexPath(), data, 0o600, atomicfile.Durable)
}

// Acquire makes ref's image ready for job ref.JobID: its manifest, config
// and every layer on disk and checked, pulling what is missing through f.
// The layers stay until the Image is released.
func (s *Store) Acquire(ctx context.Context, ref Ref, f Fetcher) (*Image, error) {
	if !digest.Valid(ref.Digest) {
		return nil, fmt.Errorf("%w: image digest %q is not a sha256 digest", errdefs.ErrInvalidArgument, ref.Digest)
	}
	raw, err := s.blob(ctx, ref, f, ref.Digest, maxManifestSize)
	if err != nil {
		return nil, fmt.Errorf("image %s: manifest: %w", ref.Reference(), err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: image %s: the manifest is not an image manifest", errdefs.ErrInvalidArgument, ref.Reference())
	}
	if err := checkManifest(m); err != nil {
		return nil, fmt.Errorf("%w: image %s: %v", errdefs.ErrInvalidArgument, ref.Reference(), err)
	}
	cfgRaw, err := s.blob(ctx, ref, f, m.Config.Digest.String(), maxConfigSize)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", ref.Reference(), err)
	}
	var cfg v1.ConfigFile
	if err := json.Unmarshal(cfgRaw, &cfg); err != nil {
		return nil, fmt.Errorf("%w: image %s: the config is not valid JSON", errdefs.ErrInvalidArgument, ref.Reference())
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("%w: image %s: its config lists %d diff_ids for %d layers", errdefs.ErrInvalidArgument, ref.Reference(), len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	var need int64
	for _, l := range m.Layers {
		need += l.Size
	}
	if need > s.cfg.MaxBytes {
		return nil, fmt.Errorf("%w: image %s: its %d compressed layer bytes alone are above this executor's image cache bound of %d", errdefs.ErrFailedPrecondition, ref.Reference(), need, s.cfg.MaxBytes)
	}

	// Hold every layer as soon as it is there, so an eviction for
	// another pull cannot take one this job is about to use.
	var (
		mu   sync.Mutex
		held []string
	)
	release := func() {
		mu.Lock()
		defer mu.Unlock()
		s.mu.Lock()
		for _, d := range held {
			if l := s.idx.Layers[d]; l != nil && l.inUse > 0 {
				l.inUse--
			}
		}
		s.mu.Unlock()
		held = nil
	}
	sem := make(chan struct{}, pullers)
	errs := make([]error, len(m.Layers))
	var wg sync.WaitGroup
	for i, l := range m.Layers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := s.layer(ctx, ref, f, l, cfg.RootFS.DiffIDs[i].String()); err != nil {
				errs[i] = fmt.Errorf("layers[%d] %s: %w", i, l.Digest, err)
				return
			}
			mu.Lock()
			held = append(held, l.Digest.String())
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		release()
		return nil, fmt.Errorf("image %s: %w", ref.Reference(), err)
	}

	img := &Image{Digest: ref.Digest, Reference: ref.Reference(), Env: cfg.Config.Env, WorkingDir: cfg.Config.WorkingDir}
	digests := make([]string, len(m.Layers))
	for i, l := range m.Layers {
		digests[i] = l.Digest.String()
	}
	img.Layers = s.stack(digests)
	now := s.cfg.Now()
	s.mu.Lock()
	e := s.idx.Images[ref.Digest]
	if e == nil {
		e = &image{Reference: ref.Reference(), Digest: ref.Digest, Layers: digests, Config: m.Config.Digest.String(), Tenants: map[string]*tenantUse{}}
		s.idx.Images[ref.Digest] = e
	}
	u := e.Tenants[ref.Tenant]
	if u == nil {
		u = &tenantUse{}
		e.Tenants[ref.Tenant] = u
	}
	u.LastUsed, u.inUse = now, u.inUse+1
	u.Jobs = append([]string{ref.JobID}, slices.DeleteFunc(u.Jobs, func(j string) bool { return j == ref.JobID })...)
	if len(u.Jobs) > imagecache.MaxJobs {
		u.Jobs = u.Jobs[:imagecache.MaxJobs]
	}
	for _, d := range digests {
		s.idx.Layers[d].LastUsed = now
	}
	err = s.saveLocked()
	s.mu.Unlock()
	if err != nil {
		release()
		return nil, fmt.Errorf("images: %w", err)
	}
	img.release = func() {
		release()
		s.mu.Lock()
		if e := s.idx.Images[ref.Digest]; e != nil {
			if u := e.Tenants[ref.Tenant]; u != nil && u.inUse > 0 {
				u.inUse--
			}
		}
		s.mu.Unlock()
	}
	return img, nil
}

// checkManifest bounds what a manifest may make the store do.
func checkManifest(m *v1.Manifest) error {
	if len(m.Layers) == 0 || len(m.Layers) > imagecache.MaxLayers {
		return fmt.Errorf("%d layers: an image has 1 to %d", len(m.Layers), imagecache.MaxLayers)
	}
	if !digest.Valid(m.Config.Digest.String()) || m.Config.Size <= 0 || m.Config.Size > maxConfigSize {
		return fmt.Errorf("config %s of %d bytes: want a sha256 digest and 1 to %d bytes", m.Config.Digest, m.Config.Size, maxConfigSize)
	}
	for i, l := range m.Layers {
		if !digest.Valid(l.Digest.String()) || l.Size <= 0 || len(l.URLs) > 0 {
			return fmt.Errorf("layers[%d]: want a sha256 digest, a positive size and no foreign URLs", i)
		}
		if err := ocilayer.CheckMediaType(string(l.MediaType)); err != nil {
			return fmt.Errorf("layers[%d]: %v", i, err)
		}
	}
	return nil
}

// blob is the manifest or config blob digest: from disk when this tenant
// has read it before (the authority resolved it for the tenant at
// submission, so a manifest counts), else fetched, checked and kept.
func (s *Store) blob(ctx context.Context, ref Ref, f Fetcher, blobDigest string, max int64) ([]byte, error) {
	if data, err := os.ReadFile(s.blobPath(blobDigest)); err == nil && int64(len(data)) <= max && digest.Of(data) == blobDigest {
		s.mu.Lock()
		e := s.idx.Images[ref.Digest]
		known := e != nil && e.Tenants[ref.Tenant] != nil
		s.mu.Unlock()
		if known || blobDigest == ref.Digest {
			return data, nil
		}
	}
	p, leader := s.startPull(blobDigest)
	if !leader {
		if err := p.wait(ctx); err != nil {
			return nil, err
		}
		return s.blob(ctx, ref, f, blobDigest, max)
	}
	data, err := func() ([]byte, error) {
		b, rc, err := f.FetchImageBlob(ctx, ref.JobID, blobDigest, false)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		if b.Size > max {
			return nil, fmt.Errorf("%w: %s is %d bytes; at most %d", errdefs.ErrInvalidArgument, blobDigest, b.Size, max)
		}
		data, err := io.ReadAll(io.LimitReader(rc, max+1))
		if err != nil {
			return nil, err
		}
		if int64(len(data)) > max {
			return nil, fmt.Errorf("%w: %s is over %d bytes", errdefs.ErrInvalidArgument, blobDigest, max)
		}
		if got := digest.Of(data); got != blobDigest {
			return nil, fmt.Errorf("%w: what arrived for %s hashes to %s", errdefs.ErrDataLoss, blobDigest, got)
		}
		s.count(1, int64(len(data)), 0)
		return data, atomicfile.Write(s.blobPath(blobDigest), data, 0o600, atomicfile.Fast)
	}()
	s.endPull(blobDigest, p, err)
	return data, err
}

func (s *Store) startPull(d string) (*pull, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pulls[d]; p != nil {
		return p, false
	}
	p := &pull{done: make(chan struct{})}
	s.pulls[d] = p
	return p, true
}

func (s *Store) endPull(d string, p *pull, err error) {
	s.mu.Lock()
	delete(s.pulls, d)
	s.mu.Unlock()
	p.err = err
	close(p.done)
}

func (p *pull) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil // the follower looks again, and pulls itself if it failed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// layer makes layer l ready and holds it for one job: on disk already
// (checked for this tenant), pulled by another job meanwhile, or pulled
// now.
func (s *Store) layer(ctx context.Context, ref Ref, f Fetcher, l v1.Descriptor, diffID string) error {
	d := l.Digest.String()
	for {
		s.mu.Lock()
		if e := s.idx.Layers[d]; e != nil {
			if e.DiffID != diffID {
				s.mu.Unlock()
				return fmt.Errorf("%w: the cached layer's uncompressed digest is %s, the image's config says %s", errdefs.ErrInvalidArgument, e.DiffID, diffID)
			}
			e.inUse++
			known := slices.Contains(e.Tenants, ref.Tenant)
			s.mu.Unlock()
			if known {
				s.count(0, 0, 1)
				return nil
			}
			// Another tenant's job pulled it: this tenant's credential
			// must reach it too.
			_, rc, err := f.FetchImageBlob(ctx, ref.JobID, d, true)
			if err == nil {
				rc.Close()
			}
			s.mu.Lock()
			if err != nil {
				e.inUse--
			} else if !slices.Contains(e.Tenants, ref.Tenant) {
				e.Tenants = append(e.Tenants, ref.Tenant)
			}
			s.mu.Unlock()
			if err != nil {
				return err
			}
			s.count(0, 0, 1)
			return nil
		}
		p := s.pulls[d]
		if p == nil {
			p = &pull{done: make(chan struct{})}
			s.pulls[d] = p
			s.mu.Unlock()
			err := s.pullLayer(ctx, ref, f, l, diffID)
			s.endPull(d, p, err)
			if err != nil {
				return err
			}
			// Held as any cached layer is, but not counted as a hit.
			s.mu.Lock()
			e := s.idx.Layers[d]
			if e == nil {
				s.mu.Unlock()
				continue // evicted at once by another pull: fetch again
			}
			e.inUse++
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
		// Only a success is shared: after another job's failed pull
		// (its registry's bytes, its deadline) this job pulls itself.
		if err := p.wait(ctx); err != nil {
			return err
		}
	}
}

// pullLayer streams layer l from the authority into a new tree, checking
// its digest as it arrives and its diff_id as it unpacks, and puts it in
// the cache (evicting what the bound asks for first).
func (s *Store) pullLayer(ctx context.Context, ref Ref, f Fetcher, l v1.Descriptor, diffID string) error {
	d := l.Digest.String()
	if err := s.makeRoom(l.Size); err != nil {
		return err
	}
	b, rc, err := f.FetchImageBlob(ctx, ref.JobID, d, false)
	if err != nil {
		return err
	}
	defer rc.Close()
	if b.Size != l.Size {
		return fmt.Errorf("%w: the authority says %d bytes, the manifest %d", errdefs.ErrDataLoss, b.Size, l.Size)
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), "layer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "fs")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return err
	}
	v := &verifier{r: io.LimitReader(rc, l.Size+1), h: sha256.New()}
	// No layer may unpack to more than the whole cache holds.
	st, err := ocilayer.Unpack(ctx, v, string(l.MediaType), tree, ocilayer.Options{UIDBase: s.cfg.UIDBase, IDRange: s.cfg.IDRange, MaxTotalBytes: s.cfg.MaxBytes})
	if err != nil {
		// Tampered bytes often fail the decompressor first: say what
		// they are when the digest shows it.
		if ctx.Err() == nil {
			io.Copy(io.Discard, v)
		}
		switch got := digest.FromSum(v.h.Sum(nil)); {
		case v.n > l.Size:
			return fmt.Errorf("%w: more than the manifest's %d bytes arrived", errdefs.ErrDataLoss, l.Size)
		case ctx.Err() == nil && v.n == l.Size && got != d:
			return fmt.Errorf("%w: what arrived hashes to %s", errdefs.ErrDataLoss, got)
		}
		return fmt.Errorf("unpack: %w", err)
	}
	// The unpacker may stop at the tar's end: the rest must still be
	// read, and hashed.
	if _, err := io.Copy(io.Discard, v); err != nil {
		return err
	}
	if v.n != l.Size {
		return fmt.Errorf("%w: %d bytes arrived, the manifest says %d", errdefs.ErrDataLoss, v.n, l.Size)
	}
	if got := digest.FromSum(v.h.Sum(nil)); got != d {
		return fmt.Errorf("%w: what arrived hashes to %s", errdefs.ErrDataLoss, got)
	}
	if st.DiffID != diffID {
		return fmt.Errorf("%w: the uncompressed layer hashes to %s, the image's config says %s", errdefs.ErrDataLoss, st.DiffID, diffID)
	}
	// The tree's root is the image's /: searchable by the sandboxes.
	if err := os.Chmod(tree, 0o755); err != nil {
		return err
	}
	// On disk before the index says the layer is there and checked: after
	// a power loss a recorded layer is whole.
	if err := atomicfile.SyncFS(tree); err != nil {
		return err
	}
	if err := os.Rename(tree, s.LayerPath(d)); err != nil {
		return err
	}
	e := &layer{Digest: d, DiffID: diffID, MediaType: string(l.MediaType), Size: l.Size,
		Unpacked: st.Bytes + int64(st.Entries)*entryBytes, LastUsed: s.cfg.Now(), Tenants: []string{ref.Tenant}}
	s.mu.Lock()
	s.idx.Layers[d] = e
	err = s.saveLocked()
	s.mu.Unlock()
	s.count(1, l.Size, 0)
	if len(st.Dropped) > 0 {
		s.log.Info("image layer unpacked with changes", "layer", d, "changes", len(st.Dropped), "first", st.Dropped[0])
	}
	return err
}

// stack is the layer directories of digests (bottom first) as an overlay
// stacks them: a layer listed twice (buildkit's empty layer often is) is
// kept at its topmost place only, which is the same filesystem.
func (s *Store) stack(digests []string) []string {
	seen := map[string]bool{}
	var out []string
	for i := len(digests) - 1; i >= 0; i-- {
		if !seen[digests[i]] {
			seen[digests[i]] = true
			out = append(out, s.LayerPath(digests[i]))
		}
	}
	slices.Reverse(out)
	return out
}

// verifier hashes and counts what is read through it.
type verifier struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	return n, err
}

// makeRoom evicts unused layers, least recently used first, until incoming
// more bytes fit the bound (an unpacked layer is counted at twice its
// compressed size until it is there). What no eviction can free is
// allowed over the bound: running jobs hold it.
func (s *Store) makeRoom(incoming int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	used := s.sizeLocked()
	if used+2*incoming <= s.cfg.MaxBytes {
		return nil
	}
	var cands []*layer
	for _, l := range s.idx.Layers {
		if l.inUse == 0 {
			cands = append(cands, l)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].LastUsed.Before(cands[j].LastUsed) })
	for _, l := range cands {
		if used+2*incoming <= s.cfg.MaxBytes {
			break
		}
		if err := s.removeLayerLocked(l.Digest); err != nil {
			return err
		}
		used -= l.Unpacked
		s.stats.Evictions++
		s.m.evicted()
	}
	return s.saveLocked()
}

// removeLayerLocked deletes a layer and every image that names it.
func (s *Store) removeLayerLocked(d string) error {
	for id, img := range s.idx.Images {
		if slices.Contains(img.Layers, d) {
			s.dropImageLocked(id)
		}
	}
	delete(s.idx.Layers, d)
	// Renamed away first, so a crash mid-removal leaves no half tree
	// under a digest's name.
	gone := filepath.Join(s.tmpDir(), "evicted-"+strings.TrimPrefix(d, "sha256:"))
	if err := os.Rename(s.LayerPath(d), gone); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("images: evict %s: %w", d, err)
	}
	return os.RemoveAll(gone)
}

func (s *Store) dropImageLocked(id string) {
	img := s.idx.Images[id]
	delete(s.idx.Images, id)
	if img == nil {
		return
	}
	for _, b := range []string{img.Digest, img.Config} {
		shared := false
		for _, o := range s.idx.Images {
			if o.Digest == b || o.Config == b {
				shared = true
			}
		}
		if !shared {
			os.Remove(s.blobPath(b))
		}
	}
}

func (s *Store) sizeLocked() int64 {
	var n int64
	for _, l := range s.idx.Layers {
		n += l.Unpacked
	}
	return n
}

func (s *Store) count(pulls, bytes, hits int64) {
	s.mu.Lock()
	s.stats.Pulls += pulls
	s.stats.PulledBytes += bytes
	s.stats.Hits += hits
	s.mu.Unlock()
	s.m.counted(pulls, bytes, hits)
}

// Stats describe the whole cache.
func (s *Store) Stats() imagecache.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked()
}

func (s *Store) statsLocked() imagecache.Stats {
	st := s.stats
	st.Size, st.MaxSize, st.Layers, st.Images = s.sizeLocked(), s.cfg.MaxBytes, len(s.idx.Layers), len(s.idx.Images)
	return st
}

// Digests are the manifest digests of the images the cache holds, for
// every tenant, sorted, at most limit of them.
func (s *Store) Digests(limit int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, img := range s.idx.Images {
		out = append(out, img.Digest)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	return out[:min(len(out), limit)]
}

// List is tenant's images (only digest's, with its layers, when set),
// most recently used first, and the cache's stats.
func (s *Store) List(tenant, want string) imagecache.List {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := imagecache.List{Stats: s.statsLocked()}
	for _, img := range s.idx.Images {
		u := img.Tenants[tenant]
		if u == nil || (want != "" && img.Digest != want) {
			continue
		}
		out.Images = append(out.Images, s.infoLocked(img, u, want != ""))
	}
	sort.Slice(out.Images, func(i, j int) bool { return out.Images[i].LastUsed.After(out.Images[j].LastUsed) })
	return out
}

func (s *Store) infoLocked(img *image, u *tenantUse, layers bool) imagecache.Image {
	info := imagecache.Image{Reference: img.Reference, Digest: img.Digest, LastUsed: u.LastUsed, Jobs: slices.Clone(u.Jobs), InUse: u.inUse}
	for _, d := range img.Layers {
		l := s.idx.Layers[d]
		if l == nil {
			continue
		}
		info.Size += l.Unpacked
		if layers {
			info.Layers = append(info.Layers, imagecache.Layer{Digest: l.Digest, DiffID: l.DiffID, MediaType: l.MediaType, Compressed: l.Size, Unpacked: l.Unpacked})
		}
	}
	return info
}

// Prune drops tenant's hold on its images (digest's only, when set) that
// none of its jobs runs on, and deletes the images and layers no tenant
// holds and no job uses.
func (s *Store) Prune(tenant, want string) (imagecache.Pruned, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out imagecache.Pruned
	for id, img := range s.idx.Images {
		u := img.Tenants[tenant]
		if u == nil || (want != "" && img.Digest != want) {
			continue
		}
		if u.inUse > 0 {
			out.InUse = append(out.InUse, img.Digest)
			continue
		}
		out.Images = append(out.Images, s.infoLocked(img, u, false))
		delete(img.Tenants, tenant)
		if len(img.Tenants) == 0 {
			s.dropImageLocked(id)
		}
	}
	// The tenant keeps its proof of access to the layers of the images
	// it still holds: their next job asks the registry nothing.
	kept := map[string]bool{}
	for _, img := range s.idx.Images {
		if img.Tenants[tenant] != nil {
			for _, d := range img.Layers {
				kept[d] = true
			}
		}
	}
	for d, l := range s.idx.Layers {
		if !kept[d] {
			l.Tenants = slices.DeleteFunc(l.Tenants, func(t string) bool { return t == tenant })
		}
	}
	for d, l := range s.idx.Layers {
		if l.inUse > 0 || s.layerNamedLocked(d) {
			continue
		}
		if err := s.removeLayerLocked(d); err != nil {
			return out, err
		}
		out.Freed += l.Unpacked
	}
	sort.Strings(out.InUse)
	if err := s.sweepBlobsLocked(); err != nil {
		return out, err
	}
	return out, s.saveLocked()
}

// sweepBlobsLocked deletes the manifests and configs no cached image
// names: those of failed pulls and of dropped images.
func (s *Store) sweepBlobsLocked() error {
	named := map[string]bool{}
	for _, img := range s.idx.Images {
		named[digest.Hex(img.Digest)], named[digest.Hex(img.Config)] = true, true
	}
	for d := range s.pulls {
		named[digest.Hex(d)] = true // being fetched now
	}
	ents, err := os.ReadDir(s.blobDir())
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	for _, e := range ents {
		if !named[e.Name()] {
			if err := os.Remove(filepath.Join(s.blobDir(), e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("images: %w", err)
			}
		}
	}
	return nil
}

func (s *Store) layerNamedLocked(d string) bool {
	for _, img := range s.idx.Images {
		if slices.Contains(img.Layers, d) {
			return true
		}
	}
	return false
}
