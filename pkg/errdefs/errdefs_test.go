package errdefs

import (
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

func TestDetail(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: target: x", ErrFailedPrecondition), "target: x"},
		{fmt.Errorf("%w: job_id: required", ErrInvalidArgument), "job_id: required"},
		// Only the words of the sentinel it wraps come off.
		{errors.New("failed precondition: not wrapped"), "failed precondition: not wrapped"},
		{fmt.Errorf("authority: %w: gone", ErrUnavailable), "authority: unavailable: gone"},
	} {
		if got := Detail(tc.err); got != tc.want {
			t.Errorf("Detail(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestImportsNoGRPC keeps the vocabulary plain: domain packages import
// errdefs, and they import no grpc; the mapping lives in pkg/errgrpc.
func TestImportsNoGRPC(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files: %v", err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(p, "google.golang.org/grpc") || strings.HasPrefix(p, "google.golang.org/protobuf") {
				t.Errorf("%s imports %s", name, p)
			}
		}
	}
}
