// Package cache owns the executor's named caches: directories a tenant's
// policy names (a Go build cache, an npm cache) that survive from one run
// of a repository to the next, kept per (tenant, repository, name) and
// never shared across tenants or repositories.
//
// A cache is a series of generations, each a complete directory tree that
// is never changed once made. A run mounts the current generation as the
// read-only lower layer of an overlay whose upper layer lies in its own
// scratch (package sandbox), so its writes count against its disk limit
// and no run sees another's writes while it runs. When a run exits, its
// upper layer is merged into a new generation (Commit): one committer per
// cache at a time, on top of the generation current at that moment, with
// whiteouts and opaque directories applied, and everything the job made
// rewritten as the executor's own: regular files, directories and
// symlinks only, modes without setuid, setgid or sticky bits, owners
// inside the sandbox's id range, no extended attributes. Device nodes,
// FIFOs and sockets are left out. Then the new generation is made current
// by one rename of the cache's record, and generations no run uses are
// removed. A cache past its max size after a commit is wiped whole.
//
// Only the executor's runs package and its API adapter import it; it
// imports nothing of gRPC.
package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/errdefs"
)

// ErrRefused wraps a commit refused for what the job's layer holds; its
// message names only paths inside the cache.
var ErrRefused = errors.New("refused")

// EntryBytes is what each entry (file, directory or link) of a cache
// counts on top of its bytes: so a million empty files are not free.
const EntryBytes = 4096

// Key names one cache.
type Key struct {
	Tenant, Repository, Name string
}

func (k Key) String() string { return k.Tenant + "/" + k.Repository + "/" + k.Name }

// Config configures a Store.
type Config struct {
	// Dir holds every cache; it is created 0700. It must be on one file
	// system (generations are built beside each other and renamed).
	Dir string
	// IDBase and IDRange are the host ids mapped into the sandboxes: a
	// committed entry keeps its owner and group when they lie in
	// [IDBase, IDBase+IDRange) and gets IDBase (the sandbox's root)
	// otherwise.
	IDBase, IDRange uint32
	Now             func() time.Time
	Logger          *slog.Logger
}

// Store keeps the caches under Config.Dir.
type Store struct {
	cfg Config
	// mu guards every cache's record and references: short steps only.
	mu sync.Mutex
	// commits holds one lock per cache, held for a whole commit or
	// clear: one writer at a time.
	commits map[string]*sync.Mutex
}

// meta is a cache's record, meta.json in its directory.
type meta struct {
	Tenant     string    `json:"tenant"`
	Repository string    `json:"repository"`
	Name       string    `json:"name"`
	Gen        int64     `json:"generation"`
	Size       int64     `json:"size"`
	LastUsed   time.Time `json:"last_used"`
	// Cleared hides a cache Clear wiped from List until a run uses it
	// again.
	Cleared bool `json:"cleared,omitempty"`
}

// Info describes one cache.
type Info struct {
	Key
	Size     int64
	LastUsed time.Time
}

// Lease is one run's hold on a cache generation: its lower layer.
type Lease struct {
	Key   Key
	JobID string
	// Lower is the generation's directory, never to be written.
	Lower string
	// Gen is the generation, and SizeBefore its size.
	Gen        int64
	SizeBefore int64
}

// Outcome is what a commit did.
type Outcome struct {
	// SizeAfter is the cache's size after the commit (0 when evicted).
	SizeAfter int64
	// Evicted says the new generation was past the max size and the cache
	// was wiped instead.
	Evicted bool
	// Dropped counts the job's entries left out: device nodes, FIFOs,
	// sockets.
	Dropped int
}

// New makes a Store.
func New(cfg Config) (*Store, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("%w: cache dir %q: must be an absolute path", errdefs.ErrInvalidArgument, cfg.Dir)
	}
	if strings.ContainsAny(cfg.Dir, ",:\\\n") {
		return nil, fmt.Errorf("%w: cache dir %q: must not contain ',', ':', '\\' or a newline (it is named in overlay mount options)", errdefs.ErrInvalidArgument, cfg.Dir)
	}
	if cfg.IDRange == 0 {
		return nil, fmt.Errorf("%w: cache id range: must be positive", errdefs.ErrInvalidArgument)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, commits: map[string]*sync.Mutex{}}, nil
}

// dirOf is k's directory: a hash of the key, so no tenant, repository or
// cache name ever becomes a path, and two keys never share one.
func (s *Store) dirOf(k Key) string {
	sum := sha256.Sum256([]byte("airlock.cache.v1\x00" + k.Tenant + "\x00" + k.Repository + "\x00" + k.Name))
	return filepath.Join(s.cfg.Dir, hex.EncodeToString(sum[:16]))
}

func genDir(dir string, gen int64) string { return filepath.Join(dir, "g"+strconv.FormatInt(gen, 10)) }

func refPath(dir, jobID string) string { return filepath.Join(dir, "refs", jobID) }

func (s *Store) commitLock(dir string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.commits[dir]
	if l == nil {
		l = &sync.Mutex{}
		s.commits[dir] = l
	}
	return l
}

func readMeta(dir string) (meta, error) {
	var m meta
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

func writeMeta(dir string, m meta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "meta.json"), b, 0o600, atomicfile.Durable)
}

// Open gives job jobID the current generation of cache k, making an empty
// cache on first use. The same job again (a session made again after an
// executor restart) gets the generation it had.
func (s *Store) Open(k Key, jobID string) (Lease, error) {
	if jobID == "" || strings.ContainsAny(jobID, "/\x00") || jobID == "." || jobID == ".." {
		return Lease{}, fmt.Errorf("%w: cache: job id %q", errdefs.ErrInvalidArgument, jobID)
	}
	dir := s.dirOf(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := readMeta(dir)
	if errors.Is(err, fs.ErrNotExist) {
		m = meta{Tenant: k.Tenant, Repository: k.Repository, Name: k.Name}
		if err := os.MkdirAll(filepath.Join(dir, "refs"), 0o700); err != nil {
			return Lease{}, err
		}
		if err := s.emptyGen(genDir(dir, 0)); err != nil {
			return Lease{}, err
		}
	} else if err != nil {
		return Lease{}, fmt.Errorf("cache %s: %w", k, err)
	}
	gen := m.Gen
	if b, err := os.ReadFile(refPath(dir, jobID)); err == nil {
		if g, err := strconv.ParseInt(string(b), 10, 64); err == nil {
			if _, err := os.Stat(genDir(dir, g)); err == nil {
				gen = g
			}
		}
	}
	if err := atomicfile.Write(refPath(dir, jobID), []byte(strconv.FormatInt(gen, 10)), 0o600, atomicfile.Durable); err != nil {
		return Lease{}, err
	}
	size := m.Size
	if gen != m.Gen {
		// A kept session's older generation: its size is not on record.
		if size, err = Size(genDir(dir, gen)); err != nil {
			return Lease{}, err
		}
	}
	m.LastUsed, m.Cleared = s.cfg.Now(), false
	if err := writeMeta(dir, m); err != nil {
		return Lease{}, err
	}
	return Lease{Key: k, JobID: jobID, Lower: genDir(dir, gen), Gen: gen, SizeBefore: size}, nil
}

// emptyGen makes an empty generation directory, owned by the sandbox's
// root so a job can write below the mount point.
func (s *Store) emptyGen(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	return os.Lchown(dir, int(s.cfg.IDBase), int(s.cfg.IDBase))
}

// Release drops l's hold on its generation and removes the generations no
// run holds any more. Call it once the run's sandbox is gone, committed or
// not.
func (s *Store) Release(l Lease) error {
	dir := s.dirOf(l.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(refPath(dir, l.JobID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return s.collectLocked(dir, false)
}

// collectLocked removes dir's generations that are neither current nor
// held, and, at start-up (halfBuilt), the commits a previous process left
// half built; while the executor runs, a commit in progress holds only
// its cache's commit lock, so its directory is not touched. Called with
// s.mu held.
func (s *Store) collectLocked(dir string, halfBuilt bool) error {
	m, err := readMeta(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	held := map[string]bool{genDir(dir, m.Gen): true}
	refs, _ := os.ReadDir(filepath.Join(dir, "refs"))
	for _, r := range refs {
		if b, err := os.ReadFile(filepath.Join(dir, "refs", r.Name())); err == nil {
			if g, err := strconv.ParseInt(string(b), 10, 64); err == nil {
				held[genDir(dir, g)] = true
			}
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		gen := strings.HasPrefix(e.Name(), "g") && e.IsDir()
		if (gen && !held[p]) || (halfBuilt && strings.HasPrefix(e.Name(), "tmp-")) {
			errs = append(errs, os.RemoveAll(p))
		}
	}
	return errors.Join(errs...)
}

// Commit merges upper, the overlay upper layer of l's run, into a new
// generation of l's cache on top of the current one, makes it current
// and returns what it did. If the new generation is above maxSize bytes,
// the cache is wiped instead (Outcome.Evicted). Commit does not release
// l. upper must not change while Commit runs: the run has ended.
func (s *Store) Commit(l Lease, upper string, maxSize int64) (Outcome, error) {
	began := time.Now()
	dir := s.dirOf(l.Key)
	lock := s.commitLock(dir)
	lock.Lock()
	defer lock.Unlock()
	s.mu.Lock()
	m, err := readMeta(dir)
	s.mu.Unlock()
	if err != nil {
		return Outcome{}, fmt.Errorf("cache %s: %w", l.Key, err)
	}
	tmp, err := os.MkdirTemp(dir, "tmp-")
	if err != nil {
		return Outcome{}, err
	}
	defer os.RemoveAll(tmp) // gone once renamed
	next := filepath.Join(tmp, "tree")
	// Everything the layer keeps lands in the new generation, so a layer
	// whose kept entries alone pass maxSize is evicted before a byte is
	// copied: counted at apparent size, a sparse file of 10 TiB that
	// cost the job's scratch nothing would otherwise be written out whole
	// on the executor's disk before the size check.
	var out Outcome
	size, err := keptSize(upper)
	if err != nil {
		return Outcome{}, fmt.Errorf("cache %s: commit: %w", l.Key, err)
	}
	if size <= maxSize {
		if err := linkTree(genDir(dir, m.Gen), next); err != nil {
			return Outcome{}, fmt.Errorf("cache %s: copy generation %d: %w", l.Key, m.Gen, err)
		}
		if out.Dropped, err = s.apply(upper, next); err != nil {
			if errors.Is(err, ErrRefused) {
				return Outcome{}, err
			}
			return Outcome{}, fmt.Errorf("cache %s: commit: %w", l.Key, err)
		}
		if size, err = Size(next); err != nil {
			return Outcome{}, err
		}
	}
	if size > maxSize {
		// Wiped whole: the next run starts cold, never from a cache cut
		// at some arbitrary file.
		if err := os.RemoveAll(next); err != nil {
			return Outcome{}, err
		}
		if err := s.emptyGen(next); err != nil {
			return Outcome{}, err
		}
		s.cfg.Logger.Info("cache evicted: over its max size", "cache", l.Key.String(), "job_id", l.JobID, "size", size, "max_size", maxSize)
		out.Evicted, size = true, 0
	}
	out.SizeAfter = size
	s.mu.Lock()
	defer s.mu.Unlock()
	m.Gen++
	if err := os.Rename(next, genDir(dir, m.Gen)); err != nil {
		return Outcome{}, err
	}
	m.Size, m.LastUsed, m.Cleared = size, s.cfg.Now(), false
	if err := writeMeta(dir, m); err != nil {
		return Outcome{}, err
	}
	if err := s.collectLocked(dir, false); err != nil {
		s.cfg.Logger.Warn("cache: remove old generations", "cache", l.Key.String(), "error", err)
	}
	s.cfg.Logger.Info("cache committed", "cache", l.Key.String(), "job_id", l.JobID, "generation", m.Gen, "size", size,
		"evicted", out.Evicted, "dropped", out.Dropped, "took", time.Since(began))
	return out, nil
}

// List returns tenant's caches, by repository and name: every one a run
// used, but those cleared since.
func (s *Store) List(tenant string) ([]Info, error) {
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, e := range ents {
		m, err := readMeta(filepath.Join(s.cfg.Dir, e.Name()))
		if err != nil || m.Tenant != tenant || m.Cleared {
			continue
		}
		out = append(out, Info{Key: Key{Tenant: m.Tenant, Repository: m.Repository, Name: m.Name}, Size: m.Size, LastUsed: m.LastUsed})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Repository != out[j].Repository {
			return out[i].Repository < out[j].Repository
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Clear wipes tenant's caches of repository (every one if "") named name
// (every name if ""), and returns them as they were. A run holding one
// keeps its generation until it ends; its commit then lands on the empty
// cache.
func (s *Store) Clear(tenant, repository, name string) ([]Info, error) {
	all, err := s.List(tenant)
	if err != nil {
		return nil, err
	}
	var out []Info
	var errs []error
	for _, c := range all {
		if (repository != "" && c.Repository != repository) || (name != "" && c.Name != name) {
			continue
		}
		if err := s.clear(c.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

func (s *Store) clear(k Key) error {
	dir := s.dirOf(k)
	lock := s.commitLock(dir)
	lock.Lock()
	defer lock.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := readMeta(dir)
	if err != nil {
		return err
	}
	m.Gen++
	if err := s.emptyGen(genDir(dir, m.Gen)); err != nil {
		return err
	}
	m.Size, m.Cleared = 0, true
	if err := writeMeta(dir, m); err != nil {
		return err
	}
	s.cfg.Logger.Info("cache cleared", "cache", k.String())
	return s.collectLocked(dir, false)
}

// Recover drops, at start-up, the holds of jobs that no longer run (keep
// says which still do: sessions kept across a restart) and removes the
// generations and half-built commits nothing holds.
func (s *Store) Recover(keep func(jobID string) bool) error {
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(s.cfg.Dir, e.Name())
		refs, _ := os.ReadDir(filepath.Join(dir, "refs"))
		for _, r := range refs {
			if keep == nil || !keep(r.Name()) {
				errs = append(errs, os.Remove(filepath.Join(dir, "refs", r.Name())))
			}
		}
		errs = append(errs, s.collectLocked(dir, true))
	}
	return errors.Join(errs...)
}
