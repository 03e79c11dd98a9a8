package registrytest

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// HostPrograms is the files of a small image made of this host's programs:
// each program named (looked up in PATH) and every shared library ldd says
// it loads, at their real paths, the host's top-level links (bin -> usr/bin
// on a merged-/usr system), sh as a link to the host's sh, and
// /etc/os-release saying osRelease. It is a real, runnable root for a test
// that needs a shell and a few tools in an image without building a
// distribution.
func HostPrograms(t testing.TB, osRelease string, programs ...string) []File {
	t.Helper()
	seen := map[string]bool{}
	var files []File
	// add puts path in the image as the host has it: each link met on
	// the way (after the top-level ones) as a link, the file at its real
	// path.
	var add func(path string, depth int)
	add = func(path string, depth int) {
		if depth > 16 {
			t.Fatalf("registrytest: %s: too many links", path)
		}
		dir, err := filepath.EvalSymlinks(filepath.Dir(path))
		if err != nil {
			t.Fatalf("registrytest: %s: %v", path, err)
		}
		p := filepath.Join(dir, filepath.Base(path))
		if seen[p] {
			return
		}
		seen[p] = true
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatalf("registrytest: %v", err)
		}
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, File{Path: strings.TrimPrefix(p, "/"), Type: tar.TypeSymlink, Linkname: target, Mode: 0o777})
			if !filepath.IsAbs(target) {
				target = filepath.Join(dir, target)
			}
			add(target, depth+1)
			return
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("registrytest: %v", err)
		}
		files = append(files, File{Path: strings.TrimPrefix(p, "/"), Mode: st.Mode().Perm(), Content: data})
	}
	for _, top := range []string{"bin", "lib", "lib64", "sbin"} {
		if target, err := os.Readlink("/" + top); err == nil {
			files = append(files, File{Path: top, Type: tar.TypeSymlink, Linkname: target, Mode: 0o777})
		}
	}
	for _, p := range append([]string{"/bin/sh"}, programs...) {
		path, err := exec.LookPath(p)
		if err != nil {
			t.Fatalf("registrytest: program %s: %v", p, err)
		}
		add(path, 0)
		for _, lib := range libraries(t, path) {
			add(lib, 0)
		}
	}
	files = append(files, File{Path: "etc/os-release", Mode: 0o644, Content: []byte(osRelease)})
	return files
}

var lddPath = regexp.MustCompile(`(/\S+) \(0x`)

// libraries are the shared libraries ldd says program loads.
func libraries(t testing.TB, program string) []string {
	out, err := exec.Command("ldd", program).Output()
	if err != nil {
		return nil // static, or not an ELF program
	}
	var libs []string
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	return libs
}
