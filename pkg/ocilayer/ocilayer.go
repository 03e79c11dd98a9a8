// Package ocilayer unpacks one OCI or Docker image layer into an empty host
// directory that becomes a read-only overlayfs lower layer. The executor's
// image store is its caller; it imports no grpc or proto.
//
// Threat model: the layer is hostile. Its tar stream may try to write
// outside the directory (absolute or ".." names, a symlink planted by an
// earlier entry and then written through, a hardlink to a host file), to
// plant what the kernel honours (device nodes, setuid binaries, file
// capabilities, trusted.overlay.* xattrs that make overlayfs redirect to or
// hide other layers), or to exhaust the host (decompression bombs, huge or
// countless entries). Every write is made relative to a directory fd opened
// with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS),
// never by following a link; anything refused fails the whole unpack with
// an error naming the entry, and the caller discards the directory.
//
// Symlink targets are not followed here, but they are read lexically: an
// absolute target resolves inside the container's root, so it is kept; a
// relative target that climbs above the layer root from the link's own
// directory ("a/b -> ../../../etc/shadow") is refused, so no host-side tool
// that follows a link inside the layer can be led out of it.
//
// Whiteouts are converted to overlayfs's own format: "DIR/.wh.NAME" becomes
// a 0:0 character device DIR/NAME and "DIR/.wh..wh..opq" sets
// trusted.overlay.opaque="y" on DIR, so unpacked layers stack as overlayfs
// lower directories. It needs Linux 5.6 or later (openat2) and, for
// whiteouts, CAP_MKNOD and CAP_SYS_ADMIN (trusted.* xattrs) on the host.
package ocilayer

import (
	"archive/tar"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// Layer media types: the OCI ones (and their nondistributable variants)
// and Docker's.
const (
	MediaTypeOCILayer                     = "application/vnd.oci.image.layer.v1.tar"
	MediaTypeOCILayerGzip                 = "application/vnd.oci.image.layer.v1.tar+gzip"
	MediaTypeOCILayerZstd                 = "application/vnd.oci.image.layer.v1.tar+zstd"
	MediaTypeOCINondistributableLayer     = "application/vnd.oci.image.layer.nondistributable.v1.tar"
	MediaTypeOCINondistributableLayerGzip = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
	MediaTypeOCINondistributableLayerZstd = "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
	MediaTypeDockerLayer                  = "application/vnd.docker.image.rootfs.diff.tar"
	MediaTypeDockerLayerGzip              = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	MediaTypeDockerForeignLayerGzip       = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
)

// Defaults for the zero values of Options.
const (
	DefaultIDRange       = 65536
	DefaultMaxEntries    = 1 << 20
	DefaultMaxFileBytes  = 8 << 30
	DefaultMaxTotalBytes = 32 << 30
	DefaultMaxRatio      = 200
	// ratioGrace is how much a layer decompresses to before its ratio is
	// checked: small layers of zeros are legitimately very compressible.
	ratioGrace = 1 << 20
	// maxDropped is how many drops Stats.Dropped lists one by one.
	maxDropped = 100
)

// Options bound and shape one unpack.
type Options struct {
	// UIDBase is added to every uid and gid in the layer: the host ids the
	// sandbox's user namespace maps from 0 (ids >= IDRange become
	// IDRange-2, "nobody").
	UIDBase uint32
	// IDRange is how many ids the user namespace maps (DefaultIDRange when 0).
	IDRange uint32
	// MaxEntries bounds the tar entries (DefaultMaxEntries when 0).
	MaxEntries int
	// MaxFileBytes bounds one regular file (DefaultMaxFileBytes when 0).
	MaxFileBytes int64
	// MaxTotalBytes bounds the sum of regular file sizes (DefaultMaxTotalBytes when 0).
	MaxTotalBytes int64
	// MaxRatio bounds uncompressed/compressed bytes read, checked once the
	// uncompressed stream passes 1 MiB (DefaultMaxRatio when 0).
	MaxRatio int64
}

// Stats describe one finished unpack.
type Stats struct {
	// DiffID is "sha256:<hex>" of the uncompressed tar stream, trailing
	// padding included: the image config's rootfs.diff_ids entry.
	DiffID string
	// Entries counts the tar entries read.
	Entries int
	// Bytes is the sum of regular file sizes written.
	Bytes int64
	// Dropped lists the first 100 things changed on the way in
	// ("usr/bin/passwd: setuid bit dropped"); DroppedTotal counts them all.
	Dropped      []string
	DroppedTotal int
}

// EntryError is a refusal or failure of one layer entry; Path is the
// entry's name as the layer spells it.
type EntryError struct {
	Path string
	Err  error
}

func (e *EntryError) Error() string { return fmt.Sprintf("layer entry %q: %v", e.Path, e.Err) }
func (e *EntryError) Unwrap() error { return e.Err }

// refusal is a reason the layer is refused; it wraps its errdefs kind
// without spelling it, so messages read "layer entry "x": path leaves the layer".
type refusal struct {
	kind error
	msg  string
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.kind }

// hostile refuses what no well-formed layer carries.
func hostile(format string, args ...any) error {
	return &refusal{errdefs.ErrInvalidArgument, fmt.Sprintf(format, args...)}
}

// overBound refuses what passes one of the Options' bounds.
func overBound(format string, args ...any) error {
	return &refusal{errdefs.ErrResourceExhausted, fmt.Sprintf(format, args...)}
}

func (o Options) withDefaults() (Options, error) {
	if o.IDRange == 0 {
		o.IDRange = DefaultIDRange
	}
	if o.IDRange < 2 {
		return o, fmt.Errorf("%w: ocilayer: IDRange %d leaves no room for nobody", errdefs.ErrInvalidArgument, o.IDRange)
	}
	if uint64(o.UIDBase)+uint64(o.IDRange) > 1<<32 {
		return o, fmt.Errorf("%w: ocilayer: UIDBase %d + IDRange %d passes the last id", errdefs.ErrInvalidArgument, o.UIDBase, o.IDRange)
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.MaxTotalBytes <= 0 {
		o.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if o.MaxRatio <= 0 {
		o.MaxRatio = DefaultMaxRatio
	}
	return o, nil
}

// Unpack reads the layer r of mediaType into dst, an existing empty
// directory, which becomes the layer root: 0755 and owned by UIDBase
// unless the layer's "./" entry says otherwise. On error dst holds a
// partial tree the caller removes; the error names the offending entry
// (an *EntryError) and wraps errdefs.ErrInvalidArgument for a malformed or
// hostile layer, errdefs.ErrResourceExhausted for one past a bound.
func Unpack(ctx context.Context, r io.Reader, mediaType, dst string, opt Options) (Stats, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return Stats{}, err
	}
	comp, err := compressionOf(mediaType)
	if err != nil {
		return Stats{}, err
	}
	root, err := openEmptyDir(dst)
	if err != nil {
		return Stats{}, err
	}
	defer root.Close()
	s, err := newStream(r, comp, opt.MaxRatio)
	if err != nil {
		return Stats{}, err
	}
	defer s.Close()

	t := newTree(int(root.Fd()), opt)
	t.overRatio = s.past
	if err := t.initRoot(); err != nil {
		return Stats{}, fmt.Errorf("ocilayer: %s: %w", dst, err)
	}
	tr := tar.NewReader(s)
	last := ""
	for {
		if err := ctx.Err(); err != nil {
			return t.stats, fmt.Errorf("layer: stopped after %d entries: %w", t.stats.Entries, err)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			err = s.cause(fmt.Errorf("reading the next tar header: %w", err))
			if last == "" {
				return t.stats, fmt.Errorf("layer: %w", err)
			}
			return t.stats, &EntryError{last, fmt.Errorf("after this entry: %w", err)}
		}
		last = hdr.Name
		t.stats.Entries++
		if t.stats.Entries > opt.MaxEntries {
			return t.stats, &EntryError{hdr.Name, overBound("more than %d entries", opt.MaxEntries)}
		}
		if err := t.apply(hdr, tr); err != nil {
			return t.stats, &EntryError{hdr.Name, s.cause(err)}
		}
	}
	// The tar end may be followed by padding archive/tar does not read; the
	// diff ID covers it, and the decompressor's checksum is checked at EOF.
	// It counts against MaxTotalBytes, as file contents do.
	room := opt.MaxTotalBytes - t.stats.Bytes
	n, err := io.Copy(io.Discard, io.LimitReader(s, room+1))
	if err != nil {
		return t.stats, fmt.Errorf("layer: after the tar end: %w", s.cause(err))
	}
	if n > room {
		return t.stats, fmt.Errorf("layer: after the tar end: %w", overBound("layer over the bound of %d bytes", opt.MaxTotalBytes))
	}
	if err := t.finishDirs(); err != nil {
		return t.stats, err
	}
	t.stats.DiffID = "sha256:" + hex.EncodeToString(s.hash.Sum(nil))
	return t.stats, nil
}

// openEmptyDir opens dst, which must be an empty directory (not a link to one).
func openEmptyDir(dst string) (*os.File, error) {
	fd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: ocilayer: destination %s: %v", errdefs.ErrInvalidArgument, dst, err)
	}
	f := os.NewFile(uintptr(fd), dst)
	names, err := f.Readdirnames(1)
	if len(names) > 0 || (err != nil && !errors.Is(err, io.EOF)) {
		f.Close()
		if err == nil {
			err = errors.New("not empty")
		}
		return nil, fmt.Errorf("%w: ocilayer: destination %s: %v", errdefs.ErrInvalidArgument, dst, err)
	}
	return f, nil
}
