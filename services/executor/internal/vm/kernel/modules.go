package kernel

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// maxModinfo bounds one module's .modinfo section.
const maxModinfo = 1 << 20

// writeModulesDep writes modulesDir/modules.dep in depmod's format: each
// module's path (relative to modulesDir) and every module it needs,
// directly or not, so that loading the list from its end to its start
// satisfies each dependency before its user. The dependencies come from
// each module's .modinfo "depends=" entry, which is what depmod reads too.
func writeModulesDep(modulesDir string) error {
	paths := map[string]string{} // module name -> relative path
	deps := map[string][]string{}
	err := filepath.WalkDir(filepath.Join(modulesDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".ko") {
			return err
		}
		rel, err := filepath.Rel(modulesDir, p)
		if err != nil {
			return err
		}
		name := ModuleName(p)
		paths[name] = rel
		d2, err := moduleDepends(p)
		if err != nil {
			return fmt.Errorf("module %s: %w", rel, err)
		}
		deps[name] = d2
		return nil
	})
	if err != nil {
		return err
	}
	names := make([]string, 0, len(paths))
	for n := range paths {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return strings.Compare(paths[a], paths[b]) })
	var out bytes.Buffer
	for _, n := range names {
		var order []string
		seen := map[string]bool{n: true}
		var visit func(string)
		visit = func(m string) {
			for _, d := range deps[m] {
				if seen[d] || paths[d] == "" {
					continue
				}
				seen[d] = true
				visit(d)
				order = append(order, paths[d])
			}
		}
		visit(n)
		slices.Reverse(order)
		fmt.Fprintf(&out, "%s:", paths[n])
		for _, o := range order {
			fmt.Fprintf(&out, " %s", o)
		}
		out.WriteByte('\n')
	}
	return os.WriteFile(filepath.Join(modulesDir, "modules.dep"), out.Bytes(), 0o644)
}

// ModuleName is the kernel's name for a module file: the base name without
// .ko, with '-' as '_'.
func ModuleName(path string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(path), ".ko"), "-", "_")
}

func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, nil
	}
	if s.Size > maxModinfo {
		return nil, fmt.Errorf(".modinfo of %d bytes", s.Size)
	}
	data, err := s.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var out []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					out = append(out, strings.ReplaceAll(d, "-", "_"))
				}
			}
			return out, nil
		}
	}
	return nil, nil
}
