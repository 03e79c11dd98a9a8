package atomicfile_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/pkg/atomicfile"
)

// leftovers lists what is in dir besides want.
func leftovers(t *testing.T, dir string, want ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	keep := map[string]bool{}
	for _, w := range want {
		keep[w] = true
	}
	var out []string
	for _, e := range ents {
		if !keep[e.Name()] {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestWriteReplacesWithExactMode(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	for _, d := range []atomicfile.Durability{atomicfile.Durable, atomicfile.Fast} {
		if err := atomicfile.Write(path, []byte("one"), 0o644, d); err != nil {
			t.Fatal(err)
		}
		if err := atomicfile.Write(path, []byte("two"), 0o644, d); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(path)
		st, _ := os.Stat(path)
		if string(data) != "two" || st.Mode().Perm() != 0o644 {
			t.Errorf("durability %v: %q mode %v, want \"two\" 0644 whatever the umask", d, data, st.Mode().Perm())
		}
	}
	if l := leftovers(t, dir, "f"); len(l) != 0 {
		t.Errorf("temporary files left: %v", l)
	}
}

func TestAbortLeavesTheOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := atomicfile.Write(path, []byte("old"), 0o600, atomicfile.Durable); err != nil {
		t.Fatal(err)
	}
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("half of the new")
	f.Abort()
	f.Abort() // twice is harmless
	if data, _ := os.ReadFile(path); string(data) != "old" {
		t.Errorf("after Abort the file reads %q", data)
	}
	if err := f.Commit(atomicfile.Durable); err == nil {
		t.Error("Commit after Abort succeeded")
	}
	if l := leftovers(t, dir, "f"); len(l) != 0 {
		t.Errorf("temporary files left: %v", l)
	}
}

func TestCommitIntoADirectoryFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(target, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := atomicfile.Create(target, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("x")
	if err := f.Commit(atomicfile.Durable); err == nil {
		t.Fatal("renamed a file over a non-empty directory")
	}
	if l := leftovers(t, dir, "d"); len(l) != 0 {
		t.Errorf("temporary files left after a failed Commit: %v", l)
	}
}

func TestWriteExclusiveNeverReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k")
	if err := atomicfile.WriteExclusive(path, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.WriteExclusive(path, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second exclusive write: %v, want ErrExist", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "first" {
		t.Errorf("the file reads %q", data)
	}
	if l := leftovers(t, dir, "k"); len(l) != 0 {
		t.Errorf("temporary files left: %v", l)
	}
}
