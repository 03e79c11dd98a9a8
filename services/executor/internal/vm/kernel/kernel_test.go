package kernel

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"6.1.172-1", "6.1.172-1", 0},
		{"6.1.172-1", "6.1.99-1", 1},
		{"6.1.0~rc1-1", "6.1.0-1", -1},
		{"1:1.0-1", "2.0-1", 1},
		{"6.12.6-1", "6.12.6-1+deb13u1", -1},
		{"1.0a", "1.0+", -1},
	} {
		got := CompareVersions(c.a, c.b)
		if (got > 0) != (c.want > 0) || (got < 0) != (c.want < 0) {
			t.Errorf("CompareVersions(%q, %q) = %d, want sign %d", c.a, c.b, got, c.want)
		}
	}
}

func TestLoadRejectsBadVersionFile(t *testing.T) {
	for _, v := range []string{"", "linux-image-6.1.0-48-amd64 6.1.172-1", "../../etc 1 2", strings.Repeat("x", 5000)} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "VERSION"), []byte(v), 0o644)
		if _, err := Load(dir); err == nil {
			t.Errorf("Load with VERSION %.40q: no error", v)
		}
	}
	if _, err := Find(t.TempDir()); err == nil {
		t.Error("Find on an empty cache: no error")
	}
}

// TestFetch fetches the real kernel through apt into the machine's cache
// (AIRLOCK_VM_CACHE or the default): ~70 MB and ~10 s the first time.
func TestFetch(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("apt-get download and the cache need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := Fetch(ctx, Base())
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if err := checkPVH(k.Vmlinux); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(k.ModulesDir, "kernel", "fs", "9p", "9p.ko*")); len(m) != 1 {
		t.Errorf("no 9p module in %s", k.ModulesDir)
	}
	again, err := Find(Base())
	if err != nil || again.Dir == "" {
		t.Fatalf("Find after Fetch: %v", err)
	}
	t.Logf("kernel %s in %s", k, k.Dir)
}
