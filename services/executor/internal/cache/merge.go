package cache

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Everything below reads a job's upper layer, which is hostile: it is
// walked without following a link, each file is opened with O_NOFOLLOW
// after lstat said it is regular, and what is written is made anew by the
// executor, never moved or linked from the job's layer. The tree it writes
// into is the executor's own (a commit in progress, under the cache's
// commit lock), so no one else changes it meanwhile.

// linkTree makes dst a copy of the generation src in which every file and
// symlink is a hard link to src's: generations are never changed once
// made, so sharing their files is safe and costs no space.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			if err := os.Mkdir(target, fs.FileMode(st.Mode&0o777)); err != nil {
				return err
			}
			if err := os.Chmod(target, fs.FileMode(st.Mode&0o777)); err != nil {
				return err
			}
			return os.Lchown(target, int(st.Uid), int(st.Gid))
		}
		// linkat without AT_SYMLINK_FOLLOW: a symlink is linked as itself.
		return os.Link(p, target)
	})
}

// apply merges the overlay upper layer upper into the tree dst, as the
// overlay showed it to the job: a whiteout removes, an opaque directory
// replaces, anything else replaces what was there. It returns how many
// entries it left out (device nodes, FIFOs, sockets).
func (s *Store) apply(upper, dst string) (int, error) {
	dropped := 0
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if rel == "." {
			return nil // the mount point itself: dst's root stays the executor's
		}
		if hasXattr(p, "trusted.overlay.redirect") || hasXattr(p, "trusted.overlay.metacopy") {
			// Mounted with redirect_dir=off and metacopy=off, the layer
			// never holds these: refuse rather than guess what moved.
			return fmt.Errorf("%w: %s: a renamed directory or metadata-only copy in the layer", ErrRefused, rel)
		}
		target := filepath.Join(dst, rel)
		if err := checkParent(dst, target); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev == 0 { // a whiteout: the job removed what was here
				return os.RemoveAll(target)
			}
			dropped++
			return os.RemoveAll(target)
		case unix.S_IFDIR:
			old, err := lstat(target)
			if err != nil {
				return err
			}
			if old != nil && (!old.IsDir() || getXattr(p, "trusted.overlay.opaque") == "y") {
				// A directory replacing a file or link, or one the job
				// emptied and made again: nothing of the old one shows.
				if err := os.RemoveAll(target); err != nil {
					return err
				}
				old = nil
			}
			if old == nil {
				if err := os.Mkdir(target, 0o700); err != nil {
					return err
				}
			}
			return s.own(target, st)
		case unix.S_IFREG:
			if err := os.RemoveAll(target); err != nil {
				return err
			}
			return s.copyFile(p, target, st)
		case unix.S_IFLNK:
			if err := os.RemoveAll(target); err != nil {
				return err
			}
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			// The link is kept as text: it resolves inside the next job's
			// sandbox, and nothing on the host ever follows it.
			if err := os.Symlink(link, target); err != nil {
				return err
			}
			return os.Lchown(target, s.id(st.Uid), s.id(st.Gid))
		default:
			// FIFOs, sockets, block devices: nothing a cache needs, and
			// things the next job should not find planted.
			dropped++
			return os.RemoveAll(target)
		}
	})
	return dropped, err
}

// own sets a directory's or file's mode and owner as a cache keeps them:
// permission bits only (no setuid, setgid or sticky), owner and group in
// the sandbox's range.
func (s *Store) own(target string, st unix.Stat_t) error {
	// Owner first: chown clears setuid bits, chmod after it sets exactly
	// these.
	if err := os.Lchown(target, s.id(st.Uid), s.id(st.Gid)); err != nil {
		return err
	}
	return os.Chmod(target, fs.FileMode(st.Mode&0o777))
}

// id is host id v as a cache keeps it: itself inside the sandbox's range,
// the sandbox's root outside it.
func (s *Store) id(v uint32) int {
	if v >= s.cfg.IDBase && uint64(v) < uint64(s.cfg.IDBase)+uint64(s.cfg.IDRange) {
		return int(v)
	}
	return int(s.cfg.IDBase)
}

// copyFile writes a new file at target with src's bytes; src was lstat'ed
// as st, a regular file.
func (s *Store) copyFile(src, target string, st unix.Stat_t) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: no longer a regular file", src)
	}
	out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return s.own(target, st)
}

// checkParent refuses to write target unless every directory from root
// down to its parent is a real directory: the walk makes them so before
// it writes below them, and this keeps it so.
func checkParent(root, target string) error {
	for p := filepath.Dir(target); p != root; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s: parent is not a directory", target)
		}
		if len(p) <= len(root) {
			return fmt.Errorf("%s: outside %s", target, root)
		}
	}
	return nil
}

func lstat(p string) (fs.FileInfo, error) {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return fi, err
}

func getXattr(p, name string) string {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil || n < 0 {
		return ""
	}
	return string(buf[:n])
}

func hasXattr(p, name string) bool {
	_, err := unix.Lgetxattr(p, name, nil)
	return err == nil
}

// keptSize is what the entries of upper layer upper that apply keeps
// (files, directories, links; not whiteouts, devices, FIFOs or sockets)
// add up to as Size counts them, files at their apparent size.
func keptSize(upper string) (int64, error) {
	var n int64
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == upper {
			return err
		}
		switch t := d.Type(); {
		case t.IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += EntryBytes + fi.Size()
		case t.IsDir(), t&fs.ModeSymlink != 0:
			n += EntryBytes
		}
		return nil
	})
	return n, err
}

// Size is a tree's size as a cache counts it: its regular files' bytes
// plus EntryBytes for each entry below the root.
func Size(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		n += EntryBytes
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
