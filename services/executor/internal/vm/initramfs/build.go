package initramfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ulikunitz/xz"
)

// ModulesDir is where the initramfs keeps its modules, and Manifest the file
// listing them (one file name a line, in load order) for the agent.
const (
	ModulesDir = "/modules"
	Manifest   = ModulesDir + "/order"
)

// DefaultModules are what the agent needs before it can talk to the host and
// mount the job's filesystems: the virtio PCI transport, the agent's serial
// port, 9p over virtio, the disk (ext4 wants crc32c at mount time, which it
// asks the crypto API for, so crc32c_generic is named), the NIC and overlay
// (the agent's root and dockerd's storage driver).
var DefaultModules = []string{
	"virtio_pci", "virtio_console", "9p", "9pnet_virtio", "virtio_blk", "virtio_net",
	"ext4", "crc32c_generic", "overlay",
}

// Options say what goes into an initramfs.
type Options struct {
	Agent   string   // the static agent binary, installed as /init
	Modules string   // a kernel's lib/modules/<abi> directory
	Want    []string // module names; nil means DefaultModules
	Gzip    bool     // compress the archive (the kernel's default decompressor)
}

// Build writes the initramfs. Modules built into the kernel (modules.builtin)
// are skipped; a wanted module that is neither there nor built in is an error.
// Dependencies come from each module's own modinfo "depends=", so a kernel
// package without modules.dep (Debian ships none) works; .ko.xz files are
// stored decompressed so the agent needs no decompressor.
func Build(w io.Writer, o Options) error {
	agent, err := os.ReadFile(o.Agent)
	if err != nil {
		return fmt.Errorf("initramfs agent: %w", err)
	}
	want := o.Want
	if want == nil {
		want = DefaultModules
	}
	mods, err := Resolve(o.Modules, want)
	if err != nil {
		return err
	}
	out := w
	var zw *gzip.Writer
	if o.Gzip {
		zw = gzip.NewWriter(w)
		out = zw
	}
	c := NewCPIO(out)
	c.Dir("dev", 0o755)
	c.Dir("proc", 0o555)
	c.Dir("sys", 0o555)
	c.Dir("newroot", 0o755)
	c.Dir(ModulesDir, 0o755)
	var order strings.Builder
	for _, m := range mods {
		data, err := readModule(m.Path)
		if err != nil {
			return err
		}
		file := m.Name + ".ko"
		if err := c.File(path.Join(ModulesDir, file), 0o644, data); err != nil {
			return err
		}
		order.WriteString(file + "\n")
	}
	c.File(Manifest, 0o644, []byte(order.String()))
	c.File("init", 0o755, agent)
	if err := c.Close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if zw != nil {
		return zw.Close()
	}
	return nil
}

// Module is one loadable module file.
type Module struct {
	Name string // normalised: '-' → '_'
	Path string
}

// Resolve returns the modules to load for want, dependencies first, without
// the built-in ones.
func Resolve(modulesDir string, want []string) ([]Module, error) {
	files := map[string]string{}
	err := filepath.WalkDir(filepath.Join(modulesDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n, ok := moduleName(d.Name()); ok && d.Type().IsRegular() {
			files[n] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("modules dir %s: %w", modulesDir, err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modulesDir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			if n, ok := moduleName(path.Base(l)); ok {
				builtin[n] = true
			}
		}
	} else if !os.IsNotExist(err) {
		return nil, err
	}
	var out []Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = normalise(name)
		switch {
		case state[name] == 2 || builtin[name]:
			return nil
		case state[name] == 1:
			return fmt.Errorf("module %s: dependency cycle through %s", name, from)
		}
		p, ok := files[name]
		if !ok {
			return fmt.Errorf("module %s (wanted by %s): not in %s and not built in", name, from, modulesDir)
		}
		state[name] = 1
		deps, err := depends(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		out = append(out, Module{Name: name, Path: p})
		return nil
	}
	for _, n := range want {
		if err := visit(n, "the initramfs"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func normalise(n string) string { return strings.ReplaceAll(n, "-", "_") }

func moduleName(file string) (string, bool) {
	for _, ext := range []string{".ko", ".ko.xz"} {
		if n, ok := strings.CutSuffix(file, ext); ok {
			return normalise(n), true
		}
	}
	return "", false
}

// readModule returns a module file's ELF bytes, decompressing .ko.xz.
func readModule(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = bufio.NewReader(f)
	if strings.HasSuffix(p, ".xz") {
		if r, err = xz.NewReader(r); err != nil {
			return nil, fmt.Errorf("module %s: %w", p, err)
		}
	}
	const limit = 64 << 20
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err == nil && len(b) > limit {
		err = fmt.Errorf("larger than %d bytes", limit)
	}
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", p, err)
	}
	return b, nil
}

// depends reads the "depends=" entry of a module's .modinfo section.
func depends(p string) ([]string, error) {
	b, err := readModule(p)
	if err != nil {
		return nil, err
	}
	e, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", p, err)
	}
	s := e.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("module %s: no .modinfo section", p)
	}
	info, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s modinfo: %w", p, err)
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			return slices.DeleteFunc(strings.Split(string(v), ","), func(s string) bool { return s == "" }), nil
		}
	}
	return nil, nil
}
