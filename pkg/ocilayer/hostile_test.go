package ocilayer

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// hostileCase is a crafted layer and the error it must get. Within ents
// and want, CANARY stands for the sandbox's canary directory.
type hostileCase struct {
	name string
	opt  Options
	ents []entry
	want string
	kind error
}

var long = strings.Repeat("n", 300)

func hostileCases() []hostileCase {
	bad := errdefs.ErrInvalidArgument
	big := errdefs.ErrResourceExhausted
	return []hostileCase{
		{"dotdot", Options{}, []entry{reg("../etc/passwd", "x")}, `layer entry "../etc/passwd": path leaves the layer`, bad},
		{"dotdot inside", Options{}, []entry{reg("a/../../x", "x")}, `layer entry "a/../../x": path leaves the layer`, bad},
		{"dotdot that stays inside", Options{}, []entry{dir("a/"), reg("a/../b", "x")}, `layer entry "a/../b": path leaves the layer`, bad},
		{"absolute", Options{}, []entry{reg("/etc/x", "x")}, `layer entry "/etc/x": absolute path`, bad},
		{"empty name", Options{}, []entry{reg("", "x")}, `layer entry "": empty name`, bad},
		{"long name", Options{}, []entry{reg(strings.Repeat("a/", 2100)+"f", "x")}, `: name longer than 4096 bytes`, bad},
		{"long component", Options{}, []entry{reg("d/"+long, "x")}, `layer entry "d/` + long + `": path component longer than 255 bytes`, bad},
		{"write through symlink", Options{}, []entry{symlink("lnk", "CANARY"), reg("lnk/planted", "x")},
			`layer entry "lnk/planted": path passes through a symlink`, bad},
		{"write through inner symlink", Options{}, []entry{dir("d/"), symlink("d/self", "."), reg("d/self/x", "x")},
			`layer entry "d/self/x": path passes through a symlink`, bad},
		{"dir through symlink", Options{}, []entry{symlink("lnk", "CANARY"), dir("lnk/sub/")},
			`layer entry "lnk/sub/": path passes through a symlink`, bad},
		{"whiteout through symlink", Options{}, []entry{symlink("lnk", "CANARY"), reg("lnk/.wh.secret", "")},
			`layer entry "lnk/.wh.secret": path passes through a symlink`, bad},
		{"opaque through symlink", Options{}, []entry{symlink("lnk", "CANARY"), reg("lnk/.wh..wh..opq", "")},
			`layer entry "lnk/.wh..wh..opq": path passes through a symlink`, bad},
		{"symlink climbs out", Options{}, []entry{symlink("a/b", "../../../etc/shadow")}, `layer entry "a/b": link leaves the layer`, bad},
		{"symlink climbs out at root", Options{}, []entry{symlink("x", "..")}, `layer entry "x": link leaves the layer`, bad},
		{"empty symlink", Options{}, []entry{symlink("x", "")}, `layer entry "x": empty link target`, bad},
		{"hardlink out", Options{}, []entry{hardlink("h", "../etc/passwd")}, `layer entry "h": hardlink target "../etc/passwd": path leaves the layer`, bad},
		{"hardlink absolute", Options{}, []entry{hardlink("h", "/etc/passwd")}, `layer entry "h": hardlink target "/etc/passwd": absolute path`, bad},
		{"hardlink missing", Options{}, []entry{hardlink("h", "nope")}, `layer entry "h": hardlink target "nope": not in the layer`, bad},
		{"hardlink to itself", Options{}, []entry{reg("h", "x"), hardlink("h", "h")}, `layer entry "h": hardlink target "h": not another entry`, bad},
		{"hardlink to dir", Options{}, []entry{dir("d/"), hardlink("h", "d")}, `layer entry "h": hardlink target "d": not a regular file`, bad},
		{"hardlink to symlink", Options{}, []entry{symlink("s", "CANARY/secret"), hardlink("h", "s")}, `layer entry "h": hardlink target "s": not a regular file`, bad},
		{"hardlink through symlink", Options{}, []entry{symlink("lnk", "CANARY"), hardlink("h", "lnk/secret")},
			`layer entry "h": hardlink target "lnk/secret": path passes through a symlink`, bad},
		{"char device", Options{}, []entry{with(node(tar.TypeChar, "dev/mem"), func(h *tar.Header) { h.Devmajor, h.Devminor = 1, 1 })}, `layer entry "dev/mem": device node`, bad},
		{"whiteout-shaped char device", Options{}, []entry{node(tar.TypeChar, "gone")}, `layer entry "gone": device node`, bad},
		{"block device", Options{}, []entry{with(node(tar.TypeBlock, "dev/sda"), func(h *tar.Header) { h.Devmajor = 8 })}, `layer entry "dev/sda": device node`, bad},
		{"unknown type", Options{}, []entry{node('Z', "odd")}, `layer entry "odd": unsupported entry type 'Z'`, bad},
		{"whiteout of nothing", Options{}, []entry{reg("a/.wh.", "")}, `layer entry "a/.wh.": whiteout names no entry`, bad},
		{"whiteout of dot", Options{}, []entry{reg("a/.wh..", "")}, `layer entry "a/.wh..": whiteout names no entry`, bad},
		{"whiteout of dotdot", Options{}, []entry{reg("a/.wh...", "")}, `layer entry "a/.wh...": whiteout names no entry`, bad},
		{"whiteout out", Options{}, []entry{reg("../.wh.x", "")}, `layer entry "../.wh.x": path leaves the layer`, bad},
		{"file as root", Options{}, []entry{reg(".", "")}, `layer entry ".": only a directory may name the layer root`, bad},
		{"file as parent", Options{}, []entry{reg("f", "x"), reg("f/x", "y")}, `layer entry "f/x": a parent is not a directory`, bad},
		{"too many entries", Options{MaxEntries: 3}, []entry{dir("a/"), dir("b/"), dir("c/"), dir("d/")}, `layer entry "d/": more than 3 entries`, big},
		{"file too big", Options{MaxFileBytes: 4}, []entry{reg("ok", "1234"), reg("big", "12345")}, `layer entry "big": file of 5 bytes over the bound of 4`, big},
		{"layer too big", Options{MaxTotalBytes: 10}, []entry{reg("a", "123456"), reg("b", "12345")}, `layer entry "b": layer over the bound of 10 bytes`, big},
	}
}

func (c hostileCase) withCanary(canary string) []entry {
	ents := make([]entry, len(c.ents))
	for i, e := range c.ents {
		e.hdr.Linkname = strings.ReplaceAll(e.hdr.Linkname, "CANARY", canary)
		ents[i] = e
	}
	return ents
}

// TestHostileLayers: each crafted layer is refused with its entry named and
// the reason given, and nothing outside dst changes.
func TestHostileLayers(t *testing.T) {
	for _, c := range hostileCases() {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			_, err := unpackBytes(t, layerTar(t, c.withCanary(s.canary)...), MediaTypeOCILayer, s.dst, c.opt)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want it to contain %s", err, c.want)
			}
			if !errors.Is(err, c.kind) {
				t.Errorf("error %v is not %v", err, c.kind)
			}
			var ee *EntryError
			if !errors.As(err, &ee) {
				t.Errorf("error %v is not an *EntryError", err)
			}
			s.checkCanary(t)
		})
	}
}

// TestNamesRefusedBeforeTar covers what archive/tar cannot carry to us.
func TestNamesRefusedBeforeTar(t *testing.T) {
	for name, want := range map[string]string{
		"a\x00b":                        "NUL byte in name",
		strings.Repeat("x", 4097):       "name longer than 4096 bytes",
		"a/" + strings.Repeat("y", 256): "path component longer than 255 bytes",
	} {
		if _, err := cleanName(name); err == nil || err.Error() != want {
			t.Errorf("cleanName(%.20q) = %v, want %s", name, err, want)
		}
	}
	if err := checkSymlink("x", "a\x00b"); err == nil {
		t.Errorf("checkSymlink accepted a NUL byte")
	}
}

// TestSymlinkTargetsLexically: absolute targets are kept, relative ones may
// climb to the layer root from the link's directory but not above it.
func TestSymlinkTargetsLexically(t *testing.T) {
	for _, c := range []struct {
		rel, target string
		ok          bool
	}{
		{"etc/abs", "/etc/shadow", true},
		{"etc/abs", "/../../etc/shadow", true},
		{"a/b/c", "../../x", true},
		{"a/b/c", "../../../x", false},
		{"a/b/c", "../d/../../..", false},
		{"a/b/c", "./.././../x/..", true},
		{"top", "x/../..", false},
		{"top", "x/..", true},
	} {
		if err := checkSymlink(c.rel, c.target); (err == nil) != c.ok {
			t.Errorf("checkSymlink(%q, %q) = %v, want ok %v", c.rel, c.target, err, c.ok)
		}
	}
}

// TestReplacingALinkNeverWritesThroughIt: a file, directory, FIFO, hardlink
// or whiteout named like an earlier symlink replaces the link; the link's
// target is untouched.
func TestReplacingALinkNeverWritesThroughIt(t *testing.T) {
	for _, e := range []entry{reg("lnk", "new"), dir("lnk/"), node(tar.TypeFifo, "lnk"), hardlink("lnk", "f"), reg(".wh.lnk", "")} {
		t.Run(string(e.hdr.Typeflag)+e.hdr.Name, func(t *testing.T) {
			s := newSandbox(t)
			ents := []entry{reg("f", "f"), symlink("lnk", filepath.Join(s.canary, "secret")), e}
			if _, err := unpackBytes(t, layerTar(t, ents...), MediaTypeOCILayer, s.dst, Options{}); err != nil {
				t.Fatal(err)
			}
			s.checkCanary(t)
			fi, err := os.Lstat(filepath.Join(s.dst, "lnk"))
			if err != nil || fi.Mode()&os.ModeSymlink != 0 {
				t.Fatalf("lnk after replacement: %v, %v", fi, err)
			}
		})
	}
}
