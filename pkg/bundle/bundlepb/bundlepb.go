// Package bundlepb converts the bundle format's file list to and from the
// authority API's FileChange messages. It is the one place that does, so
// the executor (reporting a result) and the authority (streaming a bundle's
// list to a reviewer) cannot disagree; adapters import it, domain packages
// do not.
package bundlepb

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/bundle"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

var statuses = map[bundle.FileStatus]authorityv1.FileStatus{
	bundle.FileAdded:       authorityv1.FileStatus_FILE_STATUS_ADDED,
	bundle.FileModified:    authorityv1.FileStatus_FILE_STATUS_MODIFIED,
	bundle.FileDeleted:     authorityv1.FileStatus_FILE_STATUS_DELETED,
	bundle.FileTypeChanged: authorityv1.FileStatus_FILE_STATUS_TYPE_CHANGED,
}

// Status is the bundle format's word for a FileChange's status ("added",
// "modified", "deleted", "type-changed"), "" for an unknown one.
func Status(s authorityv1.FileStatus) bundle.FileStatus {
	for b, p := range statuses {
		if p == s {
			return b
		}
	}
	return ""
}

// File converts one file. A path that is not valid UTF-8 (a proto string
// must be) goes whole into path_bytes, and path holds it with U+FFFD for
// each run of invalid bytes.
func File(f bundle.FileChange) *authorityv1.FileChange {
	out := &authorityv1.FileChange{
		Path: f.Path, Status: statuses[f.Status], OldMode: f.OldMode, NewMode: f.NewMode,
		LinesAdded: f.Added, LinesDeleted: f.Deleted, Binary: f.Binary, Size: f.Size, PatchBytes: f.PatchBytes,
	}
	if !utf8.ValidString(f.Path) {
		out.Path = strings.ToValidUTF8(f.Path, "\uFFFD")
		out.PathBytes = []byte(f.Path)
	}
	return out
}

// Path is a FileChange's exact path.
func Path(f *authorityv1.FileChange) string {
	if len(f.GetPathBytes()) > 0 {
		return string(f.GetPathBytes())
	}
	return f.GetPath()
}

// Files converts files in order until the next would take the encoded
// list past maxBytes, and returns those that fit.
func Files(files []bundle.FileChange, maxBytes int) ([]*authorityv1.FileChange, error) {
	out := make([]*authorityv1.FileChange, 0, len(files))
	size := 0
	for _, f := range files {
		if _, ok := statuses[f.Status]; !ok {
			return nil, fmt.Errorf("bundle: %q has status %q", f.Path, f.Status)
		}
		pf := File(f)
		// A repeated field's element costs its size, a tag byte and a
		// length prefix of at most 3 bytes below 2 MiB.
		n := proto.Size(pf) + 4
		if size+n > maxBytes {
			break
		}
		size += n
		out = append(out, pf)
	}
	return out, nil
}
