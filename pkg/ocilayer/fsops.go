package ocilayer

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// beneath resolves within a directory fd, never through a link.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openBeneath opens rel beneath dirfd with flags, following no link, not
// even as its last component (ELOOP).
func openBeneath(dirfd int, rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	for {
		fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: beneath})
		if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) {
			return fd, err
		}
	}
}

// resolveError says why a path in the layer could not be walked.
func resolveError(err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return hostile("path passes through a symlink")
	case errors.Is(err, unix.ENOTDIR):
		return hostile("a parent is not a directory")
	case errors.Is(err, unix.EXDEV):
		return hostile("path leaves the layer")
	}
	return fmt.Errorf("resolving the parent: %w", err)
}

// openParent opens (O_PATH) the directory dir of the layer beneath root;
// with create, missing directories are made 0755 and owned by owner.
func openParent(root int, dir string, create bool, owner int) (int, error) {
	fd, err := openBeneath(root, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil {
		return fd, nil
	}
	if !create || !errors.Is(err, unix.ENOENT) {
		return -1, resolveError(err)
	}
	fd, err = openBeneath(root, "", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, resolveError(err)
	}
	for _, comp := range strings.Split(dir, "/") {
		next, err := openBeneath(fd, comp, unix.O_PATH|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			err = mkdirOwned(fd, comp, owner)
			if err == nil {
				next, err = openBeneath(fd, comp, unix.O_PATH|unix.O_DIRECTORY)
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, resolveError(err)
		}
		fd = next
	}
	return fd, nil
}

// mkdirOwned makes the implicit directory name in dirfd: 0755, owned by owner.
func mkdirOwned(dirfd int, name string, owner int) error {
	if err := unix.Mkdirat(dirfd, name, 0o700); err != nil {
		return err
	}
	if err := unix.Fchownat(dirfd, name, owner, owner, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	return unix.Fchmodat(dirfd, name, 0o755, 0)
}

// clearSlot makes room for an entry named name in dirfd: whatever is there
// goes, unless both it and the entry are directories (then the entry only
// updates its metadata, and keptDir is true). A directory in the way is
// removed with its tree, links in it unlinked, never followed.
func clearSlot(dirfd int, name string, dir bool) (keptDir bool, err error) {
	var st unix.Stat_t
	err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, err
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return false, unix.Unlinkat(dirfd, name, 0)
	case dir:
		return true, nil
	}
	return false, removeTree(dirfd, name)
}

// removeTree removes the directory name in dirfd and everything in it.
func removeTree(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	// All names first: a directory changing under getdents may skip some.
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		err := unix.Unlinkat(fd, n, 0)
		if errors.Is(err, unix.EISDIR) {
			err = removeTree(fd, n)
		}
		if err != nil {
			return err
		}
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}
