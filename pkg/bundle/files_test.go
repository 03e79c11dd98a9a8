package bundle_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/bundle"
)

var sampleFiles = []bundle.FileChange{
	{Path: "a/big.bin", Status: bundle.FileAdded, NewMode: 0o100644, Binary: true, Size: 3 << 20, PatchBytes: 4 << 20},
	{Path: "b\u202ecod.exe", Status: bundle.FileModified, OldMode: 0o100644, NewMode: 0o100755, Added: 2, Deleted: 1, Size: 10, PatchBytes: 200},
	{Path: "c\xff\x9b.txt", Status: bundle.FileDeleted, OldMode: 0o100644, Deleted: 3, Size: 7, PatchBytes: 90},
	{Path: "link", Status: bundle.FileTypeChanged, OldMode: 0o100644, NewMode: 0o120000, Added: 1, Deleted: 1, Size: 4, PatchBytes: 300},
}

// files.json keeps every file, every field and every byte of a path, even
// one that is not UTF-8.
func TestFilesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	res := mustWrite(t, filepath.Join(dir, "bundle.tar"), bundle.Input{Meta: map[string]int{}, Files: sampleFiles, Patch: []byte("p")})
	data, err := bundle.ReadEntry(res.Path, bundle.FilesFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"path_bytes"`)) || bytes.Contains(data, []byte("\xff")) {
		t.Errorf("a non-UTF-8 path must travel as path_bytes:\n%s", data)
	}
	got, err := bundle.ParseFiles(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sampleFiles) {
		t.Errorf("ParseFiles =\n%+v\nwant\n%+v", got, sampleFiles)
	}
	for _, bad := range []string{`[{"status":"added"}]`, `[{"path":"a","path_bytes":"YQ=="}]`, `{`} {
		if _, err := bundle.ParseFiles([]byte(bad)); err == nil {
			t.Errorf("ParseFiles(%s) = nil error", bad)
		}
	}
}

// Stream hands over the entries asked for and checks the digest of every
// byte, the end-of-archive blocks included.
func TestStream(t *testing.T) {
	dir := t.TempDir()
	stdout := filepath.Join(dir, "stdout")
	if err := os.WriteFile(stdout, []byte("out\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := mustWrite(t, filepath.Join(dir, "bundle.tar"), bundle.Input{Meta: map[string]int{}, Files: sampleFiles, Patch: []byte("the patch\n"), StdoutPath: stdout})
	data := readAll(t, res.Path)
	want := func(n string) bool { return n == bundle.PatchFile || n == bundle.StdoutFile }
	got := map[string]string{}
	collect := func(name string, size int64, r io.Reader) error {
		b, err := io.ReadAll(r)
		if int64(len(b)) != size {
			t.Errorf("%s: read %d bytes, header says %d", name, len(b), size)
		}
		got[name] = string(b)
		return err
	}
	if err := bundle.Stream(bytes.NewReader(data), res.Digest, want, collect); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if len(got) != 2 || got[bundle.PatchFile] != "the patch\n" || got[bundle.StdoutFile] != "out\n" {
		t.Errorf("Stream gave %q", got)
	}
	// An entry it was not asked for may be skipped unread.
	if err := bundle.Stream(bytes.NewReader(data), res.Digest, want, func(string, int64, io.Reader) error { return nil }); err != nil {
		t.Errorf("Stream without reading the entries: %v", err)
	}
	for name, bad := range map[string][]byte{
		"a flipped byte in the patch": bytes.Replace(data, []byte("the patch"), []byte("the pAtch"), 1),
		"a byte appended":             append(bytes.Clone(data), 0),
		"the last block cut":          data[:len(data)-512],
	} {
		err := bundle.Stream(bytes.NewReader(bad), res.Digest, want, func(string, int64, io.Reader) error { return nil })
		if !errors.Is(err, bundle.ErrDigestMismatch) && (err == nil || !strings.Contains(err.Error(), "read")) {
			t.Errorf("%s: Stream = %v, want a digest mismatch", name, err)
		}
		if err == nil {
			t.Errorf("%s: Stream accepted it", name)
		}
	}
	if err := bundle.Stream(bytes.NewReader(data), "", want, collect); err == nil {
		t.Error("Stream without a digest to check must refuse")
	}
}
