package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/errdefs"
)

// A job's scratch is one filesystem of exactly DiskBytes holding the upper
// and work directories of /work's overlay and the directories bound at /tmp,
// /out and /root, so one limit covers everything the job can write.
//
// The preferred backing is ext4 in a sparse file on a loop device. A
// size-limited tmpfs would be simpler, but the kernel charges tmpfs pages to
// the memory cgroup of the task that writes them, and with no swap they can
// never be reclaimed: a job with 256 MiB of memory and 1 GiB of disk would be
// OOM-killed after writing 256 MiB, and its memory limit would shrink by
// whatever it had written. An ext4 file system's page cache is reclaimable
// once written back, so memory and disk stay separate limits. The cost is
// small: a formatted image is made once per size and copied sparsely (a few
// hundred KiB) per job, attached with one LOOP_CONFIGURE and mounted.
// tmpfs is the fallback when the host has no loop devices or mkfs.ext4.
type scratchKind string

const (
	scratchExt4  scratchKind = "ext4-loop"
	scratchTmpfs scratchKind = "tmpfs"
)

// Scratch subdirectories. "ovl" is overlayfs's private work directory.
const (
	scratchUpper = "upper"
	scratchOvl   = "ovl"
	scratchTmp   = "tmp"
	scratchOut   = "out"
	scratchHome  = "home"
)

// scratchImageFormat names the mkfs options below in the cached images'
// file names, so changing them never reuses an image made the old way.
const scratchImageFormat = "v1"

// scratchPool makes scratch file systems. It keeps one formatted image per
// disk size (a few hundred KiB each, sparse) in its cache directory.
type scratchPool struct {
	kind   scratchKind
	mkfs   string // mkfs.ext4 path
	cache  string // directory of formatted images, one per size
	mu     sync.Mutex
	images map[int64]string
}

func newScratchPool(cache string) *scratchPool {
	p := &scratchPool{kind: scratchTmpfs, cache: cache, images: map[int64]string{}}
	mkfs := findMkfs()
	_, loopErr := os.Stat("/dev/loop-control")
	if mkfs != "" && loopErr == nil {
		p.kind, p.mkfs = scratchExt4, mkfs
	}
	return p
}

func findMkfs() string {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// image returns a formatted, empty ext4 image of size bytes, making it on
// first use.
func (p *scratchPool) image(size int64) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if img, ok := p.images[size]; ok {
		return img, nil
	}
	img := filepath.Join(p.cache, scratchImageFormat+"-"+strconv.FormatInt(size, 10)+".ext4")
	if _, err := os.Stat(img); err == nil {
		p.images[size] = img
		return img, nil
	}
	tmp := img + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return "", err
	}
	// No journal: the file system lives for one job, and is remounted
	// only after an executor restart that found it still mounted (the
	// host stayed up, so it was whole once unmounted), never after a
	// host crash. Lazy inode tables keep the image sparse
	// (noinit_itable at mount keeps the kernel from filling them in
	// later). No reserved blocks: the job gets the whole size.
	cmd := exec.Command(p.mkfs, "-q", "-F", "-b", "4096", "-m", "0",
		"-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
		"-L", "airlock-scratch", tmp)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", err
	}
	p.images[size] = img
	return img, nil
}

// scratch is one job's mounted scratch file system.
type scratch struct {
	kind     scratchKind
	point    string
	loop     string // the loop device, for ext4
	image    string // its backing file
	size     int64
	baseUsed int64 // bytes in use when empty: the file system's own metadata
}

// Files in a job's directory, beside its scratch mount point: the ext4
// image, and what the executor must know of it to use it again after a
// restart (scratchMeta). Neither is visible to the job.
const (
	scratchImage    = "disk.img"
	scratchMetaFile = "scratch.json"
)

// scratchMeta is what a kept scratch image needs beside it.
type scratchMeta struct {
	BaseUsed int64 `json:"base_used"`
}

// makeScratch mounts a scratch of size bytes at dir/scratch, with /tmp
// owned by the sandbox's root (host uid and gid root) and the directories
// of /work's root, /out and $HOME by the job's user (host uid, gid).
func (p *scratchPool) makeScratch(dir string, size int64, root, uid, gid int) (*scratch, error) {
	size = (size + 4095) &^ 4095
	s := &scratch{kind: p.kind, point: filepath.Join(dir, "scratch"), size: size}
	if err := os.Mkdir(s.point, 0o700); err != nil {
		return nil, err
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV
	switch p.kind {
	case scratchExt4:
		img, err := p.image(size)
		if err != nil {
			return nil, err
		}
		disk := filepath.Join(dir, scratchImage)
		if err := copySparse(img, disk); err != nil {
			return nil, fmt.Errorf("copy scratch image: %w", err)
		}
		if err := s.mountImage(disk); err != nil {
			return nil, err
		}
	case scratchTmpfs:
		if err := unix.Mount("tmpfs", s.point, "tmpfs", flags, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
			return nil, fmt.Errorf("mount scratch tmpfs: %w", err)
		}
	}
	subdirs := []struct {
		name     string
		mode     fs.FileMode
		uid, gid int // -1: the host's root
	}{
		{scratchUpper, 0o755, uid, gid},
		{scratchOvl, 0o700, -1, -1},
		{scratchTmp, 0o1777, root, root},
		{scratchOut, 0o755, uid, gid},
		{scratchHome, 0o700, uid, gid},
	}
	for _, d := range subdirs {
		p := filepath.Join(s.point, d.name)
		if err := os.Mkdir(p, 0o700); err != nil {
			return s, err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return s, err
		}
		if d.uid >= 0 {
			if err := os.Chown(p, d.uid, d.gid); err != nil {
				return s, err
			}
		}
	}
	used, _, err := s.usage()
	if err != nil {
		return s, err
	}
	s.baseUsed = used
	if s.kind == scratchExt4 {
		data, _ := json.Marshal(scratchMeta{BaseUsed: used})
		if err := os.WriteFile(filepath.Join(dir, scratchMetaFile), data, 0o600); err != nil {
			return s, err
		}
	}
	return s, nil
}

// mountImage attaches the ext4 image at disk to a loop device and mounts
// it at s.point.
func (s *scratch) mountImage(disk string) error {
	loop, err := attachLoop(disk)
	if err != nil {
		return err
	}
	s.loop, s.image = loop.Name(), disk
	err = unix.Mount(loop.Name(), s.point, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable")
	// With LO_FLAGS_AUTOCLEAR the device detaches itself when the
	// mount, its last user, goes away; closing here hands it over.
	loop.Close()
	if err != nil {
		return fmt.Errorf("mount scratch ext4: %w", err)
	}
	return nil
}

// reuseScratch mounts at dir/scratch the scratch a previous executor kept
// (keptDir/id.*, moved into dir first): the job's /work changes and /out
// as they were, /tmp and $HOME emptied, and overlayfs's work directory
// emptied (a volatile overlay leaves a mark there that refuses the next
// mount; the scratch was unmounted cleanly, so its upper layer is whole).
func reuseScratch(keptDir, id, dir string) (*scratch, error) {
	img, metaPath := keptPaths(keptDir, id)
	data, err := os.ReadFile(metaPath)
	if err != nil {
		return nil, fmt.Errorf("%w: no kept scratch for %s: %v", errdefs.ErrFailedPrecondition, id, err)
	}
	var meta scratchMeta
	if err := json.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("kept scratch of %s: %w", id, err)
	}
	fi, err := os.Stat(img)
	if err != nil {
		return nil, fmt.Errorf("%w: no kept scratch for %s: %v", errdefs.ErrFailedPrecondition, id, err)
	}
	s := &scratch{kind: scratchExt4, point: filepath.Join(dir, "scratch"), size: fi.Size(), baseUsed: meta.BaseUsed}
	if err := os.Mkdir(s.point, 0o700); err != nil {
		return nil, err
	}
	disk := filepath.Join(dir, scratchImage)
	if err := os.Rename(img, disk); err != nil {
		return nil, err
	}
	if err := os.Rename(metaPath, filepath.Join(dir, scratchMetaFile)); err != nil {
		return nil, err
	}
	if err := s.mountImage(disk); err != nil {
		return s, err
	}
	for _, d := range []string{scratchOvl, scratchTmp, scratchHome} {
		if err := emptyDir(filepath.Join(s.point, d)); err != nil {
			return s, fmt.Errorf("kept scratch of %s: empty %s: %w", id, d, err)
		}
	}
	return s, nil
}

// keepScratch moves a job's unmounted, detached scratch image from its
// directory to keptDir, for the next executor process to reuse.
func keepScratch(dir, keptDir, id string) error {
	img, metaPath := keptPaths(keptDir, id)
	if err := os.Rename(filepath.Join(dir, scratchMetaFile), metaPath); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, scratchImage), img); err != nil {
		os.Remove(metaPath)
		return err
	}
	// Kept, the session outlives this process, and, once its next start
	// finds it, a crash of the host too: its image and the renames are
	// put on disk now (one syncfs for the file system).
	return atomicfile.SyncFS(keptDir)
}

// keptPaths are where a kept scratch image and its metadata live.
func keptPaths(keptDir, id string) (img, meta string) {
	return filepath.Join(keptDir, id+".ext4"), filepath.Join(keptDir, id+".json")
}

// emptyDir removes everything in dir, but not dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// usage returns the bytes in use and the bytes still available; running out
// of inodes counts as nothing available.
func (s *scratch) usage() (used, avail int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.point, &st); err != nil {
		return 0, 0, err
	}
	used = int64(st.Blocks-st.Bfree) * st.Bsize
	avail = int64(st.Bavail) * st.Bsize
	if st.Files > 0 && st.Ffree == 0 {
		avail = 0 // out of inodes is as full as out of blocks
	}
	return used, avail, nil
}

// full reports whether the job ran its disk out. ext4 refuses writes with
// some space still reported free: delayed allocation reserves worst-case
// metadata blocks per write, out of a pool of up to 2% of the file system
// (at most 4096 clusters). So "full" is: less left than that pool plus
// 1 MiB.
func (s *scratch) full() bool {
	_, avail, err := s.usage()
	return err == nil && avail < 1<<20+min(s.size/50, 16<<20)
}

func (s *scratch) jobBytes() int64 {
	used, _, err := s.usage()
	if err != nil || used < s.baseUsed {
		return 0
	}
	return used - s.baseUsed
}

// waitDetached waits, after the scratch is unmounted, until the kernel has
// released the loop device: autoclear runs asynchronously after the last
// close, and until then the device still holds the image. If it does not
// happen within wait, the device is cleared by hand and waited for as
// long again. A clear while something still holds the device (under
// load the kernel can take seconds to let go of an unmounted ext4) only
// marks it to detach at the last close, which autoclear had marked it
// for already: it detaches by itself then.
func (s *scratch) waitDetached(wait time.Duration) error {
	if s == nil || s.loop == "" {
		return nil
	}
	if s.detachedWithin(wait) {
		return nil
	}
	if err := s.clearLoop(); err != nil {
		return err
	}
	s.detachedWithin(wait)
	return nil
}

// clearLoop clears the scratch's loop device by hand, only while it still
// holds the scratch's image: the kernel may have released it since it was
// last looked at and another sandbox bound it to its own image, which a
// clear would pull from under that sandbox. The open descriptor keeps the
// device bound to what it holds until the clear.
func (s *scratch) clearLoop() error {
	var img unix.Stat_t
	if err := unix.Stat(s.image, &img); err != nil {
		return fmt.Errorf("detach %s: the image %s: %w", s.loop, s.image, err)
	}
	dev, err := os.OpenFile(s.loop, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer dev.Close()
	info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
	if errors.Is(err, unix.ENXIO) {
		return nil // released
	}
	if err != nil {
		return fmt.Errorf("detach %s: %w", s.loop, err)
	}
	if info.Inode != img.Ino || info.Device != img.Dev {
		return nil // released, and bound again to another image
	}
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: %w", s.loop, err)
	}
	return nil
}

// detachedWithin polls, up to wait, until the loop device no longer holds
// the scratch's image.
func (s *scratch) detachedWithin(wait time.Duration) bool {
	backing := filepath.Join("/sys/block", filepath.Base(s.loop), "loop", "backing_file")
	end := time.Now().Add(wait)
	// The kernel detaches in its own time (tens of milliseconds when
	// busy): poll often at first, then back off, so many jobs ending at
	// once do not spin on sysfs.
	for pause := time.Millisecond; ; pause = min(2*pause, 16*time.Millisecond) {
		b, err := os.ReadFile(backing)
		if err != nil || trimDeleted(string(trimNL(b))) != s.image {
			return true // detached, or already reused for another image
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(pause)
	}
}

// copySparse copies src to a new file dst, writing only src's data extents.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	// A reflink is instant where the host file system has them.
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	if err := out.Truncate(st.Size()); err != nil {
		return err
	}
	size := st.Size()
	var off int64
	for off < size {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for pos := data; pos < hole; {
			roff, woff := pos, pos
			n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(hole-pos), 0)
			if err != nil {
				if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
					if _, err := io.Copy(io.NewOffsetWriter(out, pos), io.NewSectionReader(in, pos, hole-pos)); err != nil {
						return err
					}
					break
				}
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// attachLoop binds a free loop device to backing and returns it open. The
// device detaches itself once it is unmounted and closed (autoclear).
func attachLoop(backing string) (*os.File, error) {
	return attachLoopFlags(backing, unix.LO_FLAGS_AUTOCLEAR)
}

// attachLoopFlags is attachLoop with the device's flags.
func attachLoopFlags(backing string, flags uint32) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	file, err := os.OpenFile(backing, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var cfg unix.LoopConfig
	cfg.Fd = uint32(file.Fd())
	cfg.Size = 4096
	cfg.Info.Flags = flags
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], backing)
	// Another process can take the free device between GET_FREE and
	// CONFIGURE; then ask again.
	for try := 0; try < 64; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("loop-control: get free device: %w", err)
		}
		name := "/dev/loop" + strconv.Itoa(n)
		dev, err := os.OpenFile(name, os.O_RDWR, 0)
		if errors.Is(err, fs.ErrNotExist) {
			// Some /dev (a container's) is not devtmpfs and does not
			// grow nodes by itself.
			if err = unix.Mknod(name, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err == nil || errors.Is(err, fs.ErrExist) {
				dev, err = os.OpenFile(name, os.O_RDWR, 0)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", name, err)
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if errors.Is(err, unix.EBUSY) {
			time.Sleep(time.Millisecond)
			continue
		}
		return nil, fmt.Errorf("configure %s: %w", name, err)
	}
	return nil, errors.New("no free loop device after 64 tries")
}

// loopDevices calls f with each attached loop device and its backing
// file (without the " (deleted)" the kernel adds to a removed one).
func loopDevices(f func(dev, backing string)) {
	ents, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f("/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p))), trimDeleted(filepath.Clean(string(trimNL(b)))))
	}
}

// loopsBacking lists the loop devices attached to the file at path.
func loopsBacking(path string) []string {
	var devs []string
	loopDevices(func(dev, backing string) {
		if backing == path {
			devs = append(devs, dev)
		}
	})
	return devs
}

// detachLoopsUnder clears every loop device whose backing file lies under
// dir: one a crashed executor attached and never mounted.
func detachLoopsUnder(dir string) {
	loopDevices(func(name, backing string) {
		if !isUnder(backing, dir) {
			return
		}
		if dev, err := os.OpenFile(name, os.O_RDWR, 0); err == nil {
			_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
			dev.Close()
		}
	})
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == 0) {
		b = b[:len(b)-1]
	}
	return b
}

func trimDeleted(p string) string {
	const suffix = " (deleted)"
	if len(p) > len(suffix) && p[len(p)-len(suffix):] == suffix {
		return p[:len(p)-len(suffix)]
	}
	return p
}

func isUnder(p, dir string) bool {
	return len(p) > len(dir) && p[:len(dir)] == dir && p[len(dir)] == '/'
}
