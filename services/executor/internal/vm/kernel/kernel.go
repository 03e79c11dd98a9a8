// Package kernel fetches Debian's generic amd64 kernel and keeps it in a
// cache shared by every run on the machine, for the VM runtime class
// (cmd/airlock-vm). The package is fetched with `apt-get download` and
// unpacked with `dpkg -x`, never installed, so the host's own kernel and
// boot files are untouched. Only cmd/airlock-vm and the VM's tests import it.
//
// A cached kernel is a directory <base>/kernel/<package>_<version>/ holding
// the package's files, `vmlinux` (the ELF cut out of the compressed
// vmlinuz: QEMU boots it through its PVH entry point, which skips ~10 s of
// decompression under TCG) and `VERSION` ("<package> <version> <abi>"),
// which is written last: a directory without it is not a kernel. The
// modules stay as the package has them (no modules.dep: package
// vm/initramfs reads each module's own dependencies).
package kernel

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultBase is the cache's base directory unless AIRLOCK_VM_CACHE names
// another: on the root filesystem, outside any checkout, kept across
// `git clean`, one copy per machine.
const DefaultBase = "/var/cache/airlock-vm"

// Metapackage is what apt resolves to the current kernel package.
const Metapackage = "linux-image-amd64"

// Kernel is one cached kernel.
type Kernel struct {
	// Dir is the cached directory, <base>/kernel/<Package>_<Version>.
	Dir string
	// Package and Version are Debian's, e.g. linux-image-6.1.0-48-amd64
	// and 6.1.172-1; ABI is the modules directory's name (uname -r).
	Package, Version, ABI string
	// Vmlinux is the uncompressed ELF kernel with a PVH entry point.
	Vmlinux string
	// ModulesDir is Dir/lib/modules/<ABI>.
	ModulesDir string
}

// String renders the kernel as the CLI's --version does.
func (k Kernel) String() string { return fmt.Sprintf("%s %s (%s)", k.Package, k.Version, k.ABI) }

// Base is the cache base: AIRLOCK_VM_CACHE or DefaultBase.
func Base() string {
	if b := os.Getenv("AIRLOCK_VM_CACHE"); b != "" {
		return b
	}
	return DefaultBase
}

// Fetch returns the kernel apt resolves linux-image-amd64 to, fetching and
// unpacking it into the cache first when it is not there. When apt cannot
// resolve it (no lists, no network), the newest cached kernel is used. It
// holds a lock on the cache while it works, so concurrent callers fetch
// once.
func Fetch(ctx context.Context, base string) (Kernel, error) {
	kdir := filepath.Join(base, "kernel")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return Kernel{}, fmt.Errorf("kernel cache %s: %w", base, err)
	}
	unlock, err := lock(ctx, filepath.Join(base, ".lock"))
	if err != nil {
		return Kernel{}, err
	}
	defer unlock()
	pkg, ver, rerr := resolve(ctx)
	if rerr != nil {
		k, err := Find(base)
		if err != nil {
			return Kernel{}, fmt.Errorf("%v, and %w", rerr, err)
		}
		return k, nil
	}
	dir := filepath.Join(kdir, pkg+"_"+strings.ReplaceAll(ver, ":", "%3a"))
	if k, err := load(dir); err == nil {
		return k, nil
	}
	if err := unpack(ctx, kdir, dir, pkg, ver); err != nil {
		return Kernel{}, err
	}
	return load(dir)
}

// Find returns the newest kernel in the cache (by Debian version order),
// without asking apt.
func Find(base string) (Kernel, error) {
	dirs, _ := filepath.Glob(filepath.Join(base, "kernel", "*", "VERSION"))
	var best Kernel
	found := false
	for _, v := range dirs {
		k, err := load(filepath.Dir(v))
		if err != nil {
			continue
		}
		if !found || CompareVersions(k.Version, best.Version) > 0 {
			best, found = k, true
		}
	}
	if !found {
		return Kernel{}, fmt.Errorf("no kernel is cached in %s", filepath.Join(base, "kernel"))
	}
	return best, nil
}

// Load reads the cached kernel in dir (as given to the CLI's --kernel).
func Load(dir string) (Kernel, error) { return load(dir) }

// maxVersionFile bounds what is read of a VERSION file.
const maxVersionFile = 4096

var (
	pkgRe = regexp.MustCompile(`^linux-image-[0-9][A-Za-z0-9.+~-]*-amd64$`)
	verRe = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~:-]*$`)
	abiRe = regexp.MustCompile(`^[0-9][A-Za-z0-9.+_-]*$`)
)

func load(dir string) (Kernel, error) {
	data, err := readBounded(filepath.Join(dir, "VERSION"), maxVersionFile)
	if err != nil {
		return Kernel{}, fmt.Errorf("kernel %s: %w", dir, err)
	}
	f := strings.Fields(string(data))
	if len(f) != 3 || !pkgRe.MatchString(f[0]) || !verRe.MatchString(f[1]) || !abiRe.MatchString(f[2]) {
		return Kernel{}, fmt.Errorf("kernel %s: VERSION %q: want \"<package> <version> <abi>\"", dir, data)
	}
	k := Kernel{
		Dir: dir, Package: f[0], Version: f[1], ABI: f[2],
		Vmlinux:    filepath.Join(dir, "vmlinux"),
		ModulesDir: filepath.Join(dir, "lib", "modules", f[2]),
	}
	for _, p := range []string{k.Vmlinux, k.ModulesDir} {
		if _, err := os.Stat(p); err != nil {
			return Kernel{}, fmt.Errorf("kernel %s: %w", dir, err)
		}
	}
	return k, nil
}

func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(io.LimitReader(f, max+1)); err != nil {
		return nil, err
	}
	if int64(b.Len()) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b.Bytes(), nil
}

// lock takes an exclusive flock on path, giving up when ctx ends.
func lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kernel cache lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("kernel cache lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("kernel cache lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// depRe finds the exact kernel package linux-image-amd64 depends on.
var depRe = regexp.MustCompile(`(linux-image-[0-9][^ ,]*-amd64) \(= ([^)]+)\)`)

// resolve asks apt which kernel package and version linux-image-amd64
// means, refreshing the lists once if they lack it.
func resolve(ctx context.Context) (pkg, ver string, err error) {
	show := func() ([]byte, error) {
		return exec.CommandContext(ctx, "apt-cache", "show", "--no-all-versions", Metapackage).Output()
	}
	out, err := show()
	if err != nil || len(depRe.FindSubmatch(out)) == 0 {
		_ = exec.CommandContext(ctx, "apt-get", "update", "-qq").Run()
		if out, err = show(); err != nil {
			return "", "", fmt.Errorf("apt-cache show %s: %v", Metapackage, err)
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "Depends:") {
			continue
		}
		if m := depRe.FindStringSubmatch(line); m != nil && pkgRe.MatchString(m[1]) && verRe.MatchString(m[2]) {
			return m[1], m[2], nil
		}
	}
	return "", "", fmt.Errorf("apt-cache show %s: no exact linux-image-*-amd64 dependency", Metapackage)
}

// unpack downloads pkg=ver and makes dir from it atomically: everything is
// built in a temporary directory beside it and renamed into place.
func unpack(ctx context.Context, kdir, dir, pkg, ver string) error {
	tmp, err := os.MkdirTemp(kdir, ".fetch-")
	if err != nil {
		return fmt.Errorf("kernel cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	run := func(dir string, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(tail(out, 2048)))
		}
		return nil
	}
	if err := run(tmp, "apt-get", "download", "-q", pkg+"="+ver); err != nil {
		if err2 := run(tmp, "apt-get", "update", "-qq"); err2 != nil {
			return err
		}
		if err := run(tmp, "apt-get", "download", "-q", pkg+"="+ver); err != nil {
			return err
		}
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s=%s: want one .deb, got %d", pkg, ver, len(debs))
	}
	root := filepath.Join(tmp, "root")
	if err := run(tmp, "dpkg", "-x", debs[0], root); err != nil {
		return err
	}
	os.Remove(debs[0])
	mods, _ := filepath.Glob(filepath.Join(root, "lib", "modules", "*"))
	if len(mods) != 1 || !abiRe.MatchString(filepath.Base(mods[0])) {
		return fmt.Errorf("%s %s: want one lib/modules directory, got %d", pkg, ver, len(mods))
	}
	abi := filepath.Base(mods[0])
	if err := cutVmlinux(ctx, filepath.Join(root, "boot", "vmlinuz-"+abi), filepath.Join(root, "vmlinux")); err != nil {
		return fmt.Errorf("%s %s: %w", pkg, ver, err)
	}
	if err := os.WriteFile(filepath.Join(root, "VERSION"), []byte(pkg+" "+ver+" "+abi+"\n"), 0o644); err != nil {
		return err
	}
	// A half-made directory left by a killed fetch has no VERSION: replace it.
	if _, err := os.Stat(dir); err == nil {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("kernel cache: %w", err)
		}
	}
	if err := os.Rename(root, dir); err != nil {
		return fmt.Errorf("kernel cache: %w", err)
	}
	return nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// xzMagic starts the xz stream inside a Debian bzImage.
var xzMagic = []byte("\xfd7zXZ\x00")

// cutVmlinux decompresses the ELF kernel inside vmlinuz into out and checks
// that it is an x86-64 ELF with a PVH entry note (Xen's PHYS32_ENTRY,
// which QEMU's -kernel uses).
func cutVmlinux(ctx context.Context, vmlinuz, out string) error {
	data, err := os.ReadFile(vmlinuz)
	if err != nil {
		return err
	}
	off := bytes.Index(data, xzMagic)
	if off < 0 {
		return fmt.Errorf("%s: no xz stream", vmlinuz)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "xz", "-dcq")
	cmd.Stdin = bytes.NewReader(data[off:])
	cmd.Stdout = f
	// xz fails on the bytes after the stream: the result is checked instead.
	_ = cmd.Run()
	if err := f.Close(); err != nil {
		return err
	}
	return checkPVH(out)
}

// pvhNote is XEN_ELFNOTE_PHYS32_ENTRY.
const pvhNote = 18

func checkPVH(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("vmlinux: %w", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("vmlinux: machine %v, want x86-64", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > 1<<20 {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			continue
		}
		for len(b) >= 12 {
			nsz, dsz, typ := f.ByteOrder.Uint32(b), f.ByteOrder.Uint32(b[4:]), f.ByteOrder.Uint32(b[8:])
			n := 12 + align4(uint64(nsz)) + align4(uint64(dsz))
			if n > uint64(len(b)) {
				break
			}
			if typ == pvhNote && nsz >= 3 && string(b[12:15]) == "Xen" {
				return nil
			}
			b = b[n:]
		}
	}
	return fmt.Errorf("vmlinux: no PVH entry note (CONFIG_PVH)")
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }
