package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// A job on an image (Spec.Image) runs on the image's own root filesystem
// instead of the host template: a read-only overlayfs, per job, whose
// lower layers are, top first,
//
//   - for a user other than root, a layer of the job's own (its dir's
//     "etc-user") holding the /etc/passwd and /etc/group it sees: the
//     image's, read from the image, with the job's user and group added
//     when the image does not name their ids (imageUserEtc);
//   - Airlock's layer (imageTopDef, shared by every image job of this
//     executor like the template): the mount points the OCI spec needs
//     (an image may lack /work or /out, and the root is read-only, so no
//     runtime could make them), /etc/hosts, /etc/hostname, an empty
//     /etc/resolv.conf, and the jobs' trust store at caBundlePath and each
//     of caBundleLinks. Each wins over the image's file at that path: the
//     bundle the CA variables name (caEnv), and every other path a
//     distribution's tools read, is Airlock's, so the operator's CAs (an
//     egress proxy's among them) are trusted in every image. A directory
//     of this layer hides an image's symlink at the same path (Fedora's
//     /etc/ssl/certs, a link to /etc/pki/tls/certs, shows only the
//     bundle); the image's files stay reachable at the link's target;
//   - the image's layers (ImageRoot.Layers), topmost first, with their
//     whiteouts and opaque directories honoured by overlayfs.
//
// Everything else in /etc (os-release, nsswitch.conf, the image's users
// for a root job) is the image's. The overlay has no upper layer, so
// nothing can write to it; none of its lower layers is changed while it
// is mounted (the image's are the store's, read-only and shared; the two
// of Airlock's are written before and removed after). It is mounted
// nosuid, nodev and read-only below rootsDir, searchable by the sandbox's
// root like the template (checkSearchable), and removed by teardown,
// removeLeftover and Recover.
//
// The OCI spec binds nothing of the host's (/usr, /bin, /lib): the image
// supplies its programs. The layers' files show inside with their host
// owners mapped through the job's uid map, so a layer unpacked with its
// owners shifted by Config.UIDBase shows the image's owners; one unpacked
// as the host's root shows "nobody" (readable where its mode allows).
//
// Under runc, Exec wraps a command in /bin/sh (exec.go): an image without
// one runs jobs, not execs.

// ImageRoot is an unpacked OCI image a job runs on.
type ImageRoot struct {
	// Digest is the image's manifest digest, "sha256:" and 64 lowercase
	// hex digits: the TemplateVersion of the job's Result.
	Digest string
	// Layers are the host directories of the unpacked layers, bottom
	// first (as the manifest lists them). They are read-only, may be
	// shared with other jobs, and are never written; they must not change
	// while a job uses them.
	Layers []string
	// Env is the image config's Env ("K=V"): the job's environment starts
	// from it (jobEnv).
	Env []string
	// WorkingDir is the image config's WorkingDir. Informational: a job's
	// working directory is /work.
	WorkingDir string
}

// ovlMaxStack is overlayfs's bound on lower layers (OVL_MAX_STACK).
const ovlMaxStack = 500

// MaxImageLayers is the most layers an image may have: overlayfs's bound
// less Airlock's two layers. (Their options, named by short links,
// take at most 4 bytes a layer, well inside the page mount(2) takes.)
const MaxImageLayers = ovlMaxStack - 2

// maxImageUserFile bounds the image's /etc/passwd and /etc/group as read
// for a job's user.
const maxImageUserFile = 1 << 20

// validate checks im as far as the host is not needed.
func (im *ImageRoot) validate() error {
	if !digest.Valid(im.Digest) {
		return invalid("spec.image.digest %q: want sha256: and 64 lowercase hex digits", im.Digest)
	}
	if len(im.Layers) == 0 {
		return invalid("spec.image.layers: an image needs at least one layer")
	}
	if len(im.Layers) > MaxImageLayers {
		return invalid("spec.image.layers: the image has %d layers; at most %d fit in one overlay mount (overlayfs stacks at most %d lower layers, 2 of them Airlock's)",
			len(im.Layers), MaxImageLayers, ovlMaxStack)
	}
	seen := map[string]int{}
	for i, l := range im.Layers {
		if !filepath.IsAbs(l) || filepath.Clean(l) != l || strings.ContainsAny(l, "\x00\n") {
			return invalid("spec.image.layers[%d] %q: must be a clean absolute path", i, l)
		}
		if j, dup := seen[l]; dup {
			return invalid("spec.image.layers[%d] %q: same directory as spec.image.layers[%d] (overlayfs refuses a layer twice)", i, l, j)
		}
		seen[l] = i
	}
	for i, kv := range im.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return invalid("spec.image.env[%d]: want K=V with a non-empty K and no NUL", i)
		}
	}
	if strings.IndexByte(im.WorkingDir, 0) >= 0 {
		return invalid("spec.image.working_dir: contains a NUL byte")
	}
	return nil
}

// checkLayers checks that every layer is a directory (not a link to one:
// the store names its own directories).
func (im *ImageRoot) checkLayers() error {
	for i, l := range im.Layers {
		st, err := os.Lstat(l)
		if err != nil {
			return invalid("spec.image.layers[%d] %q: %v", i, l, err)
		}
		if !st.IsDir() {
			return invalid("spec.image.layers[%d] %q: not a directory", i, l)
		}
	}
	return nil
}

// imageTopFormat versions Airlock's layer over an image; bump it whenever
// imageTopDef changes.
const imageTopFormat = "airlock-image-top/1"

// imageTopDef is Airlock's layer over every image (see above); cas is the
// jobs' trust store.
func imageTopDef(cas []byte) templateDef {
	var entries []templateEntry
	for _, d := range mountPoints {
		if d == "usr" {
			continue // the image's
		}
		entries = append(entries, templateEntry{Path: d, Kind: "dir", Mode: 0o755})
	}
	for _, e := range etcFiles {
		switch e.Path {
		case "etc/hosts", "etc/hostname", "etc/resolv.conf":
			entries = append(entries, e)
		}
	}
	entries = append(entries, caEntries(cas)...)
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	return templateDef{Format: imageTopFormat, Entries: entries}
}

// rootsDirFor is where an executor whose state is stateDir mounts its
// image jobs' roots: below rootfsDir, which the sandbox's root can search,
// in a directory of this executor's own (executors may share rootfsDir),
// one mount point per job id.
func rootsDirFor(rootfsDir, stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return filepath.Join(rootfsDir, "roots-"+hex.EncodeToString(sum[:8]))
}

// mountImageRoot mounts the overlay of layers (top first) at target,
// read-only, nosuid and nodev. As in mountWork, the options name links
// made in linkDir (a fresh directory), relative to it, so the job, which
// reads them in /proc/mounts, learns no host path, and a page holds them.
func mountImageRoot(linkDir string, layers []string, target string) error {
	if len(layers) > ovlMaxStack {
		return fmt.Errorf("%d layers: overlayfs stacks at most %d", len(layers), ovlMaxStack)
	}
	if err := os.Mkdir(linkDir, 0o700); err != nil {
		return err
	}
	names := make([]string, len(layers))
	for i, l := range layers {
		names[i] = strconv.Itoa(i)
		if err := os.Symlink(l, filepath.Join(linkDir, names[i])); err != nil {
			return err
		}
	}
	// An image's layers mean what OCI says: files, whiteouts and opaque
	// directories. overlayfs's own redirects and metacopy files (trusted
	// xattrs an unpacker should never set) are not followed.
	opts := "lowerdir=" + strings.Join(names, ":") + ",redirect_dir=nofollow,metacopy=off"
	if len(opts) >= 4096 {
		return fmt.Errorf("%d layers: the overlay's options take %d bytes, more than a page", len(layers), len(opts))
	}
	// A single lower layer and no upper is refused by older kernels;
	// every job has Airlock's layer over the image's, so there are two.
	return mountOverlayIn(linkDir, target, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts)
}

// readInRoot reads the regular file at name inside the directory tree at
// root, at most max bytes, resolving every symlink as if root were / (so
// nothing outside it is read). A missing file reads as nil.
func readInRoot(root, name string, max int64) ([]byte, error) {
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	return b, nil
}

// imageUserEtc is the /etc/passwd and /etc/group a job running as u sees
// on an image whose own are passwd and group: theirs, with a line for u
// (and its group) added when no line names its uid (gid), so the image's
// system users resolve and so does the job's. "" means the image's serve
// as they are.
func imageUserEtc(u runspec.User, passwd, group []byte) (string, string) {
	var outP, outG string
	if !namesID(passwd, 2, u.UID) {
		outP = withLine(passwd, fmt.Sprintf("%s:x:%d:%d::%s:/bin/sh", u.Name(), u.UID, u.GID, u.Home()))
	}
	if !namesID(group, 2, u.GID) {
		outG = withLine(group, fmt.Sprintf("%s:x:%d:", u.GroupName(), u.GID))
	}
	return outP, outG
}

// namesID reports whether a line of the colon-separated file data has id
// as its field'th field (from 0).
func namesID(data []byte, field int, id uint32) bool {
	want := strconv.FormatUint(uint64(id), 10)
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Split(line, ":"); len(f) > field && f[field] == want {
			return true
		}
	}
	return false
}

func withLine(data []byte, line string) string {
	s := string(data)
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s + line + "\n"
}

// mountImage mounts s's root from its image at its mount point below
// rootsDir (see the top of this file).
func (s *Sandbox) mountImage() error {
	im := s.spec.Image
	target := filepath.Join(s.m.rootsDir, s.name)
	if err := os.Mkdir(target, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s: a previous executor left this job's root behind; Recover removes it", target)
		}
		return err
	}
	s.rootDir = target
	layers := make([]string, 0, len(im.Layers)+2)
	layers = append(layers, s.m.imageTop.dir)
	for i := len(im.Layers) - 1; i >= 0; i-- {
		layers = append(layers, im.Layers[i])
	}
	if err := mountImageRoot(filepath.Join(s.dir, "root-layers"), layers, target); err != nil {
		return fmt.Errorf("mount the image's root (spec.image.layers): %w", err)
	}
	u := s.spec.User
	if u.IsRoot() {
		return nil
	}
	var files [2][]byte
	for i, name := range []string{"etc/passwd", "etc/group"} {
		b, err := readInRoot(target, name, maxImageUserFile)
		if err != nil {
			return invalid("spec.image: the image's /%s: %v", name, err)
		}
		files[i] = b
	}
	passwd, group := imageUserEtc(u, files[0], files[1])
	if passwd == "" && group == "" {
		return nil
	}
	// The image names neither the job's user nor its group: a layer of
	// the job's own, over Airlock's, holds its passwd and group.
	etc := filepath.Join(s.dir, "etc-user")
	if err := os.MkdirAll(filepath.Join(etc, "etc"), 0o755); err != nil {
		return err
	}
	for _, f := range []struct{ name, content string }{{"passwd", passwd}, {"group", group}} {
		if f.content == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(etc, "etc", f.name), []byte(f.content), 0o644); err != nil {
			return err
		}
	}
	if err := unmount(target); err != nil {
		return err
	}
	if err := mountImageRoot(filepath.Join(s.dir, "root-layers-user"), append([]string{etc}, layers...), target); err != nil {
		return fmt.Errorf("mount the image's root (spec.image.layers): %w", err)
	}
	return nil
}

// removeRoot unmounts an image job's root at p and removes its mount
// point; a root that is not there is no error.
func removeRoot(p string) error {
	if err := unmount(p); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// removeRootsDir removes rootsDir (and the bind of it on itself that
// makePrivate may have made) once no root is left in it; one left keeps
// it for the next start's Recover.
func (m *Manager) removeRootsDir() error {
	ents, err := os.ReadDir(m.rootsDir)
	if err != nil || len(ents) > 0 {
		return nil
	}
	if mt, ok, err := mountOf(m.rootsDir); err != nil {
		return err
	} else if ok && mt.point == m.rootsDir {
		if err := unmount(m.rootsDir); err != nil {
			return err
		}
	}
	if err := os.Remove(m.rootsDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
