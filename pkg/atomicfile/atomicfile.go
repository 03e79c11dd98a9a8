// Package atomicfile replaces files so that a reader, or the file system
// after a crash, sees either the old content or the new, never a mix: the
// new content goes to a temporary file beside the target (its name starts
// with a dot, so globs for the target's kind skip it), which is renamed
// over the target. Durable writes also sync the file before the rename and
// the directory after it, so the rename itself survives a crash; a fast
// write skips both, for state that is rebuilt after a crash anyway. The
// one place for this pattern; every package that replaces a file uses it.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Durability says whether a replacement must survive a crash.
type Durability bool

const (
	// Durable syncs the data and the directory: after a crash the file has
	// the new content or the old.
	Durable Durability = true
	// Fast only renames: readers never see a partial file, but a crash
	// may lose the new content (or, on some file systems, leave the file
	// empty).
	Fast Durability = false
)

// File is a replacement being written; Commit puts it in place, Abort
// throws it away. Write to it through its *os.File.
type File struct {
	*os.File
	path string
	done bool
}

// Create starts a replacement of path with mode perm (applied exactly,
// whatever the umask).
func Create(path string, perm fs.FileMode) (*File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return &File{File: f, path: path}, nil
}

// Commit closes the file and renames it over its target, syncing as d
// says. After an error nothing is left behind but the old target.
func (f *File) Commit(d Durability) error {
	if f.done {
		return fmt.Errorf("atomicfile: %s: already committed or aborted", f.path)
	}
	f.done = true
	err := error(nil)
	if d == Durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), f.path)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	if d == Durable {
		return syncDir(filepath.Dir(f.path))
	}
	return nil
}

// Abort throws the replacement away; after Commit it does nothing, so it
// may be deferred.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.Close()
	os.Remove(f.Name())
}

// Write replaces path with data (mode perm), syncing as d says.
func Write(path string, data []byte, perm fs.FileMode, d Durability) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Abort()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Commit(d)
}

// WriteExclusive is a durable Write that fails with fs.ErrExist instead of
// replacing an existing file: a hard link, unlike a rename, refuses to
// replace its target, which closes the gap between checking and writing.
func WriteExclusive(path string, data []byte, perm fs.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Abort() // the temporary name goes; the link stays
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := os.Link(f.Name(), path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a rename in dir durable; without it a crash can forget the
// rename even though the file's data was synced.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// SyncFS puts everything written to the file system that holds dir on
// disk (syncfs(2)): for a whole tree made with Fast writes, or renames,
// at the moment it must start to outlive the host.
func SyncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
