package bundle

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// FileStatus is what a patch does to one file.
type FileStatus string

const (
	FileAdded       FileStatus = "added"
	FileModified    FileStatus = "modified"
	FileDeleted     FileStatus = "deleted"
	FileTypeChanged FileStatus = "type-changed" // e.g. a file became a symlink
)

// FileChange is one file of a patch, computed from the whole patch (never
// from a shortened copy), so a list of them is what will land.
type FileChange struct {
	// Path is the file's path in the repository, as git has it: any bytes
	// but NUL. JSON carries it as a string when it is valid UTF-8 and in
	// PathBytes (base64) otherwise, so no byte is lost or altered.
	Path   string     `json:"-"`
	Status FileStatus `json:"status"`
	// OldMode and NewMode are git's modes (0o100644, 0o100755, 0o120000
	// for a symlink); 0 where the file does not exist on that side.
	OldMode uint32 `json:"old_mode"`
	NewMode uint32 `json:"new_mode"`
	// Added and Deleted count lines; both are 0 for a binary file.
	Added   int64 `json:"added"`
	Deleted int64 `json:"deleted"`
	Binary  bool  `json:"binary"`
	// Size is the file's size in bytes after the patch (before it, for a
	// deleted file).
	Size int64 `json:"size"`
	// PatchBytes is the length of this file's part of the patch; the parts
	// follow one another in the list's order.
	PatchBytes int64 `json:"patch_bytes"`
}

// fileFields is FileChange without its JSON methods.
type fileFields FileChange

// fileJSON is FileChange on the wire.
type fileJSON struct {
	Path      *string `json:"path,omitempty"`
	PathBytes []byte  `json:"path_bytes,omitempty"`
	fileFields
}

func (f FileChange) MarshalJSON() ([]byte, error) {
	w := fileJSON{fileFields: fileFields(f)}
	if utf8.ValidString(f.Path) {
		w.Path = &f.Path
	} else {
		w.PathBytes = []byte(f.Path)
	}
	return json.Marshal(w)
}

func (f *FileChange) UnmarshalJSON(b []byte) error {
	var w fileJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*f = FileChange(w.fileFields)
	switch {
	case w.Path != nil && w.PathBytes == nil:
		f.Path = *w.Path
	case w.Path == nil && w.PathBytes != nil:
		f.Path = string(w.PathBytes)
	default:
		return errors.New("bundle: a file entry needs exactly one of path and path_bytes")
	}
	return nil
}

// marshalFiles is files.json: one entry a line inside a JSON array, so the
// file stays readable with line tools however long the list is.
func marshalFiles(files []FileChange) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("[")
	for i, f := range files {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n")
		e, err := json.Marshal(f)
		if err != nil {
			return nil, err
		}
		b.Write(e)
	}
	b.WriteString("\n]\n")
	return b.Bytes(), nil
}

// ParseFiles reads files.json.
func ParseFiles(data []byte) ([]FileChange, error) {
	var files []FileChange
	if err := json.Unmarshal(data, &files); err != nil {
		return nil, fmt.Errorf("bundle: %s: %w", FilesFile, err)
	}
	return files, nil
}

// ErrDigestMismatch is returned by Stream when the bytes read are not the
// bundle that was asked for.
var ErrDigestMismatch = errors.New("bundle: digest mismatch")

// Stream reads a bundle from r to its end, calls fn with each regular
// entry whose name want accepts (fn may read the entry or not), and checks
// that the whole stream has the digest want names. Whatever fn was handed
// before a mismatch came from bytes that are not that bundle: callers that
// pass it on must say so when Stream fails. A stream with no digest to
// check is refused.
func Stream(r io.Reader, digest string, want func(name string) bool, fn func(name string, size int64, entry io.Reader) error) error {
	if digest == "" {
		return errors.New("bundle: Stream needs the expected digest")
	}
	h := sha256.New()
	tr := tar.NewReader(io.TeeReader(r, h))
	for {
		hd, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("bundle: read: %w", err)
		}
		if hd.Typeflag == tar.TypeReg && want(hd.Name) {
			if err := fn(hd.Name, hd.Size, tr); err != nil {
				return err
			}
		}
	}
	// The tar reader stops at the end-of-archive marker; the digest
	// covers every byte after it too.
	if _, err := io.Copy(io.Discard, io.TeeReader(r, h)); err != nil {
		return fmt.Errorf("bundle: read: %w", err)
	}
	if got := digestOf(h); got != digest {
		return fmt.Errorf("%w: the bytes read are %s, not %s", ErrDigestMismatch, got, digest)
	}
	return nil
}
