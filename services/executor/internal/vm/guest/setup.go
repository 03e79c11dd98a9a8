//go:build linux

package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/services/executor/internal/vm/initramfs"
	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// PortName is the virtio-serial port the host talks to the agent on.
const PortName = "airlock.agent"

// earlyMounts gives the initramfs what module loading and the port need.
func earlyMounts() error {
	for _, m := range []struct{ src, dst, fs string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s at %s: %w", m.fs, m.dst, err)
		}
	}
	return nil
}

// loadModules loads the initramfs's modules in the manifest's order.
func loadModules() error {
	f, err := os.Open(initramfs.Manifest)
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel with everything built in
	} else if err != nil {
		return err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		name := strings.TrimSpace(s.Text())
		if name == "" || strings.Contains(name, "/") {
			continue
		}
		if err := loadModule(filepath.Join(initramfs.ModulesDir, name)); err != nil {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return s.Err()
}

func loadModule(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags := 0
	if strings.HasSuffix(path, ".xz") || strings.HasSuffix(path, ".zst") {
		flags = unix.MODULE_INIT_COMPRESSED_FILE
	}
	if err := unix.FinitModule(fd, "", flags); err != nil && err != unix.EEXIST {
		return err
	}
	return nil
}

// openPort finds the agent's virtio-serial port by name and opens it.
func openPort(timeout time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil || strings.TrimSpace(string(b)) != PortName {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(n))
			f, err := os.OpenFile(dev, os.O_RDWR, 0)
			if err == nil {
				return f, nil
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("open %s: %w", dev, err)
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no virtio-serial port named %s after %s", PortName, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The initramfs's staging directories for the job's root.
const (
	lowerDir = "/lower"   // the root share, read-only
	rwDir    = "/rw"      // tmpfs: overlay upper layer and Config files
	newRoot  = "/newroot" // the overlay, made read-only before the switch
)

// ninep mounts a 9p share; cache=loose only for the read-only root, whose files do not change under a run.
func ninep(tag, dst string, flags uintptr, loose bool) error {
	cache := "mmap"
	if loose {
		cache = "loose"
	}
	opts := "trans=virtio,version=9p2000.L,msize=512000,access=client,cache=" + cache
	if err := unix.Mount(tag, dst, "9p", flags, opts); err != nil {
		return fmt.Errorf("mount 9p share %q at %s: %w", tag, dst, err)
	}
	return nil
}

// buildRoot mounts the job's root at newRoot with everything below it, read-only at the end.
func (a *agent) buildRoot(cfg *proto.Config, files map[string][]byte) error {
	for _, d := range []string{lowerDir, rwDir, newRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := ninep(proto.RootTag, lowerDir, unix.MS_RDONLY, true); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", rwDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
		return fmt.Errorf("mount the upper layer's tmpfs: %w", err)
	}
	for _, d := range []string{"upper", "work", "files"} {
		if err := os.Mkdir(filepath.Join(rwDir, d), 0o755); err != nil {
			return err
		}
	}
	// The overlay only exists for the mount points the root lacks; nothing
	// the job writes lands in it, since it is read-only before the switch.
	ov := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lowerDir, rwDir, rwDir)
	if err := unix.Mount("overlay", newRoot, "overlay", 0, ov); err != nil {
		return fmt.Errorf("mount the root overlay: %w", err)
	}
	r, err := openRoot(newRoot)
	if err != nil {
		return err
	}
	defer r.close()

	nosuid := unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := r.mount("proc", "/proc", "proc", uintptr(nosuid), ""); err != nil {
		return err
	}
	if err := r.mount("sysfs", "/sys", "sysfs", uintptr(nosuid|unix.MS_RDONLY), ""); err != nil {
		return err
	}
	if err := r.mount("cgroup2", "/sys/fs/cgroup", "cgroup2", uintptr(nosuid), "nsdelegate"); err != nil {
		return err
	}
	if err := r.makeDev(); err != nil {
		return err
	}
	if err := r.mount("tmpfs", "/run", "tmpfs", uintptr(unix.MS_NOSUID|unix.MS_NODEV), "mode=755"); err != nil {
		return err
	}
	for _, m := range cfg.Tmpfs {
		flags := mountFlags(false, m.NoSuid, m.NoDev, m.NoExec)
		mode := m.Mode
		if mode == 0 {
			mode = 0o1777
		}
		opts := fmt.Sprintf("mode=%o", mode)
		if m.Size > 0 {
			opts += fmt.Sprintf(",size=%d", m.Size)
		}
		if err := r.mount("tmpfs", m.Path, "tmpfs", flags, opts); err != nil {
			return err
		}
	}
	for _, s := range cfg.Shares {
		if s.Tag == proto.RootTag {
			continue
		}
		fd, err := r.mkdirAll(s.Path)
		if err != nil {
			return err
		}
		err = ninep(s.Tag, fdPath(fd), mountFlags(s.RO, s.NoSuid, s.NoDev, s.NoExec), false)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	for i, f := range cfg.Files {
		src := filepath.Join(rwDir, "files", fmt.Sprint(i))
		if err := os.WriteFile(src, files[f.Path], os.FileMode(f.Mode)); err != nil {
			return err
		}
		os.Chmod(src, os.FileMode(f.Mode)) // past the umask
		if err := r.bindFile(src, f.Path); err != nil {
			return err
		}
	}
	if cfg.Docker {
		// dockerd writes its config directory (key.json): give it a
		// throwaway layer over the image's /etc/docker.
		if err := r.overlayDir("/etc/docker", filepath.Join(rwDir, "etc-docker")); err != nil {
			return err
		}
	}
	if cfg.Disk && cfg.Docker {
		fd, err := r.mkdirAll("/var/lib/docker")
		if err != nil {
			return err
		}
		err = unix.Mount("/dev/vda", fdPath(fd), "ext4", unix.MS_NOSUID|unix.MS_NODEV, "")
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("mount the disk /dev/vda at /var/lib/docker: %w", err)
		}
	}
	if err := unix.Mount("", newRoot, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("make the root read-only: %w", err)
	}
	return nil
}

func mountFlags(ro, nosuid, nodev, noexec bool) uintptr {
	var f uintptr
	for _, b := range []struct {
		on   bool
		flag uintptr
	}{{ro, unix.MS_RDONLY}, {nosuid, unix.MS_NOSUID}, {nodev, unix.MS_NODEV}, {noexec, unix.MS_NOEXEC}} {
		if b.on {
			f |= b.flag
		}
	}
	return f
}

// switchRoot enters newRoot as switch_root does: the old root stays below,
// unreachable, and newRoot is a real mount at / so pivot_root works in it.
func switchRoot() error {
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		unix.Unmount(d, unix.MNT_DETACH)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root over /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into the new root: %w", err)
	}
	return unix.Chdir("/")
}
