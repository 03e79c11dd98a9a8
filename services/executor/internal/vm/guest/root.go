//go:build linux

package guest

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// root resolves paths inside the job's root filesystem as if it were /, so a
// symlink in the job's image cannot send a mount or a file outside it.
type root struct{ fd int }

func openRoot(p string) (*root, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the new root %s: %w", p, err)
	}
	return &root{fd: fd}, nil
}

func (r *root) close() { unix.Close(r.fd) }

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func (r *root) open(p string, flags int, mode uint32) (int, error) {
	return unix.Openat2(r.fd, p, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// mkdirAll makes p's missing directories and returns an O_PATH fd of p.
func (r *root) mkdirAll(p string) (int, error) {
	cur := "/"
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		if c == "" {
			continue
		}
		next := path.Join(cur, c)
		fd, err := r.open(next, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == unix.ENOENT {
			var parent int
			if parent, err = r.open(cur, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
				err = unix.Mkdirat(parent, c, 0o755)
				unix.Close(parent)
			}
			if err == nil || err == unix.EEXIST {
				fd, err = r.open(next, unix.O_PATH|unix.O_DIRECTORY, 0)
			}
		}
		if err != nil {
			return -1, fmt.Errorf("make mount point %s in the job's root: %s: %w", p, next, err)
		}
		unix.Close(fd)
		cur = next
	}
	fd, err := r.open(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s in the job's root: %w", p, err)
	}
	return fd, nil
}

// mount mounts at p in the root, making the directory when missing.
func (r *root) mount(src, p, fstype string, flags uintptr, data string) error {
	fd, err := r.mkdirAll(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(src, fdPath(fd), fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s at %s: %w", fstype, p, err)
	}
	return nil
}

// bindFile places the host file src read-only at p (created empty when missing).
func (r *root) bindFile(src, p string) error {
	dir, err := r.mkdirAll(path.Dir(p))
	if err != nil {
		return err
	}
	unix.Close(dir)
	fd, err := r.open(p, unix.O_CREAT|unix.O_RDONLY|unix.O_NOFOLLOW, 0o644)
	if err == unix.ELOOP || err == unix.EISDIR {
		err = fmt.Errorf("not a regular file: %w", err)
	}
	if err != nil {
		return fmt.Errorf("file %s in the job's root: %w", p, err)
	}
	defer unix.Close(fd)
	target := fdPath(fd)
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	fd2, err := r.open(p, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd2)
	if err := unix.Mount("", fdPath(fd2), "", flags, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", p, err)
	}
	return nil
}

// makeDev gives the root a small /dev as runc does: no disks, no agent port.
func (r *root) makeDev() error {
	if err := r.mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return err
	}
	dev, err := r.open("/dev", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dev)
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		if err := unix.Mknodat(dev, n.name, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
		}
		unix.Fchmodat(dev, n.name, 0o666, 0) // past the umask
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
		{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"}} {
		if err := unix.Symlinkat(l[0], dev, l[1]); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", l[1], err)
		}
	}
	if err := r.mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return err
	}
	if err := r.mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777"); err != nil {
		return err
	}
	return r.mount("mqueue", "/dev/mqueue", "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// overlayDir makes the directory p writable under an upper layer in scratch
// (on the agent's tmpfs): changes are thrown away with the machine.
func (r *root) overlayDir(p, scratch string) error {
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(scratch, d), 0o755); err != nil {
			return err
		}
	}
	fd, err := r.mkdirAll(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", fdPath(fd), scratch, scratch)
	if err := unix.Mount("overlay", fdPath(fd), "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a writable layer over %s: %w", p, err)
	}
	return nil
}
