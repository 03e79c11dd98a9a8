package sandbox

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// The files API reads and writes a running sandbox's /work and /out from
// the host, as the job sees them, and never anything else: a path is
// resolved by the kernel beneath the directory it names (openat2 with
// RESOLVE_BENEATH), so no "..", absolute symlink or symlink that climbs out
// leads anywhere but into that directory, and no mount inside it is
// crossed. Only regular files are read; what a job plants (a FIFO, a
// socket) is refused, never opened for reading in a way that could block.

// FileInfo is one entry of a listing.
type FileInfo struct {
	// Path is the entry's path as the job sees it, e.g. /work/src/a.go.
	Path string
	// Type is "file", "dir", "symlink" or "other".
	Type    string
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
	// Target is a symlink's target, as stored (never followed).
	Target string
}

// resolveHow is how every path of the files API is resolved.
var resolveHow = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// splitPath maps a path as the job sees it to the host directory it lies
// in and the path relative to it ("." for the directory itself).
func (s *Sandbox) splitPath(field, p string) (root, rel string, err error) {
	if !utf8.ValidString(p) {
		// Only a caller inside the executor can get here (a proto string
		// is UTF-8), but the record and review of the path must be text.
		return "", "", invalid("%s %q: not valid UTF-8", field, p)
	}
	if p == "" || !path.IsAbs(p) || path.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
		return "", "", invalid("%s %q: must be a clean absolute path under /work or /out", field, p)
	}
	if err := checkNameLengths(field, p); err != nil {
		return "", "", err
	}
	for _, m := range []struct{ prefix, dir string }{{"/work", s.workDir}, {"/out", s.OutDir()}} {
		if p == m.prefix {
			return m.dir, ".", nil
		}
		if rest, ok := strings.CutPrefix(p, m.prefix+"/"); ok {
			return m.dir, rest, nil
		}
	}
	return "", "", fmt.Errorf("%w: %s %q: only /work and /out can be read or written", errdefs.ErrPermissionDenied, field, p)
}

// checkNameLengths refuses, before anything is opened or written, a path
// the kernel would refuse as too long.
func checkNameLengths(field, p string) error {
	if len(p) >= unix.PathMax {
		return nameTooLong(field, p)
	}
	for _, name := range strings.Split(p, "/") {
		if len(name) > unix.NAME_MAX {
			return nameTooLong(field, p)
		}
	}
	return nil
}

func nameTooLong(field, p string) error {
	shown := p
	if len(shown) > 256 {
		shown = fmt.Sprintf("%s... (%d bytes)", shown[:256], len(p))
	}
	return invalid("%s %q: name too long (a name is at most %d bytes, a path %d)", field, shown, unix.NAME_MAX, unix.PathMax-1)
}

// alive refuses the files API once the sandbox is being destroyed.
func (s *Sandbox) alive() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == stateDestroyed {
		return fmt.Errorf("%w: sandbox %s is gone", errdefs.ErrFailedPrecondition, s.spec.ID)
	}
	return nil
}

// openBeneath opens rel beneath root with flags, resolved as resolveHow says.
func openBeneath(field, p, root, rel string, flags int, mode uint32) (*os.File, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: uint64(resolveHow)})
	if err != nil {
		return nil, pathError(field, p, err)
	}
	return os.NewFile(uintptr(fd), p), nil
}

// pathError says, for the caller, why p could not be used.
func pathError(field, p string, err error) error {
	switch {
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: %s %q: resolves outside the sandbox's /work or /out (a symlink or \"..\" that leads out is never followed)", errdefs.ErrPermissionDenied, field, p)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w: %s %q: a symlink that leads out, or one this call does not follow (list its directory to see it)", errdefs.ErrPermissionDenied, field, p)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %s %q: no such file or directory", errdefs.ErrNotFound, field, p)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: %s %q: a part of the path is not a directory", errdefs.ErrInvalidArgument, field, p)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%w: %s %q: is a directory", errdefs.ErrInvalidArgument, field, p)
	case errors.Is(err, unix.ENAMETOOLONG):
		return nameTooLong(field, p)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%w: %s %q: the sandbox's disk limit is reached", errdefs.ErrResourceExhausted, field, p)
	}
	return fmt.Errorf("%s %q: %w", field, p, err)
}

// OpenFile opens a regular file of the sandbox's /work or /out for
// reading; close it when done.
func (s *Sandbox) OpenFile(p string) (*os.File, int64, error) {
	if err := s.alive(); err != nil {
		return nil, 0, err
	}
	root, rel, err := s.splitPath("path", p)
	if err != nil {
		return nil, 0, err
	}
	// O_NONBLOCK: a FIFO the job planted opens at once, and is refused.
	f, err := openBeneath("path", p, root, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%w: path %q: is %s, not a regular file", errdefs.ErrInvalidArgument, p, kindPhrase(st.Mode()))
	}
	return f, st.Size(), nil
}

// kindPhrase names what m is, for a refusal: "a FIFO", "a directory".
func kindPhrase(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsRegular():
		return "file"
	}
	return "other"
}

// WriteFile writes the file at p in /work or /out from r, atomically: the
// bytes go to a new file beside it, which replaces p only once all of them
// are written, so a failed or refused upload leaves p as it was and
// nothing else behind. At most limit bytes are taken (more is refused);
// the sandbox's disk limit bounds it too. The file is owned by the
// sandbox's root and has mode perm. The parent directory must exist.
func (s *Sandbox) WriteFile(p string, r io.Reader, perm fs.FileMode, limit int64) (int64, error) {
	if err := s.alive(); err != nil {
		return 0, err
	}
	if perm&^0o777 != 0 {
		return 0, invalid("mode %o: only permission bits (at most 0777)", perm)
	}
	root, rel, err := s.splitPath("path", p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, invalid("path %q: is a directory", p)
	}
	parent, name := filepath.Split(rel)
	if parent == "" {
		parent = "."
	}
	dir, err := openBeneath("path", p, root, parent, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	if st, err := statAt(dfd, name); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0, invalid("path %q: is a directory", p)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := fmt.Sprintf(".airlock-upload-%x", rnd)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm))
	if err != nil {
		return 0, pathError("path", p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	done := false
	defer func() {
		if !done {
			f.Close()
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	switch {
	case err != nil:
		return 0, pathError("path", p, err)
	case n > limit:
		return 0, fmt.Errorf("%w: path %q: more than %d bytes", errdefs.ErrResourceExhausted, p, limit)
	}
	uid, gid := s.m.hostIDs(s.spec.User)
	if err := f.Chown(uid, gid); err != nil {
		return 0, err
	}
	if err := f.Chmod(perm); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, pathError("path", p, err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return 0, pathError("path", p, err)
	}
	done = true
	return n, nil
}

func statAt(dfd int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// ListFiles lists the directory at p (or the one file), recursively when
// asked, in path order, up to max entries; truncated says more were left.
// Symlinks are listed, never followed.
func (s *Sandbox) ListFiles(p string, recursive bool, max int) (_ []FileInfo, truncated bool, _ error) {
	if err := s.alive(); err != nil {
		return nil, false, err
	}
	root, rel, err := s.splitPath("path", p)
	if err != nil {
		return nil, false, err
	}
	f, err := openBeneath("path", p, root, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if !st.IsDir() {
		return []FileInfo{infoOf(p, st, "")}, false, nil
	}
	var out []FileInfo
	// The names' bytes are bounded too, to keep a listing inside one
	// message whatever names the job chose.
	const maxNameBytes = 2 << 20
	names := 0
	var walk func(dir *os.File, at string) error
	walk = func(dir *os.File, at string) error {
		entries, err := dir.ReadDir(-1)
		if err != nil {
			return err
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			if len(out) >= max || names >= maxNameBytes {
				truncated = true
				return nil
			}
			name := path.Join(at, e.Name())
			var target string
			dfd := int(dir.Fd())
			if e.Type()&fs.ModeSymlink != 0 {
				buf := make([]byte, 4096)
				if n, err := unix.Readlinkat(dfd, e.Name(), buf); err == nil {
					target = string(buf[:n])
				}
			}
			var ust unix.Stat_t
			if err := unix.Fstatat(dfd, e.Name(), &ust, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // gone meanwhile
			}
			out = append(out, infoOfStat(name, &ust, target))
			names += len(name) + len(target)
			if recursive && e.IsDir() {
				cfd, err := unix.Openat(dfd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					continue
				}
				child := os.NewFile(uintptr(cfd), name)
				err = walk(child, name)
				child.Close()
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(f, p); err != nil {
		return nil, false, fmt.Errorf("list %s: %w", p, err)
	}
	return out, truncated, nil
}

func infoOf(p string, st fs.FileInfo, target string) FileInfo {
	return FileInfo{Path: p, Type: kindOf(st.Mode()), Size: st.Size(), Mode: st.Mode().Perm(), ModTime: st.ModTime(), Target: target}
}

func infoOfStat(p string, st *unix.Stat_t, target string) FileInfo {
	fi := FileInfo{Path: p, Size: st.Size, Mode: fs.FileMode(st.Mode & 0o777), ModTime: time.Unix(st.Mtim.Unix()), Target: target}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = "file"
	case unix.S_IFDIR:
		fi.Type = "dir"
	case unix.S_IFLNK:
		fi.Type = "symlink"
	default:
		fi.Type = "other"
	}
	return fi
}
