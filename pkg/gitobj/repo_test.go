package gitobj

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// This file builds real repositories with the git binary and compares
// what the Store reads with what git reads.

// runGit runs git in dir with a fixed, isolated environment and returns
// its output, failing the test on an error.
func runGit(t testing.TB, dir string, stdin []byte, args ...string) []byte {
	t.Helper()
	out, err := gitOutput(dir, stdin, args...)
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func gitOutput(dir string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.Command("git", append([]string{"-c", "gc.auto=0", "-c", "maintenance.auto=false"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"LC_ALL=C",
		"GIT_AUTHOR_NAME=A U Thor", "GIT_AUTHOR_EMAIL=a@example.com",
		"GIT_COMMITTER_NAME=C O Mitter", "GIT_COMMITTER_EMAIL=c@example.com",
		"GIT_AUTHOR_DATE=1700000000 +0000", "GIT_COMMITTER_DATE=1700000000 +0000",
	}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, stderr.Bytes())
	}
	return out, nil
}

var (
	templateMu sync.Mutex
	templates  = map[string]string{}
)

// newRepo returns the work tree of a fresh copy of a repository in format
// ("sha1" or "sha256") with many commits, text files edited a little at a
// time (so that packing makes deltas), binary blobs, a rename and
// annotated tags, all loose. The history is built once per format and
// copied.
func newRepo(t testing.TB, format string) string {
	t.Helper()
	templateMu.Lock()
	defer templateMu.Unlock()
	tmpl, ok := templates[format]
	if !ok {
		var err error
		if tmpl, err = os.MkdirTemp("", "gitobj-"+format+"-"); err != nil {
			t.Fatal(err)
		}
		buildHistory(t, tmpl, format, 60)
		templates[format] = tmpl
	}
	dir := filepath.Join(t.TempDir(), "repo")
	if out, err := exec.Command("cp", "-a", tmpl, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range templates {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// buildHistory makes commits commits in a new repository at dir.
func buildHistory(t testing.TB, dir, format string, commits int) {
	runGit(t, dir, nil, "init", "-q", "--object-format="+format, "-b", "main", ".")
	rng := rand.New(rand.NewSource(1))
	text := map[string][]string{}
	for i := 0; i < 30; i++ {
		name := fmt.Sprintf("dir%d/file%02d.txt", i%3, i)
		for j := 0; j < 80; j++ {
			text[name] = append(text[name], fmt.Sprintf("line %d of %s: %x", j, name, rng.Int63()))
		}
	}
	bin := make([]byte, 150000) // over 64 KiB, so deltas copy 0x10000-byte runs
	rng.Read(bin)
	for c := 0; c < commits; c++ {
		for k := 0; k < 4; k++ {
			name := fmt.Sprintf("dir%d/file%02d.txt", (c+k)%3, (c*7+k*11)%30)
			if lines := text[name]; lines != nil {
				lines[rng.Intn(len(lines))] = fmt.Sprintf("changed in commit %d: %x", c, rng.Int63())
				text[name] = append(lines, fmt.Sprintf("added in commit %d", c))
			}
		}
		for name, lines := range text {
			writeFile(t, filepath.Join(dir, name), []byte(strings.Join(lines, "\n")+"\n"))
		}
		// A binary blob changed in place, and a new small one.
		copy(bin[rng.Intn(len(bin)-64):], fmt.Sprintf("\x00\xff%d\x01", c))
		writeFile(t, filepath.Join(dir, "bin/blob.dat"), bin)
		small := make([]byte, 100+rng.Intn(2000))
		rng.Read(small)
		writeFile(t, filepath.Join(dir, fmt.Sprintf("bin/small%02d.bin", c)), small)
		if c == commits/3 {
			if err := os.MkdirAll(filepath.Join(dir, "renamed"), 0o755); err != nil {
				t.Fatal(err)
			}
			runGit(t, dir, nil, "mv", "dir0/file00.txt", "renamed/moved.txt")
			text["renamed/moved.txt"] = text["dir0/file00.txt"]
			delete(text, "dir0/file00.txt")
		}
		runGit(t, dir, nil, "add", "-A")
		runGit(t, dir, nil, "commit", "-q", "-m", fmt.Sprintf("commit %d\n\nbody of commit %d", c, c))
		if c%10 == 9 {
			runGit(t, dir, nil, "tag", "-a", fmt.Sprintf("v%d", c), "-m", fmt.Sprintf("release %d", c))
		}
	}
	runGit(t, dir, nil, "tag", "-a", "blobtag", "-m", "a tag of a blob", "HEAD:bin/blob.dat")
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// gitObject is one object as git reads it.
type gitObject struct {
	id, typ string
	data    []byte
}

// allObjects returns every object git sees in the repository at dir
// (alternates included), read by git cat-file --batch: the same bytes
// "git cat-file TYPE ID" prints, in one process.
func allObjects(t testing.TB, dir string) []gitObject {
	t.Helper()
	out := runGit(t, dir, nil, "cat-file", "--batch-all-objects", "--batch")
	var objs []gitObject
	br := bufio.NewReader(bytes.NewReader(out))
	for {
		line, err := br.ReadString('\n')
		if errors.Is(err, io.EOF) && line == "" {
			break
		}
		if err != nil {
			t.Fatalf("cat-file output: %v", err)
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("cat-file header %q", line)
		}
		size, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, size+1)
		if _, err := io.ReadFull(br, data); err != nil || data[size] != '\n' {
			t.Fatalf("cat-file content of %s: %v", f[0], err)
		}
		objs = append(objs, gitObject{f[0], f[1], data[:size]})
	}
	if len(objs) == 0 {
		t.Fatal("git lists no objects")
	}
	return objs
}

// compareAll reads every object git lists through s and fails on any
// difference in type or content; it also checks Has and, for some, that
// a limit one byte short is refused.
func compareAll(t *testing.T, s *Store, dir string) []gitObject {
	t.Helper()
	objs := allObjects(t, dir)
	if got, err := s.Prefix(objs[0].id[:10], 5); err != nil || len(got) != 1 || got[0] != objs[0].id {
		t.Fatalf("Prefix(%s) = %v, %v", objs[0].id[:10], got, err)
	}
	for i, o := range objs {
		typ, data, err := s.Read(o.id, int64(len(o.data)))
		if err != nil {
			t.Fatalf("Read(%s %s): %v", o.typ, o.id, err)
		}
		if typ != o.typ || !bytes.Equal(data, o.data) {
			t.Fatalf("Read(%s): got %s of %d bytes, git has %s of %d bytes", o.id, typ, len(data), o.typ, len(o.data))
		}
		if i%97 == 0 {
			// --batch printed what "git cat-file TYPE ID" prints; make
			// sure for a few.
			if out := runGit(t, dir, nil, "cat-file", o.typ, o.id); !bytes.Equal(out, data) {
				t.Fatalf("git cat-file %s %s differs from what the store read", o.typ, o.id)
			}
		}
		if i%5 == 0 {
			if has, err := s.Has(o.id); !has || err != nil {
				t.Fatalf("Has(%s) = %v, %v", o.id, has, err)
			}
			if len(o.data) > 0 {
				if _, _, err := s.Read(o.id, int64(len(o.data))-1); !errors.Is(err, ErrTooLarge) {
					t.Fatalf("Read(%s) with a limit one short: %v, want ErrTooLarge", o.id, err)
				}
			}
		}
	}
	return objs
}

// openStore opens the object directory of the repository at dir.
func openStore(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(filepath.Join(dir, ".git", "objects"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// packKinds counts, by our parser, the entries of every pack in dir's
// object directory that are offset deltas and reference deltas, and checks
// the total of deltas against what git verify-pack -v says.
func packKinds(t *testing.T, dir string) (ofs, ref int) {
	t.Helper()
	idxs, _ := filepath.Glob(filepath.Join(dir, ".git", "objects", "pack", "*.idx"))
	if len(idxs) == 0 {
		t.Fatal("no packs")
	}
	gitDeltas := 0
	for _, idx := range idxs {
		out := runGit(t, dir, nil, "verify-pack", "-v", idx)
		for _, l := range strings.Split(string(out), "\n") {
			// A delta's line ends with its depth and base id.
			if f := strings.Fields(l); len(f) == 7 && (len(f[0]) == 40 || len(f[0]) == 64) {
				gitDeltas++
			}
		}
		p, err := openPack(filepath.Dir(idx), filepath.Base(idx))
		if err != nil {
			t.Fatal(err)
		}
		for i := int64(0); i < p.count; i++ {
			off, err := p.offset(i)
			if err != nil {
				t.Fatal(err)
			}
			e, err := p.entryAt(off)
			if err != nil {
				t.Fatal(err)
			}
			switch e.typ {
			case objOfsDelta:
				ofs++
			case objRefDelta:
				ref++
			}
		}
		p.close()
	}
	if gitDeltas != ofs+ref {
		t.Fatalf("git verify-pack lists %d deltas, our parser %d offset and %d reference deltas", gitDeltas, ofs, ref)
	}
	return ofs, ref
}

// looseCount is how many loose object files dir's object directory holds.
func looseCount(t *testing.T, dir string) int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, ".git", "objects", "[0-9a-f][0-9a-f]", "*"))
	return len(files)
}
