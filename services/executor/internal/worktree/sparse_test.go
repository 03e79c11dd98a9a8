package worktree_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/bundle"
)

// TestDiffUpperBoundsApparentSizes: files whose apparent size passes the
// bound (sparse, hole-punched, or one file under many names) are refused
// by DiffUpper before git runs (it is not even on PATH then), naming the
// largest as the job sees it; .git entries do not count, and within the
// bound the patch is made as before.
func TestDiffUpperBoundsApparentSizes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts overlayfs and needs root (CI runs as root)")
	}
	b := newBase(t)
	r := openRepo(t)
	lower := b.export(t)
	index := filepath.Join(t.TempDir(), "kept.index")
	tree, err := r.TreeHashIndex(context.Background(), lower, index)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 1 << 20
	for _, tc := range []struct {
		name     string
		change   func(t *testing.T, work string)
		largest  string
		apparent int64
	}{
		{"sparse", func(t *testing.T, work string) {
			writeFile(t, filepath.Join(work, "small.txt"), "small\n", 0o644)
			sparse(t, filepath.Join(work, "deep", "big"), 100<<30)
		}, "/work/deep/big", 100 << 30},
		{"hole punched", func(t *testing.T, work string) {
			p := filepath.Join(work, "punched")
			writeFile(t, p, strings.Repeat("x", 3<<20/2), 0o644)
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 1<<20); err != nil {
				t.Fatalf("punch a hole: %v", err)
			}
		}, "/work/punched", 3 << 20 / 2},
		{"hard links", func(t *testing.T, work string) {
			p := filepath.Join(work, "one")
			writeFile(t, p, strings.Repeat("y", 300<<10), 0o644)
			for i := range 4 {
				if err := os.Link(p, filepath.Join(work, fmt.Sprintf("name%d", i))); err != nil {
					t.Fatal(err)
				}
			}
		}, "", 300 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			merged, upper := overlay(t, lower)
			tc.change(t, merged)
			t.Setenv("PATH", "/nonexistent")
			tally := &bundle.Tally{Limit: limit}
			_, _, err := r.DiffUpper(context.Background(), tree, index, merged, upper, tally)
			var tooLarge *bundle.TooLargeError
			if !errors.As(err, &tooLarge) {
				t.Fatalf("DiffUpper over the bound: %v", err)
			}
			if tc.largest != "" && tooLarge.Path != tc.largest || tooLarge.Size != tc.apparent || tooLarge.Limit != limit {
				t.Errorf("the refusal names %s (%d bytes, limit %d), want %s (%d bytes)", tooLarge.Path, tooLarge.Size, tooLarge.Limit, tc.largest, tc.apparent)
			}
			if msg := err.Error(); !strings.Contains(msg, tooLarge.Path) || strings.Contains(msg, upper) || strings.Contains(msg, merged) {
				t.Errorf("the message does not name the path inside alone: %q", msg)
			}
		})
	}
	t.Run("within the bound", func(t *testing.T) {
		merged, upper := overlay(t, lower)
		writeFile(t, filepath.Join(merged, "new.txt"), "new\n", 0o644)
		// The job's own .git is removed, never exported: it does not count.
		sparse(t, filepath.Join(merged, ".git", "objects", "big"), 100<<30)
		tally := &bundle.Tally{Limit: limit}
		patch, stat, err := r.DiffUpper(context.Background(), tree, index, merged, upper, tally)
		if err != nil {
			t.Fatal(err)
		}
		if stat.FilesChanged != 1 || !strings.Contains(string(patch), "+new") || tally.Total != 4 {
			t.Fatalf("within the bound: %d files, %d bytes counted, patch:\n%s", stat.FilesChanged, tally.Total, patch)
		}
	})
}

// overlay mounts a writable overlay over lower and returns its merged
// view and upper layer.
func overlay(t *testing.T, lower string) (merged, upper string) {
	t.Helper()
	upper, work, merged := t.TempDir(), t.TempDir(), t.TempDir()
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	return merged, upper
}

// sparse makes a file of size bytes with no blocks.
func sparse(t *testing.T, p string, size int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}
