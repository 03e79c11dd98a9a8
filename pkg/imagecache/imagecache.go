// Package imagecache names what an executor's image cache reports: the
// images a tenant's jobs ran on, their layers, and the whole cache's size
// and counters. The executor's store fills them in; the authority passes
// them to the tenant's clients; each side converts them to and from its
// API. It imports nothing of gRPC.
package imagecache

import "time"

// Image is one cached image as one tenant sees it.
type Image struct {
	// Reference is "HOST/REPOSITORY@sha256:<hex>"; Digest the manifest's.
	Reference, Digest string
	// Size is the disk its layers take (blobs and unpacked trees).
	Size int64
	// LastUsed is when a job of the tenant last started on it.
	LastUsed time.Time
	// Jobs are the tenant's jobs that ran on it, most recent first.
	Jobs []string
	// InUse is how many of the tenant's jobs run on it now.
	InUse int
	// Layers, bottom first, when asked for.
	Layers []Layer
	// Executor names the executor holding it, in the authority's view of
	// a fleet (each executor keeps its own cache); "" at the executor.
	Executor string
}

// Layer is one cached layer.
type Layer struct {
	Digest, DiffID, MediaType string
	Compressed, Unpacked      int64
}

// Stats describe the whole cache.
type Stats struct {
	Size, MaxSize  int64
	Layers, Images int
	// Counters since the executor started.
	Pulls, PulledBytes, Hits, Evictions int64
}

// Add is s and o together: two executors' caches as one.
func (s Stats) Add(o Stats) Stats {
	return Stats{Size: s.Size + o.Size, MaxSize: s.MaxSize + o.MaxSize, Layers: s.Layers + o.Layers, Images: s.Images + o.Images,
		Pulls: s.Pulls + o.Pulls, PulledBytes: s.PulledBytes + o.PulledBytes, Hits: s.Hits + o.Hits, Evictions: s.Evictions + o.Evictions}
}

// List is a tenant's images and the cache's stats.
type List struct {
	Images []Image
	Stats  Stats
}

// Pruned is what a prune did.
type Pruned struct {
	// Images the tenant no longer holds.
	Images []Image
	// Freed is the bytes deleted from disk.
	Freed int64
	// InUse are the digests kept because a job of the tenant runs on them.
	InUse []string
}

// MaxJobs bounds Image.Jobs.
const MaxJobs = 20

// MaxLayers bounds an image's layers, as Docker's own bound does; the
// authority refuses more at submission and the executor at its pull.
const MaxLayers = 127
