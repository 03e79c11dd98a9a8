package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

func TestMakeDisk(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown to the uid base needs root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "disk.img")
	if err := makeDisk(p, 64<<20, 300000); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if st.Size() != 64<<20 || sys.Uid != 300000 || sys.Gid != 300000 || sys.Blocks*512 < st.Size() {
		t.Errorf("disk: size %d, owner %d:%d, %d bytes allocated: want 64 MiB allocated, owned by 300000", st.Size(), sys.Uid, sys.Gid, sys.Blocks*512)
	}
	// A kept session's image is reused as it is.
	os.WriteFile(p, []byte("kept"), 0o600)
	if err := makeDisk(p, 64<<20, 300000); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "kept" {
		t.Errorf("an existing image was remade")
	}
	// Anything but a regular file is refused.
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	for _, bad := range []string{"link", "d"} {
		if err := makeDisk(filepath.Join(dir, bad), 64<<20, 300000); err == nil {
			t.Errorf("makeDisk on %s: no error", bad)
		}
	}
}
