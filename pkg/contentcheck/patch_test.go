package contentcheck

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func gitRun(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "core.quotePath=false"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v: %s", args[0], err, stderr.String())
	}
	return out
}

func write(t *testing.T, dir, name string, data []byte, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
}

func numbered(n int, prefix string) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%s %d\n", prefix, i)
	}
	return b.Bytes()
}

// ParsePatch reads what git itself writes, with the executor's flags,
// exactly: every path however git quotes it, every mode, every added line
// at its line number, sizes, symlink targets and binary content.
func TestParsePatchOfGitDiff(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	gitRun(t, dir, "init", "-q")
	random := func(seed uint64, n int) []byte {
		r := rand.New(rand.NewPCG(seed, seed))
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		return b
	}
	bigBin := random(1, 20000)
	write(t, dir, "modified.txt", numbered(100, "line"), 0o644)
	write(t, dir, "gone.txt", []byte("bye\n"), 0o644)
	write(t, dir, "script.sh", []byte("#!/bin/sh\n"), 0o644)
	write(t, dir, "tc", []byte("was a file\n"), 0o644)
	write(t, dir, "delta.bin", bigBin, 0o644)
	gitRun(t, dir, "add", "-A")
	gitRun(t, dir, "commit", "-q", "-m", "base")

	mod := numbered(100, "line")
	mod = bytes.Replace(mod, []byte("line 10\n"), []byte("changed 10\nadded 10b\n"), 1)
	mod = bytes.Replace(mod, []byte("line 80\n"), []byte(""), 1)
	mod = append(mod, []byte("tail without newline")...)
	write(t, dir, "modified.txt", mod, 0o644)
	os.Remove(filepath.Join(dir, "gone.txt"))
	os.Chmod(filepath.Join(dir, "script.sh"), 0o755)
	os.Remove(filepath.Join(dir, "tc"))
	os.Symlink("modified.txt", filepath.Join(dir, "tc"))
	newBin := slices.Clone(bigBin)
	copy(newBin[10000:], "inserted by the change")
	write(t, dir, "delta.bin", newBin, 0o644)
	literal := append([]byte{0, 1, 2}, random(2, 300)...)
	write(t, dir, "literal.bin", literal, 0o644)
	weird := []string{"with space.txt", "tab\there", "new\nline", `quote"d`, `back\slash`, "ünïcödé.txt", "dir/sub/deep.go", "nonl.txt", "empty", "a b/c d"}
	for _, n := range weird {
		content := []byte("content of " + n + "\n")
		switch n {
		case "nonl.txt":
			content = []byte("a\nb")
		case "empty":
			content = nil
		}
		write(t, dir, n, content, 0o644)
	}
	os.Symlink("dir/sub/deep.go", filepath.Join(dir, "link"))
	gitRun(t, dir, "add", "-A")
	gitRun(t, dir, "update-index", "--add", "--cacheinfo", "160000,"+someID+",sub")
	// The executor's command (worktree.Repo.Diff).
	patch := gitRun(t, dir, "diff-index", "--cached", "--patch", "--binary", "--full-index", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", "HEAD")

	p, err := ParsePatch(patch)
	if err != nil {
		t.Fatalf("ParsePatch: %v", err)
	}
	byPath := map[string][]FilePatch{}
	for _, f := range p.Files {
		k := f.NewPath
		if k == "" {
			k = f.OldPath
		}
		byPath[k] = append(byPath[k], f)
	}
	one := func(path string) FilePatch {
		t.Helper()
		fs := byPath[path]
		if len(fs) != 1 {
			t.Fatalf("%q: %d sections, want 1", path, len(fs))
		}
		return fs[0]
	}
	for _, n := range weird {
		f := one(n)
		if f.OldPath != "" || f.NewMode != ModeFile {
			t.Errorf("%q: old %q new mode %o, want a new 100644 file", n, f.OldPath, f.NewMode)
		}
		data, _ := os.ReadFile(filepath.Join(dir, n))
		if f.Size != int64(len(data)) {
			t.Errorf("%q: size %d, want %d", n, f.Size, len(data))
		}
		checkAdded(t, n, f, data)
	}
	m := one("modified.txt")
	if m.OldMode != ModeFile || m.NewMode != ModeFile || m.Size != -1 {
		t.Errorf("modified.txt: modes %o/%o size %d", m.OldMode, m.NewMode, m.Size)
	}
	checkAdded(t, "modified.txt", m, mod)
	if got := []int{m.Added[0].Num, m.Added[1].Num, m.Added[len(m.Added)-1].Num}; !slices.Equal(got, []int{10, 11, 101}) {
		t.Errorf("modified.txt: added at %v, want 10, 11 and 101", got)
	}
	if g := one("gone.txt"); g.NewPath != "" || g.OldMode != ModeFile || len(g.Added) != 0 {
		t.Errorf("gone.txt: %+v", g)
	}
	if s := one("script.sh"); s.OldMode != ModeFile || s.NewMode != ModeExecutable {
		t.Errorf("script.sh: modes %o/%o", s.OldMode, s.NewMode)
	}
	if l := one("link"); l.NewMode != ModeSymlink || !l.TargetKnown || l.Target != "dir/sub/deep.go" {
		t.Errorf("link: mode %o target %q known %v", l.NewMode, l.Target, l.TargetKnown)
	}
	if tc := byPath["tc"]; len(tc) != 2 || tc[0].NewPath != "" || tc[1].NewMode != ModeSymlink || tc[1].Target != "modified.txt" {
		t.Errorf("tc (a type change): %+v", tc)
	}
	if s := one("sub"); s.NewMode != ModeGitlink {
		t.Errorf("sub: mode %o, want a gitlink", s.NewMode)
	}
	lit := one("literal.bin")
	if !lit.Binary || lit.bin == nil || lit.bin.delta || lit.Size != int64(len(literal)) {
		t.Fatalf("literal.bin: binary %v size %d", lit.Binary, lit.Size)
	}
	if got, err := io.ReadAll(lit.bin.content()); err != nil || !bytes.Equal(got, literal) {
		t.Errorf("literal.bin content: %v, equal %v", err, bytes.Equal(got, literal))
	}
	d := one("delta.bin")
	if !d.Binary || d.bin == nil || !d.bin.delta || d.Size != int64(len(newBin)) {
		t.Fatalf("delta.bin: binary %v delta %v size %d, want a delta to %d bytes", d.Binary, d.bin != nil && d.bin.delta, d.Size, len(newBin))
	}
	if got, err := io.ReadAll(d.bin.content()); err != nil || !bytes.Contains(got, []byte("inserted by the change")) {
		t.Errorf("delta.bin inserts: %v, %q", err, got)
	}
	if len(p.Files) != len(weird)+9 {
		t.Errorf("%d sections, want %d", len(p.Files), len(weird)+9)
	}
	// The real patch passes the checks but for what it really holds.
	fs := check(t, Policy{AllowBinary: true}, Input{Patch: patch})
	var rules []string
	for _, f := range fs {
		rules = append(rules, f.Rule+" "+f.Path)
	}
	slices.Sort(rules)
	want := []string{RuleGitlink + " sub", RulePathControl + " new\nline", RulePathControl + " tab\there", RulePathBackslash + ` back\slash`}
	slices.Sort(want)
	if !slices.Equal(rules, want) {
		t.Errorf("findings on git's own patch:%s\nwant %q", show(fs), want)
	}
}

// checkAdded checks that every added line is the new file's line at that
// number.
func checkAdded(t *testing.T, name string, f FilePatch, data []byte) {
	t.Helper()
	lines := strings.SplitAfter(string(data), "\n")
	for _, l := range f.Added {
		if l.Num < 1 || l.Num > len(lines) || strings.TrimSuffix(lines[l.Num-1], "\n") != string(l.Text) {
			t.Errorf("%q: added line %d is %q, not the file's", name, l.Num, l.Text)
		}
	}
}

// Patches git would not write, or that say one thing in one place and
// another elsewhere, are refused with a line number, never with their
// content (which may be a secret).
func TestParsePatchRefuses(t *testing.T) {
	good := addFile("a", ModeFile, "x", "y")
	for _, tc := range []struct{ name, patch string }{
		{"no final newline", strings.TrimSuffix(good, "\n")},
		{"more added lines than said", strings.Replace(good, "+1,2", "+1,1", 1)},
		{"fewer lines than said", strings.Replace(good, "+1,2", "+1,3", 1)},
		{"an unknown line in a hunk", strings.Replace(good, "+y", "?y", 1)},
		{"an unknown header line", strings.Replace(good, "new file mode", "new fyle mode", 1)},
		{"a bad mode", strings.Replace(good, "100644", "100600", 1)},
		{"a tree mode", strings.Replace(good, "100644", "040000", 1)},
		{"names that differ", strings.Replace(good, "b/a\n", "b/b\n", 1)},
		{"+++ name differs from the header", strings.Replace(good, "+++ b/a", "+++ b/.git/config", 1)},
		{"no prefixes", strings.Replace(good, "diff --git a/a b/a", "diff --git x y", 1)},
		{"hunks out of order", modifyFile("m", 20, nil, []string{"x"}) + "@@ -1,1 +1,2 @@\n ctx\n+y\n"},
		{"a hunk after the no-newline marker", symlink("l", "t") + "@@ -0,0 +2 @@\n+more\n"},
		{"a bad quoted name", "diff --git \"a/x\\q\" \"b/x\\q\"\nnew file mode 100644\n"},
		{"an unterminated quoted name", "diff --git \"a/x \"b/x\nnew file mode 100644\n"},
		{"a huge hunk number", strings.Replace(good, "+1,2", "+1,99999999999999999999", 1)},
		{"a bad base85 line", "diff --git a/b b/b\nnew file mode 100644\nindex " + zeroID + ".." + someID + "\nGIT binary patch\nliteral 3\nZ!!!!\n\n"},
		{"binary data without an end", "diff --git a/b b/b\nnew file mode 100644\nindex " + zeroID + ".." + someID + "\nGIT binary patch\nliteral 3\n"},
		{"a combined diff", "diff --cc a\nindex 1,2..3\n"},
		{"a copy", "diff --git a/x b/y\ncopy from x\ncopy to y\n"},
		{"created and deleted", "diff --git a/x b/x\nnew file mode 100644\ndeleted file mode 100644\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePatch([]byte(tc.patch))
			if err == nil {
				t.Fatal("ParsePatch accepted it")
			}
			if !strings.HasPrefix(err.Error(), "line ") {
				t.Errorf("error %q does not name a line", err)
			}
		})
	}
	if _, err := ParsePatch([]byte(good)); err != nil {
		t.Errorf("the unaltered patch: %v", err)
	}
}
