// Package bundle owns the result bundle format: one deterministic,
// uncompressed tar holding a run's metadata, grant, complete file list,
// patch, output and /out files, named by its sha256. The same inputs always
// give the same bytes, so the digest is a stable name the approval and the
// publisher can both bind to. The executor writes bundles (Write); the
// authority reads one as a stream while checking its digest (Stream), and
// so will the publisher. It imports no grpc or proto.
package bundle

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/atomicfile"
)

// MediaType names the bundle format.
const MediaType = "application/vnd.airlock.bundle.v1+tar"

// Entry names inside a bundle.
const (
	MetaFile   = "result.json"
	GrantFile  = "grant.pb"
	FilesFile  = "files.json"
	PatchFile  = "patch.diff"
	StdoutFile = "stdout.log"
	StderrFile = "stderr.log"
	// EgressFile is a domains job's record of its egress decisions, one
	// JSON object per line (pkg/egress.Record); only such jobs have it.
	EgressFile = "egress.jsonl"
	OutDir     = "out/"
)

// epoch is every entry's modification time, so the bytes depend only on content.
var epoch = time.Unix(0, 0).UTC()

// Input is what goes into a bundle.
type Input struct {
	// Meta is written as result.json.
	Meta any
	// Grant is the signed grant in force at the run's end, serialized
	// (an airlock.types.v1.SignedGrant: body, signature and key id), so the
	// bundle proves what the authority granted.
	Grant []byte
	// Files is every file the patch changes, in the patch's order; it is
	// written as files.json (a JSON array), before the patch.
	Files []FileChange
	// Patch is the binary-safe patch against the base commit.
	Patch []byte
	// StdoutPath and StderrPath are the captured output files.
	StdoutPath, StderrPath string
	// EgressPath, if set, is the run's egress.jsonl, written after the
	// output as EgressFile.
	EgressPath string
	// OutDir is the host path of the job's /out; regular files and
	// symlinks (as links, never followed) are taken, anything else is
	// listed in Skipped.
	OutDir string
	// Exported, if set, counts the apparent size of each regular file of
	// OutDir on top of what it holds already (the patch's files): when
	// they pass its limit, Write refuses with a *TooLargeError before
	// writing anything, so a sparse file is never copied whole.
	Exported *Tally
}

// Result describes a written bundle.
type Result struct {
	Path    string
	Digest  string // "sha256:<hex>"
	Size    int64
	Skipped []string // /out entries that were not regular files or symlinks
}

// Write builds the bundle at path (a durable atomicfile replacement) and
// returns its digest.
func Write(path string, in Input) (*Result, error) {
	var out []treeEntry
	if in.OutDir != "" {
		var err error
		if out, err = listTree(OutDir, in.OutDir, in.Exported); err != nil {
			return nil, err
		}
	}
	tmp, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return nil, err
	}
	defer tmp.Abort()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(tmp, h)}
	tw := tar.NewWriter(cw)
	res := &Result{Path: path}

	meta, err := json.MarshalIndent(in.Meta, "", "  ")
	if err != nil {
		return nil, err
	}
	files, err := marshalFiles(in.Files)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{MetaFile, meta}, {GrantFile, in.Grant}, {FilesFile, files}, {PatchFile, in.Patch}} {
		if err := addBytes(tw, f.name, f.data); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct{ name, path string }{{StdoutFile, in.StdoutPath}, {StderrFile, in.StderrPath}} {
		if err := addFile(tw, f.name, f.path); err != nil {
			return nil, err
		}
	}
	if in.EgressPath != "" {
		if err := addFile(tw, EgressFile, in.EgressPath); err != nil {
			return nil, err
		}
	}
	if in.OutDir != "" {
		skipped, err := addTree(tw, out)
		if err != nil {
			return nil, err
		}
		res.Skipped = skipped
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := tmp.Commit(atomicfile.Durable); err != nil {
		return nil, err
	}
	res.Digest = digestOf(h)
	res.Size = cw.n
	return res, nil
}

func digestOf(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// Digest computes the digest of the bundle file at path.
func Digest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return digestOf(h), n, nil
}

func header(name string, mode int64, size int64) *tar.Header {
	return &tar.Header{Name: name, Mode: mode, Size: size, ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
}

func addBytes(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(header(name, 0o644, int64(len(data)))); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func addFile(tw *tar.Writer, name, path string) error {
	if path == "" {
		return addBytes(tw, name, nil)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(header(name, 0o644, st.Size())); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, st.Size())
	return err
}

// treeEntry is one entry under a tree's root: its name in the bundle, its
// host path and what lstat said of it.
type treeEntry struct {
	name, path string
	st         fs.FileInfo
}

// listTree lists the entries under root in sorted order, with lstat (no
// link followed, nothing read), counting each regular file's apparent size
// in exported (if set) under its path as the job sees it: prefix "out/" is
// /out.
func listTree(prefix, root string, exported *Tally) ([]treeEntry, error) {
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	entries := make([]treeEntry, 0, len(paths))
	for _, p := range paths {
		rel, _ := filepath.Rel(root, p)
		name := prefix + filepath.ToSlash(rel)
		st, err := os.Lstat(p)
		if err != nil {
			return nil, err
		}
		if exported != nil && st.Mode().IsRegular() {
			exported.Add("/"+name, st.Size())
		}
		entries = append(entries, treeEntry{name: name, path: p, st: st})
	}
	if err := exported.Err(); err != nil {
		return nil, err
	}
	return entries, nil
}

// addTree adds the regular files and symlinks listTree listed. Files are
// opened with O_NOFOLLOW, and links are stored as links, so nothing outside
// root is ever read through a link the job planted.
func addTree(tw *tar.Writer, entries []treeEntry) ([]string, error) {
	var skipped []string
	for _, e := range entries {
		name, p, st := e.name, e.path, e.st
		switch {
		case st.Mode().IsDir():
			if err := tw.WriteHeader(&tar.Header{Name: name + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		case st.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil, err
			}
			if err := tw.WriteHeader(&tar.Header{Name: name, Linkname: target, Mode: 0o777, ModTime: epoch, Typeflag: tar.TypeSymlink, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		case st.Mode().IsRegular():
			if err := addRegular(tw, name, p, st); err != nil {
				return nil, err
			}
		default:
			skipped = append(skipped, name+" ("+st.Mode().Type().String()+")")
		}
	}
	return skipped, nil
}

func addRegular(tw *tar.Writer, name, path string, st fs.FileInfo) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("bundle: open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fst, err := f.Stat()
	if err != nil {
		return err
	}
	// The size counted is the size copied: a file that grew since it was
	// listed is not taken at its new size.
	if !fst.Mode().IsRegular() || !os.SameFile(st, fst) || fst.Size() != st.Size() {
		return fmt.Errorf("bundle: %s changed while being read", name)
	}
	mode := int64(0o644)
	if fst.Mode()&0o111 != 0 {
		mode = 0o755
	}
	if err := tw.WriteHeader(header(name, mode, fst.Size())); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, fst.Size())
	return err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ReadEntry returns one named entry of the bundle at path.
func ReadEntry(path, name string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("bundle: no entry %q", name)
		}
		if err != nil {
			return nil, err
		}
		if h.Name == name {
			return io.ReadAll(tr)
		}
	}
}

// Names lists the entries of the bundle at path.
func Names(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		names = append(names, strings.TrimSuffix(h.Name, "/"))
	}
}
