package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A job's named caches (Spec.Caches): each an overlay mounted on the host
// at dir/cacheN/mnt, its lower layer the cache as it was, its upper and
// work directories scratch/caches/N/{upper,ovl}, then bound at its path
// inside. The runtime makes the mount point in the job's home or /tmp.

// scratchCaches is the scratch directory holding the caches' layers.
const scratchCaches = "caches"

// cacheBind is one cache's overlay on the host and where the job sees it.
type cacheBind struct{ dst, src string }

// CacheUpper is the host path of cache i's upper layer: exactly what the
// job wrote to it (whiteouts for deletions, opaque directories), readable
// after Run until Destroy.
func (s *Sandbox) CacheUpper(i int) string {
	return filepath.Join(s.scr.point, scratchCaches, strconv.Itoa(i), scratchUpper)
}

// makeHomeDirs makes the directories down to p, a cache's path, in the
// job's home (if p lies there) owned by the job's user, so that the
// runtime, which makes a missing mount point owned by root, leaves the
// user a home it can write all of (~/.cache beside ~/.cache/go-build).
// The home is new or emptied, and nothing of the job has run yet.
func (s *Sandbox) makeHomeDirs(p string, uid, gid int) error {
	rel, ok := strings.CutPrefix(p, s.spec.User.Home()+"/")
	if !ok {
		return nil
	}
	dir := filepath.Join(s.scr.point, scratchHome)
	for _, part := range strings.Split(rel, "/") {
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		if err := os.Lchown(dir, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// mountCaches mounts the spec's caches. redirect_dir and metacopy are off
// whatever the kernel's defaults: a renamed directory is then copied, and
// the upper layer says exactly what the job's cache holds.
func (s *Sandbox) mountCaches() ([]cacheBind, error) {
	var out []cacheBind
	uid, gid := s.m.hostIDs(s.spec.User)
	for i, c := range s.spec.Caches {
		n := strconv.Itoa(i)
		point := filepath.Join(s.scr.point, scratchCaches, n)
		for _, d := range []string{point, filepath.Join(point, scratchUpper), filepath.Join(point, scratchOvl)} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return nil, err
			}
		}
		// A kept scratch's work directory holds the mark of a volatile
		// mount, which refuses the next.
		if err := emptyDir(filepath.Join(point, scratchOvl)); err != nil {
			return nil, err
		}
		// The upper root is the mount's root: owned by the job's user.
		// (Files in the cache keep the owner that wrote them.)
		if err := os.Chown(filepath.Join(point, scratchUpper), uid, gid); err != nil {
			return nil, err
		}
		if err := os.Chmod(filepath.Join(point, scratchUpper), 0o755); err != nil {
			return nil, err
		}
		if err := s.makeHomeDirs(c.Path, uid, gid); err != nil {
			return nil, fmt.Errorf("cache %d mount point: %w", i, err)
		}
		if fi, err := os.Stat(c.Lower); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("cache %d lower %s: not a directory", i, c.Lower)
		}
		dir := filepath.Join(s.dir, "cache"+n)
		mnt := filepath.Join(dir, "mnt")
		if err := os.MkdirAll(mnt, 0o700); err != nil {
			return nil, err
		}
		for _, l := range []string{"lower", "upper", "ovlwork"} {
			if err := os.Remove(filepath.Join(dir, l)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
		if err := mountWork(dir, c.Lower, point, mnt, "redirect_dir=off,metacopy=off"); err != nil {
			return nil, fmt.Errorf("cache %s: %w", c.Path, err)
		}
		out = append(out, cacheBind{dst: c.Path, src: mnt})
	}
	return out, nil
}
