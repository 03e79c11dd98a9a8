// Package gitobj reads objects from a git object directory in-process, as
// git itself does: loose objects, packs (version 2 indexes, offset and
// reference deltas) and the object directories named in
// objects/info/alternates, for SHA-1 and SHA-256 repositories alike. It
// exists so that reading a commit costs a few system calls instead of a git
// process. The repositories are tenants' and may be hostile: every size is
// checked before it is allocated, every object is hashed against the id it
// was asked by, and a corrupt file gives an error, never a panic. Any
// package may import it.
//
// The hash is taken from the id asked: 40 hex digits read a SHA-1 object,
// 64 read a SHA-256 one. A pack's hash length is known from its index's
// size, which the two lengths can never share.
package gitobj

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
)

var (
	// ErrNotFound is returned when no loose object and no pack holds the id.
	ErrNotFound = errors.New("gitobj: object not found")
	// ErrTooLarge is returned when an object (or a delta base it is
	// rebuilt from) is larger than the caller allows; nothing of that
	// size was allocated.
	ErrTooLarge = errors.New("gitobj: object larger than allowed")
	// ErrCorrupt is returned when a file of the object directory is not
	// what git writes, or an object does not hash to its id.
	ErrCorrupt = errors.New("gitobj: corrupt object database")
	// ErrClosed is returned by a Store after Close.
	ErrClosed = errors.New("gitobj: store closed")
)

// Git's object type numbers, as packs write them.
const (
	objCommit   = 1
	objTree     = 2
	objBlob     = 3
	objTag      = 4
	objOfsDelta = 6
	objRefDelta = 7
)

var typeNames = map[int]string{objCommit: "commit", objTree: "tree", objBlob: "blob", objTag: "tag"}

// Store reads one object directory and its alternates. It is safe for
// concurrent use; Close releases its files.
type Store struct {
	dirs   []*objdir // the directory opened first, then its alternates
	closed atomic.Bool
}

// Open returns a Store reading the object directory dir (a GIT_DIR's
// "objects"). It follows objects/info/alternates (absolute paths or paths
// relative to the directory naming them), and refuses a cycle, nesting
// deeper than five and a missing alternate with an error rather than guess
// which objects the repository was meant to have. Packs are opened on the
// first read that needs them.
func Open(dir string) (*Store, error) {
	paths, err := alternates(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{}
	for _, p := range paths {
		s.dirs = append(s.dirs, &objdir{path: p})
	}
	return s, nil
}

// Close releases the Store's files. Reads under way finish with the files
// they hold; later calls return ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, d := range s.dirs {
		errs = append(errs, d.close())
	}
	return errors.Join(errs...)
}

// Read returns the object's type ("commit", "tree", "blob" or "tag") and
// its content, inflated, with deltas applied and checked against id. An
// object larger than max bytes is refused with ErrTooLarge before it is
// allocated. A delta base may be larger than the object rebuilt from it
// (git deltas a small file against a larger one): bases up to 64 times max,
// and at least 16 MiB, are read. ErrNotFound (errors.Is) when no loose
// object or pack holds the id; ErrCorrupt when one that might cannot be
// read.
func (s *Store) Read(id string, max int64) (typ string, data []byte, err error) {
	raw, err := parseID(id)
	if err != nil {
		return "", nil, err
	}
	if max < 0 {
		return "", nil, fmt.Errorf("gitobj: negative size limit %d", max)
	}
	r, err := s.begin()
	if err != nil {
		return "", nil, err
	}
	defer r.end()
	return r.read(raw, max)
}

// Has reports whether the object exists, from the pack indexes and the
// loose object's name: nothing is inflated.
func (s *Store) Has(id string) (bool, error) {
	raw, err := parseID(id)
	if err != nil {
		return false, err
	}
	r, err := s.begin()
	if err != nil {
		return false, err
	}
	defer r.end()
	_, err = r.locate(raw)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotFound):
		return false, nil
	}
	return false, err
}

// MinPrefix is the shortest abbreviated id Prefix accepts, as git's.
const MinPrefix = 4

// Prefix returns up to limit full ids, sorted, that start with the hex
// prefix (at least MinPrefix digits), so that an abbreviated id can be
// resolved and an ambiguous one told apart: ask for two and see how many
// come back. Packs are rescanned first, so a pack written since the last
// read cannot hide a second match.
func (s *Store) Prefix(prefix string, limit int) ([]string, error) {
	prefix = strings.ToLower(prefix)
	if len(prefix) < MinPrefix || len(prefix) > 2*sha256.Size || !isHex(prefix) {
		return nil, fmt.Errorf("gitobj: prefix %q is not %d to %d hex digits", prefix, MinPrefix, 2*sha256.Size)
	}
	if limit <= 0 {
		return nil, fmt.Errorf("gitobj: prefix limit %d is not positive", limit)
	}
	r, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer r.end()
	if err := r.refresh(); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, d := range s.dirs {
		for _, p := range r.held[i] {
			ids, err := p.prefix(prefix, limit)
			if err != nil {
				return nil, err
			}
			for _, id := range ids {
				seen[id] = true
			}
		}
		ids, err := d.loosePrefix(prefix)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			seen[id] = true
		}
	}
	out := make([]string, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	sort.Strings(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// parseID decodes a full hex id of either hash.
func parseID(id string) ([]byte, error) {
	if len(id) != 2*sha1.Size && len(id) != 2*sha256.Size {
		return nil, fmt.Errorf("gitobj: id %q is not %d or %d hex digits", truncate(id), 2*sha1.Size, 2*sha256.Size)
	}
	raw, err := hex.DecodeString(id)
	if err != nil {
		return nil, fmt.Errorf("gitobj: id %q is not hex", truncate(id))
	}
	return raw, nil
}

// truncate keeps an error message short when the caller passed a long
// string where an id belongs.
func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// newHash returns the hash an id of this many bytes names objects with.
func newHash(idLen int) hash.Hash {
	if idLen == sha256.Size {
		return sha256.New()
	}
	return sha1.New()
}

// checkHash is the last step of every read: the content must hash to the
// id it was asked by, so a hostile repository cannot answer one id with
// another object's bytes.
func checkHash(id []byte, typ string, data []byte) error {
	h := newHash(len(id))
	fmt.Fprintf(h, "%s %d\x00", typ, len(data))
	h.Write(data)
	if sum := h.Sum(nil); string(sum) != string(id) {
		return fmt.Errorf("%w: object %x hashes to %x", ErrCorrupt, id, sum)
	}
	return nil
}

// maxAlternateDepth is how deep alternates may name alternates, as git's
// limit.
const maxAlternateDepth = 5

// alternates returns dir and every object directory its alternates name,
// depth first, each once.
func alternates(dir string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	var walk func(dir string, depth int, stack []string) error
	walk = func(dir string, depth int, stack []string) error {
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			return fmt.Errorf("gitobj: object directory: %w", err)
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			return fmt.Errorf("gitobj: object directory %s is not a directory", dir)
		}
		for _, s := range stack {
			if s == real {
				return fmt.Errorf("gitobj: alternates of %s form a cycle back to %s", stack[len(stack)-1], dir)
			}
		}
		if seen[real] {
			return nil // reached twice without a cycle, read once
		}
		seen[real] = true
		out = append(out, real)
		lines, err := readAlternates(real)
		if err != nil {
			return err
		}
		if len(lines) > 0 && depth >= maxAlternateDepth {
			return fmt.Errorf("gitobj: alternates of %s nest deeper than %d", dir, maxAlternateDepth)
		}
		for _, l := range lines {
			if !filepath.IsAbs(l) {
				l = filepath.Join(real, l)
			}
			if err := walk(l, depth+1, append(stack, real)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(dir, 0, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// maxAlternatesFile bounds what is read of an alternates file, a few
// paths in any repository git made.
const maxAlternatesFile = 64 << 10

// readAlternates returns the paths objects/info/alternates lists, skipping
// blank lines and comments and unquoting C-style quoted paths as git does.
func readAlternates(dir string) ([]string, error) {
	f, err := openRegular(filepath.Join(dir, "info", "alternates"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gitobj: alternates: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAlternatesFile+1))
	if err != nil {
		return nil, fmt.Errorf("gitobj: alternates: %w", err)
	}
	if len(b) > maxAlternatesFile {
		return nil, fmt.Errorf("gitobj: %s/info/alternates is larger than %d bytes", dir, maxAlternatesFile)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSuffix(l, "\r")
		if l == "" || l[0] == '#' {
			continue
		}
		if l[0] == '"' {
			u, err := unquoteC(l)
			if err != nil {
				return nil, fmt.Errorf("gitobj: %s/info/alternates: bad quoted path %q", dir, truncate(l))
			}
			l = u
		}
		out = append(out, l)
	}
	return out, nil
}

// unquoteC undoes git's C-style quoting of a path: backslash escapes for
// \a \b \t \n \v \f \r \" \\ and three octal digits.
func unquoteC(s string) (string, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", errors.New("unterminated quote")
	}
	s = s[1 : len(s)-1]
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '"' {
			return "", errors.New("unescaped quote")
		}
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(s) {
			return "", errors.New("trailing backslash")
		}
		if e := strings.IndexByte(`abtnvfr"\`, s[i]); e >= 0 {
			b.WriteByte("\a\b\t\n\v\f\r\"\\"[e])
			continue
		}
		if i+3 > len(s) {
			return "", errors.New("short octal escape")
		}
		v := 0
		for _, d := range []byte(s[i : i+3]) {
			if d < '0' || d > '7' {
				return "", errors.New("bad escape")
			}
			v = v*8 + int(d-'0')
		}
		if v > 0xff {
			return "", errors.New("octal escape out of range")
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}
