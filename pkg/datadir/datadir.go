// Package datadir owns a service's data directory: created private (0700)
// and locked for the life of the process so two instances can never share
// state. Composition roots open it once; stores take paths inside it.
package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrLocked means another process holds the directory.
var ErrLocked = errors.New("data directory is in use by another process")

// Dir is an open, locked data directory.
type Dir struct {
	path string
	lock *os.File
}

// Open creates path if needed (0700), tightens it to 0700 if it is wider,
// and takes an exclusive lock on path/.lock.
func Open(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("datadir %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("datadir %s: %w", path, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("datadir %s: not a directory", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o700); err != nil {
			return nil, fmt.Errorf("datadir %s: tighten permissions: %w", path, err)
		}
	}
	f, err := os.OpenFile(filepath.Join(path, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("datadir %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("datadir %s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("datadir %s: lock: %w", path, err)
	}
	return &Dir{path: path, lock: f}, nil
}

// Path is the directory's absolute path.
func (d *Dir) Path() string { return d.path }

// Join returns a path inside the directory.
func (d *Dir) Join(elem ...string) string { return filepath.Join(append([]string{d.path}, elem...)...) }

// Owner names the process holding the directory among others on other
// hosts: the host name and the directory's path, which one process holds
// at a time. A process restarted on the directory has the same name, so
// whatever it claimed under it (a publisher's deployments, an authority's
// jobs) it takes back at once.
func (d *Dir) Owner() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return host + ":" + d.path
}

// Close releases the lock.
func (d *Dir) Close() error { return d.lock.Close() }
