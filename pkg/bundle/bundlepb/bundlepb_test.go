package bundlepb_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/bundle/bundlepb"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// A path that is not UTF-8 keeps its exact bytes; one that is travels once.
func TestFilePaths(t *testing.T) {
	for _, p := range []string{"plain/ok.go", "evil\u202e.go", "raw\xff\xfe-\x9b"} {
		f := bundlepb.File(bundle.FileChange{Path: p, Status: bundle.FileAdded})
		if got := bundlepb.Path(f); got != p {
			t.Errorf("Path(File(%q)) = %q", p, got)
		}
		if _, err := proto.Marshal(f); err != nil {
			t.Errorf("%q does not marshal: %v", p, err)
		}
		if strings.ToValidUTF8(p, "") == p && f.GetPathBytes() != nil {
			t.Errorf("%q is UTF-8 but went into path_bytes too", p)
		}
	}
	if f := bundlepb.File(bundle.FileChange{Path: "raw\xff\xfe-\x9b"}); f.GetPath() != "raw\uFFFD-\uFFFD" {
		t.Errorf("path = %q, want each run of invalid bytes as one U+FFFD", f.GetPath())
	}
}

// Files keeps the list's order and stops before the budget, whatever the
// paths; an unknown status is an error, never a silent FILE_STATUS_UNSPECIFIED.
func TestFilesBudget(t *testing.T) {
	files := make([]bundle.FileChange, 5000)
	for i := range files {
		files[i] = bundle.FileChange{Path: strings.Repeat("\xff", 200) + string(rune('a'+i%26)), Status: bundle.FileModified, PatchBytes: 1}
	}
	const budget = 256 << 10
	out, err := bundlepb.Files(files, budget)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 || len(out) == len(files) {
		t.Fatalf("%d of %d files fit; the budget should cut the list", len(out), len(files))
	}
	if n := proto.Size(&authorityv1.ReviewDetail{Files: out}); n > budget {
		t.Errorf("the list encodes to %d bytes, over the budget of %d", n, budget)
	}
	for i, f := range out {
		if bundlepb.Path(f) != files[i].Path {
			t.Fatalf("file %d out of order", i)
		}
	}
	if _, err := bundlepb.Files([]bundle.FileChange{{Path: "x", Status: "renamed"}}, budget); err == nil {
		t.Error("an unknown status converted without an error")
	}
}
