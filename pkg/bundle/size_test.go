package bundle_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/bundle"
)

// TestWriteBoundsOutByApparentSize: /out files are counted by apparent
// size on top of what the tally holds (the patch's files); over its limit
// Write refuses before writing anything, naming the largest file as the
// job sees it, never the host path; at the limit exactly it writes.
func TestWriteBoundsOutByApparentSize(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	if err := os.MkdirAll(filepath.Join(out, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "small"), []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(out, "sub", "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	path := filepath.Join(dir, "bundle.tar")

	tally := &bundle.Tally{Limit: 1 << 20}
	tally.Add("/work/big", 1000)
	_, err = bundle.Write(path, bundle.Input{Meta: meta{}, OutDir: out, Exported: tally})
	var tooLarge *bundle.TooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.Path != "/out/sub/sparse" || tooLarge.Size != 100<<30 || tooLarge.Total != 100<<30+1005 {
		t.Fatalf("Write with a 100 GiB sparse /out file: %+v, %v", tooLarge, err)
	}
	if strings.Contains(err.Error(), dir) {
		t.Errorf("the refusal names a host path: %v", err)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "bundle.tar*")); len(matches) != 0 {
		t.Errorf("a refused bundle left %v", matches)
	}

	if err := os.Truncate(filepath.Join(out, "sub", "sparse"), 1<<20-1005); err != nil {
		t.Fatal(err)
	}
	tally = &bundle.Tally{Limit: 1 << 20}
	tally.Add("/work/big", 1000)
	res := mustWrite(t, path, bundle.Input{Meta: meta{}, OutDir: out, Exported: tally})
	if tally.Total != 1<<20 || res.Size < 1<<20 {
		t.Fatalf("at the limit exactly: counted %d, bundle %d bytes", tally.Total, res.Size)
	}
}
