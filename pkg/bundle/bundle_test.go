package bundle_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/bundle"
)

type meta struct {
	JobID    string `json:"job_id"`
	ExitCode int    `json:"exit_code"`
}

// outFile is one file a job leaves in /out.
type outFile struct {
	path string
	data string
	mode os.FileMode
}

var outFiles = []outFile{
	{"report.txt", "all tests passed\n", 0o644},
	{"private.txt", "group-only file\n", 0o640},
	{"run.sh", "#!/bin/sh\necho hi\n", 0o755},
	{"owner-exec", "x", 0o700},
	{"sub/dir/data.bin", "\x00\x01\x02binary\xff", 0o600},
	{"sub/a.txt", "a\n", 0o644},
	{"empty", "", 0o644},
}

// writeOut fills dir with outFiles in the given order.
func writeOut(t *testing.T, dir string, order []int) {
	t.Helper()
	for _, i := range order {
		f := outFiles[i]
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("report.txt", filepath.Join(dir, "latest")); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// input is a complete bundle input whose files live in dir.
func input(t *testing.T, dir string, order []int) bundle.Input {
	t.Helper()
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	writeOut(t, out, order)
	return bundle.Input{
		Meta:       meta{JobID: "job-1", ExitCode: 3},
		Grant:      []byte("\x0a\x05job-1 signed grant bytes"),
		Patch:      []byte("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"),
		StdoutPath: writeFile(t, filepath.Join(dir, "stdout.log"), "out line\n"),
		StderrPath: writeFile(t, filepath.Join(dir, "stderr.log"), "err line\n"),
		OutDir:     out,
	}
}

func mustWrite(t *testing.T, path string, in bundle.Input) *bundle.Result {
	t.Helper()
	res, err := bundle.Write(path, in)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return res
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// entries parses a bundle into its tar headers and contents.
func entries(t *testing.T, data []byte) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	var hdrs []*tar.Header
	content := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, content
		}
		if err != nil {
			t.Fatalf("bundle is not a valid tar: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, h)
		content[h.Name] = b
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	base := t.TempDir()
	dirA, dirB := filepath.Join(base, "a"), filepath.Join(base, "b")
	for _, d := range []string{dirA, dirB} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The same content written in opposite orders, on different paths.
	inA := input(t, dirA, []int{0, 1, 2, 3, 4, 5, 6})
	inB := input(t, dirB, []int{6, 5, 4, 3, 2, 1, 0})

	first := mustWrite(t, filepath.Join(base, "first.tar"), inA)
	firstBytes := readAll(t, first.Path)

	// Between runs: new mtimes and atimes, non-exec permission changes and
	// ownership changes, none of which are content.
	when := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	for _, root := range []string{inA.OutDir, inB.OutDir} {
		err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			when = when.Add(time.Hour)
			if fi.Mode()&os.ModeSymlink != 0 {
				return unix.Lutimes(p, []unix.Timeval{unix.NsecToTimeval(when.UnixNano()), unix.NsecToTimeval(when.UnixNano())})
			}
			if err := os.Chtimes(p, when, when); err != nil {
				return err
			}
			return os.Lchown(p, 12345, 54321)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(inA.OutDir, "report.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(inA.OutDir, "run.sh"), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(inA.StdoutPath, when, when); err != nil {
		t.Fatal(err)
	}

	second := mustWrite(t, filepath.Join(base, "second.tar"), inA)
	third := mustWrite(t, filepath.Join(base, "third.tar"), inB)
	for _, r := range []*bundle.Result{second, third} {
		if got := readAll(t, r.Path); !bytes.Equal(got, firstBytes) {
			t.Errorf("%s differs from the first bundle (%d vs %d bytes)", r.Path, len(got), len(firstBytes))
		}
		if r.Digest != first.Digest || r.Size != first.Size {
			t.Errorf("%s: digest %s size %d, want %s %d", r.Path, r.Digest, r.Size, first.Digest, first.Size)
		}
	}

	sum := sha256.Sum256(firstBytes)
	if want := "sha256:" + hex.EncodeToString(sum[:]); first.Digest != want {
		t.Errorf("Write digest = %s, sha256 of the file = %s", first.Digest, want)
	}
	if first.Size != int64(len(firstBytes)) {
		t.Errorf("Write size = %d, file is %d bytes", first.Size, len(firstBytes))
	}
	d, n, err := bundle.Digest(first.Path)
	if err != nil {
		t.Fatalf("Digest: %v", err)
	}
	if d != first.Digest || n != first.Size {
		t.Errorf("Digest(path) = %s, %d; Write said %s, %d", d, n, first.Digest, first.Size)
	}

	// Content does change the digest.
	if err := os.WriteFile(filepath.Join(inA.OutDir, "sub/a.txt"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed := mustWrite(t, filepath.Join(base, "changed.tar"), inA); changed.Digest == first.Digest {
		t.Error("changing an /out file did not change the digest")
	}
}

func TestWriteEntries(t *testing.T) {
	dir := t.TempDir()
	in := input(t, dir, []int{0, 1, 2, 3, 4, 5, 6})
	res := mustWrite(t, filepath.Join(dir, "bundle.tar"), in)
	if len(res.Skipped) != 0 {
		t.Errorf("Skipped = %q, want none", res.Skipped)
	}

	want := []string{
		bundle.MetaFile, bundle.GrantFile, bundle.FilesFile, bundle.PatchFile, bundle.StdoutFile, bundle.StderrFile,
		"out/empty", "out/latest", "out/owner-exec", "out/private.txt", "out/report.txt", "out/run.sh",
		"out/sub", "out/sub/a.txt", "out/sub/dir", "out/sub/dir/data.bin",
	}
	names, err := bundle.Names(res.Path)
	if err != nil {
		t.Fatalf("Names: %v", err)
	}
	if !slices.Equal(names, want) {
		t.Errorf("Names =\n%q\nwant\n%q", names, want)
	}

	hdrs, content := entries(t, readAll(t, res.Path))
	modes := map[string]int64{
		bundle.MetaFile: 0o644, bundle.GrantFile: 0o644, bundle.FilesFile: 0o644, bundle.PatchFile: 0o644, bundle.StdoutFile: 0o644, bundle.StderrFile: 0o644,
		"out/empty": 0o644, "out/report.txt": 0o644, "out/private.txt": 0o644, "out/sub/a.txt": 0o644, "out/sub/dir/data.bin": 0o644,
		"out/run.sh": 0o755, "out/owner-exec": 0o755,
		"out/sub/": 0o755, "out/sub/dir/": 0o755,
		"out/latest": 0o777,
	}
	for _, h := range hdrs {
		want, ok := modes[h.Name]
		if !ok {
			t.Errorf("unexpected entry %q", h.Name)
			continue
		}
		if h.Mode != want {
			t.Errorf("%s: mode %#o, want %#o", h.Name, h.Mode, want)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: carries host metadata: mtime %v uid %d gid %d uname %q gname %q", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		switch {
		case strings.HasSuffix(h.Name, "/"):
			if h.Typeflag != tar.TypeDir {
				t.Errorf("%s: type %q, want a directory", h.Name, h.Typeflag)
			}
		case h.Name == "out/latest":
			if h.Typeflag != tar.TypeSymlink || h.Linkname != "report.txt" {
				t.Errorf("%s: type %q -> %q, want a symlink to report.txt", h.Name, h.Typeflag, h.Linkname)
			}
		default:
			if h.Typeflag != tar.TypeReg {
				t.Errorf("%s: type %q, want a regular file", h.Name, h.Typeflag)
			}
		}
	}

	wantContent := map[string]string{
		bundle.GrantFile:  string(in.Grant),
		bundle.PatchFile:  string(in.Patch),
		bundle.StdoutFile: "out line\n",
		bundle.StderrFile: "err line\n",
	}
	for _, f := range outFiles {
		wantContent["out/"+f.path] = f.data
	}
	for name, data := range wantContent {
		if got := string(content[name]); got != data {
			t.Errorf("%s in the tar = %q, want %q", name, got, data)
		}
		got, err := bundle.ReadEntry(res.Path, name)
		if err != nil {
			t.Errorf("ReadEntry(%s): %v", name, err)
		} else if string(got) != data {
			t.Errorf("ReadEntry(%s) = %q, want %q", name, got, data)
		}
	}

	raw, err := bundle.ReadEntry(res.Path, bundle.MetaFile)
	if err != nil {
		t.Fatal(err)
	}
	var m meta
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("result.json: %v", err)
	}
	if m != in.Meta.(meta) {
		t.Errorf("result.json = %+v, want %+v", m, in.Meta)
	}

	if _, err := bundle.ReadEntry(res.Path, "out/missing"); err == nil || !strings.Contains(err.Error(), `no entry "out/missing"`) {
		t.Errorf("ReadEntry of a missing entry: %v", err)
	}
	if _, err := bundle.Names(filepath.Join(dir, "missing.tar")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Names of a missing bundle: %v", err)
	}
	if _, _, err := bundle.Digest(filepath.Join(dir, "missing.tar")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Digest of a missing bundle: %v", err)
	}
}

func TestWriteWithoutOptionalInputs(t *testing.T) {
	dir := t.TempDir()
	res := mustWrite(t, filepath.Join(dir, "bundle.tar"), bundle.Input{Meta: map[string]int{"a": 1}})
	names, err := bundle.Names(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{bundle.MetaFile, bundle.GrantFile, bundle.FilesFile, bundle.PatchFile, bundle.StdoutFile, bundle.StderrFile}; !slices.Equal(names, want) {
		t.Errorf("Names = %q, want %q", names, want)
	}
}

// TestOutSymlinksAreNotFollowed plants links in /out to a host secret: by
// absolute path, by a relative path climbing out, and to the directory
// holding it. The bundle must record the links and never the secret.
func TestOutSymlinksAreNotFollowed(t *testing.T) {
	host := t.TempDir()
	secretDir := filepath.Join(host, "secrets")
	if err := os.Mkdir(secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := "AIRLOCK-DUMMY-SECRET-7f3c9a1e"
	secretPath := filepath.Join(secretDir, "token")
	writeFile(t, secretPath, secret)

	work := t.TempDir()
	out := filepath.Join(work, "out")
	if err := os.MkdirAll(filepath.Join(out, "nested"), 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(filepath.Join(out, "nested"), secretPath)
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"abs":          secretPath,
		"nested/rel":   rel,
		"dir":          secretDir,
		"proc-environ": "/proc/self/environ",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(out, name)); err != nil {
			t.Fatal(err)
		}
	}
	// The links do reach the secret from the host's point of view.
	if got, err := os.ReadFile(filepath.Join(out, "nested/rel")); err != nil || string(got) != secret {
		t.Fatalf("setup: relative link reads %q, %v", got, err)
	}

	// Stdout/stderr are also files the job produced; they are read as-is.
	in := bundle.Input{Meta: meta{}, OutDir: out}
	res := mustWrite(t, filepath.Join(work, "bundle.tar"), in)
	data := readAll(t, res.Path)
	if bytes.Contains(data, []byte(secret)) {
		t.Fatal("the secret's content is in the bundle")
	}
	if bytes.Contains(data, []byte("PATH=")) {
		t.Fatal("the executor's environment is in the bundle")
	}
	hdrs, _ := entries(t, data)
	got := map[string]*tar.Header{}
	for _, h := range hdrs {
		got[h.Name] = h
	}
	for name, target := range links {
		h, ok := got["out/"+name]
		if !ok {
			t.Errorf("out/%s is missing", name)
			continue
		}
		if h.Typeflag != tar.TypeSymlink || h.Linkname != target || h.Size != 0 {
			t.Errorf("out/%s: type %q -> %q size %d, want a symlink to %s", name, h.Typeflag, h.Linkname, h.Size, target)
		}
	}
	for name := range got {
		if strings.HasPrefix(name, "out/dir/") {
			t.Errorf("the linked directory was walked: %s", name)
		}
	}
}

func TestOutSpecialFilesAreSkipped(t *testing.T) {
	work := t.TempDir()
	out := filepath.Join(work, "out")
	if err := os.MkdirAll(filepath.Join(out, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(out, "a.txt"), "a")
	// A FIFO with no writer: opening it for reading would block forever.
	if err := unix.Mkfifo(filepath.Join(out, "d", "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A socket: cannot be opened at all.
	sock := filepath.Join(out, "sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}

	type result struct {
		res *bundle.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := bundle.Write(filepath.Join(work, "bundle.tar"), bundle.Input{Meta: meta{}, OutDir: out})
		done <- result{res, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		// Unblock the reader so the goroutine can end.
		if f, err := os.OpenFile(filepath.Join(out, "d", "pipe"), os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("Write blocked on a FIFO in /out")
	}
	if r.err != nil {
		t.Fatalf("Write: %v", r.err)
	}
	if want := []string{"out/d/pipe (p---------)", "out/sock (S---------)"}; !slices.Equal(r.res.Skipped, want) {
		t.Errorf("Skipped = %q, want %q", r.res.Skipped, want)
	}
	names, err := bundle.Names(r.res.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if n == "out/d/pipe" || n == "out/sock" {
			t.Errorf("special file %s is in the bundle", n)
		}
	}
	if !slices.Contains(names, "out/a.txt") || !slices.Contains(names, "out/d") {
		t.Errorf("Names = %q, want out/a.txt and out/d kept", names)
	}
}

// TestWriteFailureLeavesNoBundle makes Write fail part-way and checks that
// nothing is left at the final path (or an old bundle there is untouched)
// and no temporary file remains.
func TestWriteFailureLeavesNoBundle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, in *bundle.Input)
	}{
		{"out dir missing", func(t *testing.T, in *bundle.Input) {
			if err := os.RemoveAll(in.OutDir); err != nil {
				t.Fatal(err)
			}
		}},
		{"stdout missing", func(t *testing.T, in *bundle.Input) {
			if err := os.Remove(in.StdoutPath); err != nil {
				t.Fatal(err)
			}
		}},
		// Opens fine, fails on read after its header is written.
		{"stderr is a directory", func(t *testing.T, in *bundle.Input) {
			in.StderrPath = in.OutDir
		}},
		{"meta does not encode", func(t *testing.T, in *bundle.Input) {
			in.Meta = map[string]any{"f": func() {}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, existing := range []bool{false, true} {
				dir := t.TempDir()
				in := input(t, dir, []int{0, 1, 2})
				bundles := filepath.Join(dir, "bundles")
				if err := os.Mkdir(bundles, 0o700); err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(bundles, "bundle.tar")
				var old []byte
				if existing {
					old = readAll(t, mustWrite(t, path, in).Path)
				}
				tc.mutate(t, &in)
				res, err := bundle.Write(path, in)
				if err == nil {
					t.Fatalf("Write succeeded: %+v", res)
				}
				if existing {
					if got := readAll(t, path); !bytes.Equal(got, old) {
						t.Error("a failed Write changed the existing bundle")
					}
				} else if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a failed Write left %s: %v", path, err)
				}
				left, err := os.ReadDir(bundles)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]int{false: 0, true: 1}[existing]; len(left) != want {
					var names []string
					for _, e := range left {
						names = append(names, e.Name())
					}
					t.Errorf("bundle directory holds %q after a failed Write", names)
				}
			}
		})
	}
}

func TestWriteIntoMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "bundle.tar")
	if _, err := bundle.Write(path, bundle.Input{Meta: meta{}}); err == nil {
		t.Fatal("Write into a missing directory succeeded")
	}
}
