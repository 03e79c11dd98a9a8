package worktree

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"github.com/airlockhq/airlock/pkg/bundle"
)

// fileChanges lists every file of the patch diff-index made against
// baseTree with the index in env (run, like the patch, with no work tree:
// then git reads no .gitattributes the job wrote, and a job cannot have
// its change to a text file shown as an unreadable binary patch): status and modes from --raw, line counts
// from --numstat (one git run prints both, in the same path order as the
// patch), sizes from the blobs, and each file's share of patch. It reads the
// whole change, so the list is complete whatever part of the patch a
// reviewer is later shown.
func (r *Repo) fileChanges(ctx context.Context, env []string, baseTree string, patch []byte) (DiffStat, error) {
	out, err := r.git(ctx, "", env, "diff-index", "--cached", "--raw", "--numstat", "-z", "--no-renames", "--full-index", baseTree)
	if err != nil {
		return DiffStat{}, err
	}
	files, blobs, err := parseRawNumstat(out)
	if err != nil {
		return DiffStat{}, fmt.Errorf("diff-index --raw --numstat: %w", err)
	}
	if err := r.blobSizes(ctx, files, blobs); err != nil {
		return DiffStat{}, err
	}
	if err := patchShares(files, patch); err != nil {
		return DiffStat{}, err
	}
	st := DiffStat{FilesChanged: int64(len(files)), Files: files}
	for _, f := range files {
		st.Insertions += f.Added
		st.Deletions += f.Deleted
	}
	return st, nil
}

// parseRawNumstat reads `--raw --numstat -z`: first every raw record
// (":OLDMODE NEWMODE OLDSHA NEWSHA STATUS\0PATH\0"), then every numstat one
// ("ADDED\tDELETED\tPATH\0", "-\t-\t" for binary files). blobs[i] is the
// object whose size is file i's.
func parseRawNumstat(out []byte) ([]bundle.FileChange, []string, error) {
	var files []bundle.FileChange
	var blobs []string
	rest := out
	next := func() ([]byte, bool) {
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			return nil, false
		}
		f := rest[:i]
		rest = rest[i+1:]
		return f, true
	}
	for len(rest) > 0 && rest[0] == ':' {
		meta, ok1 := next()
		path, ok2 := next()
		fields := bytes.Fields(meta[1:])
		if !ok1 || !ok2 || len(fields) != 5 {
			return nil, nil, fmt.Errorf("bad raw record %q", meta)
		}
		oldMode, err1 := strconv.ParseUint(string(fields[0]), 8, 32)
		newMode, err2 := strconv.ParseUint(string(fields[1]), 8, 32)
		if err1 != nil || err2 != nil {
			return nil, nil, fmt.Errorf("bad modes in %q", meta)
		}
		f := bundle.FileChange{Path: string(path), OldMode: uint32(oldMode), NewMode: uint32(newMode)}
		blob := string(fields[3])
		switch string(fields[4]) {
		case "A":
			f.Status = bundle.FileAdded
		case "M":
			f.Status = bundle.FileModified
		case "D":
			f.Status, blob = bundle.FileDeleted, string(fields[2])
		case "T":
			f.Status = bundle.FileTypeChanged
		default:
			return nil, nil, fmt.Errorf("unexpected status %q for %q", fields[4], path)
		}
		if f.NewMode == 0o160000 || (f.Status == bundle.FileDeleted && f.OldMode == 0o160000) {
			blob = "" // a gitlink names a commit, not a blob
		}
		files = append(files, f)
		blobs = append(blobs, blob)
	}
	for i := range files {
		rec, ok := next()
		if !ok {
			return nil, nil, fmt.Errorf("%d raw records but %d numstat records", len(files), i)
		}
		parts := bytes.SplitN(rec, []byte("\t"), 3)
		if len(parts) != 3 || string(parts[2]) != files[i].Path {
			return nil, nil, fmt.Errorf("numstat record %d (%q) does not match raw record %q", i, rec, files[i].Path)
		}
		if string(parts[0]) == "-" && string(parts[1]) == "-" {
			files[i].Binary = true
			continue
		}
		a, err1 := strconv.ParseInt(string(parts[0]), 10, 64)
		d, err2 := strconv.ParseInt(string(parts[1]), 10, 64)
		if err1 != nil || err2 != nil {
			return nil, nil, fmt.Errorf("bad numstat record %q", rec)
		}
		files[i].Added, files[i].Deleted = a, d
	}
	if len(rest) > 0 {
		return nil, nil, fmt.Errorf("%d bytes after the last numstat record", len(rest))
	}
	return files, blobs, nil
}

// blobSizes sets each file's size from its blob, in one cat-file run.
func (r *Repo) blobSizes(ctx context.Context, files []bundle.FileChange, blobs []string) error {
	var in bytes.Buffer
	var which []int
	for i, b := range blobs {
		if b != "" {
			in.WriteString(b + "\n")
			which = append(which, i)
		}
	}
	if len(which) == 0 {
		return nil
	}
	out, err := r.gitInput(ctx, "", nil, in.Bytes(), "cat-file", "--batch-check=%(objectsize)")
	if err != nil {
		return err
	}
	lines := bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
	if len(lines) != len(which) {
		return fmt.Errorf("cat-file: %d sizes for %d blobs", len(lines), len(which))
	}
	for k, i := range which {
		n, err := strconv.ParseInt(string(lines[k]), 10, 64)
		if err != nil {
			return fmt.Errorf("cat-file: size of %s: %q", blobs[i], lines[k])
		}
		files[i].Size = n
	}
	return nil
}

// patchShares sets each file's PatchBytes from where its "diff --git"
// header starts in patch. A type change is two diffs in git's patch (the
// old file deleted, the new one added), so it takes two headers. A header
// can only start a line: content lines start with '+', '-', ' ' or '\',
// and binary patch lines with a length letter.
func patchShares(files []bundle.FileChange, patch []byte) error {
	var starts []int
	const hdr = "diff --git "
	for i := 0; i < len(patch); {
		if bytes.HasPrefix(patch[i:], []byte(hdr)) {
			starts = append(starts, i)
		}
		j := bytes.IndexByte(patch[i:], '\n')
		if j < 0 {
			break
		}
		i += j + 1
	}
	k := 0
	for i := range files {
		n := 1
		if files[i].Status == bundle.FileTypeChanged {
			n = 2
		}
		if k+n > len(starts) {
			return fmt.Errorf("patch has %d file headers, fewer than its %d files need", len(starts), len(files))
		}
		end := len(patch)
		if k+n < len(starts) {
			end = starts[k+n]
		}
		files[i].PatchBytes = int64(end - starts[k])
		k += n
	}
	if k != len(starts) {
		return fmt.Errorf("patch has %d file headers, its %d files account for %d", len(starts), len(files), k)
	}
	return nil
}
