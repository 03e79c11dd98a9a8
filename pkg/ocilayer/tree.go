package ocilayer

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Whiteout names (the OCI image spec's, after AUFS).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Extended attributes: the PAX records that carry them, and overlayfs's.
const (
	paxXattr          = "SCHILY.xattr."
	paxLibarchiveXatr = "LIBARCHIVE.xattr."
	opaqueXattr       = "trusted.overlay.opaque"
)

// tree is the layer being written beneath the directory fd root.
type tree struct {
	root  int
	opt   Options
	stats Stats
	// overRatio says whether written bytes pass the decompression ratio
	// against the compressed bytes read so far: a sparse entry's holes
	// are written as zeros the compressed stream never carried, so the
	// stream's own check cannot see them.
	overRatio func(written int64) bool
	// dirTimes are the directories' times, set once their contents are
	// written; dirOrder keeps the order they came in.
	dirTimes map[string][2]unix.Timespec
	dirOrder []string
}

func newTree(root int, opt Options) *tree {
	return &tree{root: root, opt: opt, dirTimes: map[string][2]unix.Timespec{}}
}

// initRoot gives the layer root what docker gives a layer directory
// (0755, owned by the namespace's root) until a "./" entry says otherwise.
func (t *tree) initRoot() error {
	if err := unix.Fchown(t.root, t.hostID(0), t.hostID(0)); err != nil {
		return err
	}
	return unix.Fchmod(t.root, 0o755)
}

// hostID is the host id for the layer's id: ids past the namespace's range
// become its "nobody".
func (t *tree) hostID(id int) int {
	if id < 0 || uint64(id) >= uint64(t.opt.IDRange) {
		id = int(t.opt.IDRange - 2)
	}
	return int(t.opt.UIDBase) + id
}

func (t *tree) drop(rel, format string, args ...any) {
	t.stats.DroppedTotal++
	if len(t.stats.Dropped) < maxDropped {
		t.stats.Dropped = append(t.stats.Dropped, rel+": "+fmt.Sprintf(format, args...))
	}
}

// apply writes one entry; its content, if any, is read from content.
func (t *tree) apply(hdr *tar.Header, content io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // PAX defaults for the entries after it, already applied by archive/tar
	}
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := splitName(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return t.whiteout(hdr, dir, base)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return hostile("only a directory may name the layer root")
		}
		return t.directory(hdr, t.root, ".", "")
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	case tar.TypeChar, tar.TypeBlock:
		return hostile("device node")
	default:
		return hostile("unsupported entry type %q", hdr.Typeflag)
	}
	if hdr.Typeflag == tar.TypeSymlink {
		if err := checkSymlink(rel, hdr.Linkname); err != nil {
			return err
		}
	}
	var target string
	if hdr.Typeflag == tar.TypeLink {
		if target, err = t.hardlinkTarget(rel, hdr.Linkname); err != nil {
			return err
		}
	}
	if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeGNUSparse {
		if err := t.checkSize(hdr.Size); err != nil {
			return err
		}
	}

	pfd, err := openParent(t.root, dir, true, t.hostID(0))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	keptDir, err := clearSlot(pfd, base, hdr.Typeflag == tar.TypeDir)
	if err != nil {
		return fmt.Errorf("clearing the way: %w", err)
	}
	if hdr.Typeflag != tar.TypeDir {
		delete(t.dirTimes, rel)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !keptDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return fmt.Errorf("mkdir: %w", err)
			}
		}
		return t.directory(hdr, pfd, base, rel)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		return t.finishNode(hdr, pfd, base, rel)
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("mkfifo: %w", err)
		}
		return t.finishNode(hdr, pfd, base, rel)
	case tar.TypeLink:
		return t.hardlink(target, hdr.Linkname, pfd, base)
	}
	return t.regular(hdr, content, pfd, base, rel)
}

func (t *tree) checkSize(size int64) error {
	if size > t.opt.MaxFileBytes {
		return overBound("file of %d bytes over the bound of %d", size, t.opt.MaxFileBytes)
	}
	if size > t.opt.MaxTotalBytes-t.stats.Bytes {
		return overBound("layer over the bound of %d bytes", t.opt.MaxTotalBytes)
	}
	return nil
}

// regular writes a file, never through what is at base (clearSlot removed
// it, and O_EXCL|O_NOFOLLOW refuses anything that appeared since).
func (t *tree) regular(hdr *tar.Header, content io.Reader, pfd int, base, rel string) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	n, err := io.Copy(f, &ratioReader{r: io.LimitReader(content, t.opt.MaxFileBytes+1), t: t})
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	if n > t.opt.MaxFileBytes || n > t.opt.MaxTotalBytes-t.stats.Bytes {
		return t.checkSize(n)
	}
	t.stats.Bytes += n
	if err := t.owner(hdr, fd, rel, false); err != nil {
		return err
	}
	t.xattrs(hdr, fd, rel)
	if err := f.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return setTimes(pfd, base, entryTimes(hdr))
}

// directory sets a directory's metadata; its times wait for finishDirs.
func (t *tree) directory(hdr *tar.Header, pfd int, base, rel string) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	defer unix.Close(fd)
	if err := t.owner(hdr, fd, rel, true); err != nil {
		return err
	}
	t.xattrs(hdr, fd, rel)
	if _, seen := t.dirTimes[rel]; !seen {
		t.dirOrder = append(t.dirOrder, rel)
	}
	t.dirTimes[rel] = entryTimes(hdr)
	return nil
}

// owner sets fd's owner and mode: setuid and setgid bits are dropped, and
// the sticky bit kept on directories only.
func (t *tree) owner(hdr *tar.Header, fd int, rel string, dir bool) error {
	if err := unix.Fchown(fd, t.hostID(hdr.Uid), t.hostID(hdr.Gid)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, t.mode(hdr, rel, dir)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

func (t *tree) mode(hdr *tar.Header, rel string, dir bool) uint32 {
	m := uint32(hdr.Mode) & 0o7777
	if m&unix.S_ISUID != 0 {
		t.drop(rel, "setuid bit dropped")
	}
	if m&unix.S_ISGID != 0 {
		t.drop(rel, "setgid bit dropped")
	}
	m &^= unix.S_ISUID | unix.S_ISGID
	if !dir && m&unix.S_ISVTX != 0 {
		t.drop(rel, "sticky bit dropped")
		m &^= unix.S_ISVTX
	}
	return m
}

// finishNode sets the owner, mode and times of a symlink or FIFO at base,
// which the caller has just made. Neither takes user.* xattrs.
func (t *tree) finishNode(hdr *tar.Header, pfd int, base, rel string) error {
	if err := unix.Fchownat(pfd, base, t.hostID(hdr.Uid), t.hostID(hdr.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if hdr.Typeflag == tar.TypeFifo {
		// base is the FIFO just made in a directory only this unpack writes.
		if err := unix.Fchmodat(pfd, base, t.mode(hdr, rel, false), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	for _, name := range xattrNames(hdr) {
		t.drop(rel, "xattr %s dropped (not a file or directory)", name)
	}
	return setTimes(pfd, base, entryTimes(hdr))
}

// hardlinkTarget checks a hardlink's target name, which must be another
// entry of this layer.
func (t *tree) hardlinkTarget(rel, linkname string) (string, error) {
	target, err := cleanName(linkname)
	if err != nil {
		return "", hostile("hardlink target %q: %v", linkname, err)
	}
	if target == "" || target == rel {
		return "", hostile("hardlink target %q: not another entry", linkname)
	}
	return target, nil
}

// hardlink links base in pfd to target, a regular file this layer already
// holds, reached without links.
func (t *tree) hardlink(target, linkname string, pfd int, base string) error {
	tdir, tbase := splitName(target)
	tfd, err := openParent(t.root, tdir, false, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return hostile("hardlink target %q: not in the layer", linkname)
		}
		return hostile("hardlink target %q: %v", linkname, err)
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return hostile("hardlink target %q: not in the layer", linkname)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return hostile("hardlink target %q: not a regular file", linkname)
	}
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return hostile("hardlink target %q: %v", linkname, err)
	}
	return nil
}

// whiteout converts an OCI whiteout to overlayfs's form.
func (t *tree) whiteout(hdr *tar.Header, dir, base string) error {
	if base == whiteoutOpaque {
		if dir == "" {
			t.drop(".", "opaque marker at the layer root ignored")
			return nil
		}
		pfd, err := openParent(t.root, dir, true, t.hostID(0))
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		fd, err := openBeneath(pfd, "", unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("open directory: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("marking %q opaque: %w", dir, err)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		t.drop(joinName(dir, base), "unknown whiteout marker ignored")
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return hostile("whiteout names no entry")
	}
	rel := joinName(dir, name)
	pfd, err := openParent(t.root, dir, true, t.hostID(0))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, err := clearSlot(pfd, name, false); err != nil {
		return fmt.Errorf("clearing the way: %w", err)
	}
	delete(t.dirTimes, rel)
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("whiteout device: %w", err)
	}
	if err := unix.Fchownat(pfd, name, t.hostID(0), t.hostID(0), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	return setTimes(pfd, name, entryTimes(hdr))
}

func joinName(dir, base string) string {
	if dir == "" {
		return base
	}
	return dir + "/" + base
}

// xattrNames are the extended attributes hdr carries, sorted.
func xattrNames(hdr *tar.Header) []string {
	var names []string
	for k := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattr); ok {
			names = append(names, name)
		} else if name, ok := strings.CutPrefix(k, paxLibarchiveXatr); ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// keptXattr reports whether an xattr a layer carries is kept: user.* only,
// and not user.overlay.*, which overlayfs mounted with userxattr reads as
// it reads trusted.overlay.* (redirects, opaque and metacopy markers).
func keptXattr(name string) bool {
	return strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, "user.overlay.")
}

// xattrs sets fd's kept extended attributes and records the others, and
// those the file system would not take.
func (t *tree) xattrs(hdr *tar.Header, fd int, rel string) {
	for _, name := range xattrNames(hdr) {
		value, ok := hdr.PAXRecords[paxXattr+name]
		if !ok || !keptXattr(name) {
			t.drop(rel, "xattr %s dropped", name)
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(value), 0); err != nil {
			t.drop(rel, "xattr %s not kept: %v", name, err)
		}
	}
}

// entryTimes are hdr's access and modification times for utimensat.
func entryTimes(hdr *tar.Header) [2]unix.Timespec {
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	return [2]unix.Timespec{timespec(atime), timespec(hdr.ModTime)}
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{}
	}
	return unix.NsecToTimespec(t.UnixNano())
}

func setTimes(pfd int, base string, ts [2]unix.Timespec) error {
	if err := unix.UtimesNanoAt(pfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times: %w", err)
	}
	return nil
}

// finishDirs sets the directories' times, now that nothing more is
// written in them. A directory since replaced or removed is skipped.
func (t *tree) finishDirs() error {
	for _, rel := range t.dirOrder {
		ts, ok := t.dirTimes[rel]
		if !ok {
			continue
		}
		dir, base := splitName(rel)
		if rel == "" {
			base = "."
		}
		pfd, err := openParent(t.root, dir, false, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = setTimes(pfd, base, ts)
		} else {
			err = nil
		}
		unix.Close(pfd)
		if err != nil {
			return &EntryError{rel, err}
		}
	}
	return nil
}

// ratioReader fails once what the tree has written, this file's bytes so
// far included, passes the decompression ratio.
type ratioReader struct {
	r io.Reader
	t *tree
	n int64
}

func (r *ratioReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.n += int64(n)
	if written := r.t.stats.Bytes + r.n; written > ratioGrace && r.t.overRatio != nil && r.t.overRatio(written) {
		return n, overBound("decompression ratio over %d (a sparse file's holes count)", r.t.opt.MaxRatio)
	}
	return n, err
}
