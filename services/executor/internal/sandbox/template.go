package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// templateFormat versions the way a template definition is turned into a
// root filesystem; bump it whenever that changes, so TemplateVersion does.
const templateFormat = "airlock-rootfs/1"

// The synthesized /etc. Nothing in it comes from the host's /etc: the host's
// files hold host users, host names, resolvers and, at worst, secrets.
var etcFiles = []templateEntry{
	{Path: "etc/passwd", Kind: "file", Mode: 0o644, Content: basePasswd},
	{Path: "etc/group", Kind: "file", Mode: 0o644, Content: baseGroup},
	{Path: "etc/hosts", Kind: "file", Mode: 0o644, Content: "127.0.0.1\tlocalhost airlock\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
	{Path: "etc/hostname", Kind: "file", Mode: 0o644, Content: "airlock\n"},
	// Empty: a deny-all sandbox has no resolver to reach (a domains job
	// gets its own, bound over this one: Spec.Nameservers).
	{Path: "etc/resolv.conf", Kind: "file", Mode: 0o644, Content: ""},
	{Path: "etc/nsswitch.conf", Kind: "file", Mode: 0o644, Content: "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n"},
	{Path: "etc/mtab", Kind: "symlink", Target: "../proc/self/mounts"},
}

// Directories the runtime mounts over. The root is read-only and owned by
// the host's root, so the runtime, running as the sandbox's root, could not
// create them itself.
var mountPoints = []string{".airlock", ".airlock/git-objects", "dev", "etc", "home", "out", "proc", "root", "sys", "tmp", "usr", "work"}

// templateEntry is one node of the root filesystem, relative to its root.
type templateEntry struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"` // dir, file or symlink
	Mode    uint32 `json:"mode,omitempty"`
	Target  string `json:"target,omitempty"`
	Content string `json:"content,omitempty"`
}

// templateDef is everything that decides what a job's root filesystem
// holds. Its digest is the TemplateVersion in every Result.
type templateDef struct {
	Format string `json:"format"`
	// Binds are host directories mounted read-only at the same path.
	Binds   []string        `json:"binds"`
	Entries []templateEntry `json:"entries"`
}

type rootfsTemplate struct {
	def     templateDef
	version string
	dir     string
}

// hostTopDirs are the top-level host directories that hold programs and
// libraries. On a merged-/usr system (Debian 12 and later) all but /usr are
// symlinks into it; they become the same symlinks in the template.
var hostTopDirs = []string{"bin", "lib", "lib32", "lib64", "libx32", "sbin"}

// buildTemplateDef defines the template; cas is the jobs' trust store
// (caEntries).
func buildTemplateDef(cas []byte) (templateDef, error) {
	def := templateDef{Format: templateFormat, Binds: []string{"/usr"}}
	var entries []templateEntry
	for _, d := range mountPoints {
		entries = append(entries, templateEntry{Path: d, Kind: "dir", Mode: 0o755})
	}
	for _, d := range hostTopDirs {
		p := "/" + d
		st, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return def, err
		case st.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return def, err
			}
			entries = append(entries, templateEntry{Path: d, Kind: "symlink", Target: target})
		case st.IsDir():
			def.Binds = append(def.Binds, p)
			entries = append(entries, templateEntry{Path: d, Kind: "dir", Mode: 0o755})
		}
	}
	entries = append(entries, etcFiles...)
	entries = append(entries, caEntries(cas)...)
	alts, err := alternatives()
	if err != nil {
		return def, err
	}
	if len(alts) > 0 {
		entries = append(entries, templateEntry{Path: "etc/alternatives", Kind: "dir", Mode: 0o755})
		entries = append(entries, alts...)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	def.Entries = entries
	return def, nil
}

// alternatives mirrors the symlinks of Debian's alternatives system. Many
// commands in /usr (awk, cc, editor, java) are symlinks through
// /etc/alternatives, so without these they would dangle. Only a link whose
// target lies inside the read-only /usr is kept: it names a program the
// sandbox already sees and carries no content of the host's /etc.
func alternatives() ([]templateEntry, error) {
	ents, err := os.ReadDir("/etc/alternatives")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []templateEntry
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		target, err := os.Readlink(filepath.Join("/etc/alternatives", e.Name()))
		if err != nil || filepath.Clean(target) != target || !strings.HasPrefix(target, "/usr/") {
			continue
		}
		out = append(out, templateEntry{Path: "etc/alternatives/" + e.Name(), Kind: "symlink", Target: target})
	}
	return out, nil
}

func (d templateDef) digest() string {
	b, err := json.Marshal(d)
	if err != nil {
		panic(err) // plain strings and ints always marshal
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// materialize writes the template's root under parent, named by its digest,
// unless it is already there. The write goes to a temporary name first, so
// a root that exists is complete.
func (d templateDef) materialize(parent string) (*rootfsTemplate, error) {
	version := d.digest()
	dir := filepath.Join(parent, strings.TrimPrefix(version, "sha256:")[:32])
	t := &rootfsTemplate{def: d, version: version, dir: dir}
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return t, nil
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	for _, e := range d.Entries {
		p := filepath.Join(tmp, e.Path)
		var err error
		switch e.Kind {
		case "dir":
			err = os.Mkdir(p, fs.FileMode(e.Mode))
			if err == nil {
				err = os.Chmod(p, fs.FileMode(e.Mode)) // past the umask
			}
		case "file":
			err = os.WriteFile(p, []byte(e.Content), fs.FileMode(e.Mode))
			if err == nil {
				err = os.Chmod(p, fs.FileMode(e.Mode))
			}
		case "symlink":
			err = os.Symlink(e.Target, p)
		default:
			err = fmt.Errorf("unknown kind %q", e.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("rootfs template %s: %w", e.Path, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another executor on this host may have written the same template.
		if st, serr := os.Stat(dir); serr == nil && st.IsDir() {
			return t, nil
		}
		return nil, err
	}
	return t, nil
}

// checkSearchable reports the first directory from dir up to / that the
// sandbox's root cannot search. runc's init resolves the root filesystem's
// path itself from inside the user namespace, where the host's root-owned
// directories grant it only their "other" bits (or group bits, for a
// directory whose group is the sandbox's root group).
func checkSearchable(dir string, gid uint32) error {
	for p := dir; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		ok := st.Mode&0o001 != 0 || (st.Gid == gid && st.Mode&0o010 != 0)
		if !ok {
			return fmt.Errorf("%s (mode %#o) is not searchable by the sandbox's root (host gid %d)", p, st.Mode&0o7777, gid)
		}
		if p == "/" {
			return nil
		}
	}
}
