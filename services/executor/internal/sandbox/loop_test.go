package sandbox

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestClearLoopOnlyItsOwnImage: a scratch's clear by hand leaves alone a
// loop device that, by the time of the clear, holds another sandbox's
// image (the kernel released the first and the device was bound again),
// and detaches one that still holds its own.
func TestClearLoopOnlyItsOwnImage(t *testing.T) {
	dir := t.TempDir()
	images := map[string]string{}
	for _, n := range []string{"mine", "other"} {
		p := filepath.Join(dir, n+".img")
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		images[n] = p
	}
	// Another sandbox's device (without autoclear here, so that only a
	// clear detaches it), found by a scratch that once had it.
	dev, err := attachLoopFlags(images["other"], 0)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() {
		if d, err := os.OpenFile(dev.Name(), os.O_RDWR, 0); err == nil {
			_ = unix.IoctlSetInt(int(d.Fd()), unix.LOOP_CLR_FD, 0)
			d.Close()
		}
	})
	backing := func() string {
		b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev.Name()), "loop", "backing_file"))
		return trimDeleted(string(trimNL(b)))
	}
	stale := &scratch{loop: dev.Name(), image: images["mine"]}
	if err := stale.clearLoop(); err != nil {
		t.Fatalf("clearLoop of a device bound to another image: %v", err)
	}
	dev.Close()
	time.Sleep(50 * time.Millisecond)
	if got := backing(); got != images["other"] {
		t.Fatalf("a stale scratch's clear detached another image's device: it holds %q, want %q", got, images["other"])
	}
	// Its own scratch's clear detaches it.
	own := &scratch{loop: dev.Name(), image: images["other"]}
	if err := own.clearLoop(); err != nil {
		t.Fatal(err)
	}
	if !own.detachedWithin(5 * time.Second) {
		t.Errorf("the device still holds %q after its own scratch's clear", backing())
	}
}
