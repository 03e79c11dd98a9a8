package worktree_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/pkg/bundle"
)

// TestFileListIsCompleteAfterALargeFile is the review the issue was about:
// a job writes one large binary and then many small files. Every file is
// listed with its status, modes, line counts, size and share of the patch,
// the totals are the sums, and the shares add up to the whole patch — so a
// reviewer shown only the first megabyte still sees what else lands.
func TestFileListIsCompleteAfterALargeFile(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	tree := treeHash(t, r, b.export(t))
	work := b.export(t)
	big := make([]byte, 3<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "a-big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	const small = 500
	for i := range small {
		writeFile(t, filepath.Join(work, fmt.Sprintf("z/small-%03d.txt", i)), fmt.Sprintf("line %d\n", i), 0o644)
	}
	// Names a terminal would misread, and one that is not UTF-8.
	writeFile(t, filepath.Join(work, "evil\u202etxt.exe"), "x\n", 0o755)
	writeFile(t, filepath.Join(work, "c1-\u009b-name"), "y\n", 0o644)
	writeFile(t, filepath.Join(work, "raw-\xff-byte"), "z\n", 0o644)
	// Deleted, mode-only, and a type change (file to symlink).
	if err := os.Remove(filepath.Join(work, "del.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(work, "mode.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(work, "conf/app.txt")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "../README.md", filepath.Join(work, "conf/app.txt"))

	patch, st, err := r.Diff(context.Background(), tree, work)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]bundle.FileChange{}
	var shares, added, deleted int64
	for _, f := range st.Files {
		byPath[f.Path] = f
		shares += f.PatchBytes
		added += f.Added
		deleted += f.Deleted
	}
	if want := small + 7; len(st.Files) != want || len(byPath) != want {
		t.Fatalf("%d files listed (%d distinct), want %d", len(st.Files), len(byPath), want)
	}
	if st.FilesChanged != int64(len(st.Files)) || st.Insertions != added || st.Deletions != deleted {
		t.Errorf("totals %d files +%d -%d, the list sums to %d +%d -%d", st.FilesChanged, st.Insertions, st.Deletions, len(st.Files), added, deleted)
	}
	if shares != int64(len(patch)) {
		t.Errorf("the files' patch shares add up to %d bytes, the patch has %d", shares, len(patch))
	}
	for i := range small {
		p := fmt.Sprintf("z/small-%03d.txt", i)
		if f := byPath[p]; f.Status != bundle.FileAdded || f.Added != 1 || f.Size != int64(len(fmt.Sprintf("line %d\n", i))) || f.NewMode != 0o100644 {
			t.Fatalf("%s: %+v", p, f)
		}
	}
	for path, want := range map[string]bundle.FileChange{
		"a-big.bin":         {Status: bundle.FileAdded, NewMode: 0o100644, Binary: true, Size: 3 << 20},
		"evil\u202etxt.exe": {Status: bundle.FileAdded, NewMode: 0o100755, Added: 1, Size: 2},
		"c1-\u009b-name":    {Status: bundle.FileAdded, NewMode: 0o100644, Added: 1, Size: 2},
		"raw-\xff-byte":     {Status: bundle.FileAdded, NewMode: 0o100644, Added: 1, Size: 2},
		"del.txt":           {Status: bundle.FileDeleted, OldMode: 0o100644, Deleted: 2, Size: 4},
		"mode.txt":          {Status: bundle.FileModified, OldMode: 0o100644, NewMode: 0o100755, Size: 5},
		"conf/app.txt":      {Status: bundle.FileTypeChanged, OldMode: 0o100644, NewMode: 0o120000, Added: 1, Deleted: 1, Size: int64(len("../README.md"))},
	} {
		got, ok := byPath[path]
		if !ok {
			t.Errorf("%q is not listed", path)
			continue
		}
		if got.PatchBytes <= 0 {
			t.Errorf("%q: no share of the patch", path)
		}
		got.Path, got.PatchBytes = "", 0
		if got != want {
			t.Errorf("%q = %+v, want %+v", path, got, want)
		}
	}
	// Each share is exactly that file's diff (two, for the type change).
	off := int64(0)
	for _, f := range st.Files {
		part := patch[off : off+f.PatchBytes]
		if !bytes.HasPrefix(part, []byte("diff --git a/"+f.Path+" b/"+f.Path+"\n")) {
			t.Fatalf("the share of %q starts %q", f.Path, part[:min(len(part), 80)])
		}
		off += f.PatchBytes
	}
}

// TestJobAttributesDoNotHideAChange: a job that adds a .gitattributes
// marking its files binary (or with a diff driver) still has its text
// change listed with its lines and shown as text in the patch.
func TestJobAttributesDoNotHideAChange(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	tree := treeHash(t, r, b.export(t))
	work := b.export(t)
	writeFile(t, filepath.Join(work, ".gitattributes"), "*.md -diff\n*.go binary\nscript.sh diff=evil\n", 0o644)
	writeFile(t, filepath.Join(work, "README.md"), "line1\nline2\nline3\nhidden change\n", 0o644)
	writeFile(t, filepath.Join(work, "src/main.go"), "package main\n\nfunc main() { steal() }\n", 0o644)
	patch, st, err := r.Diff(context.Background(), tree, work)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range st.Files {
		if (f.Path == "README.md" || f.Path == "src/main.go") && (f.Binary || f.Added != 1) {
			t.Errorf("%s: %+v; the job's attributes decided how its change is shown", f.Path, f)
		}
	}
	for _, want := range []string{"+hidden change\n", "+func main() { steal() }\n"} {
		if !bytes.Contains(patch, []byte(want)) {
			t.Errorf("the patch does not show %q as text:\n%s", want, patch)
		}
	}
	if bytes.Contains(patch, []byte("GIT binary patch")) {
		t.Errorf("a text change is a binary patch:\n%s", patch)
	}
}
