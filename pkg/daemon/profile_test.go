package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

// The profile is written to a file of its own and renamed into place: a
// symlink planted at its name is replaced, never followed, so the file it
// points at is left as it was.
func TestCPUProfileFollowsNoPlantedLink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "authority.pprof")
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	end, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1e6; i++ {
		_ = filepath.Join("a", "b")
	}
	end()
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep me" {
		t.Fatalf("the planted link's target was written: %q, %v", b, err)
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		t.Fatalf("no profile at %s: %v, %v", path, fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("files left beside the profile: %v", entries)
	}
}
