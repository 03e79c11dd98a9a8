package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// fileClient is an authority client whose ReadFile streams msgs.
type fileClient struct {
	authorityv1.AuthorityServiceClient
	msgs []*authorityv1.ReadFileResponse
}

func (c *fileClient) ReadFile(context.Context, *authorityv1.ReadFileRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[authorityv1.ReadFileResponse], error) {
	return &fileStream{msgs: c.msgs}, nil
}

type fileStream struct {
	grpc.ClientStream
	msgs []*authorityv1.ReadFileResponse
	sent int
}

func (s *fileStream) Recv() (*authorityv1.ReadFileResponse, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	s.sent++
	return m, nil
}

func header(size int64) *authorityv1.ReadFileResponse {
	return &authorityv1.ReadFileResponse{Part: &authorityv1.ReadFileResponse_Header{Header: &typesv1.FileHeader{Size: size}}}
}

func chunk(b string) *authorityv1.ReadFileResponse {
	return &authorityv1.ReadFileResponse{Part: &authorityv1.ReadFileResponse_Chunk{Chunk: []byte(b)}}
}

// TestDownloadMaxSize: a download whose announced size (a 100 GB sparse
// file) passes --max-size, or whose bytes pass the size announced (or come
// with none), is refused before anything is written: to a file (no file, no temporary left beside it) or to
// standard output (nothing printed); the refusal names the file and both
// sizes. Within the bound it is written as before.
func TestDownloadMaxSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs []*authorityv1.ReadFileResponse
		want string
	}{
		{"announced", []*authorityv1.ReadFileResponse{header(100 << 30), chunk(strings.Repeat("\x00", 4096))}, "107374182400 bytes, over --max-size of 1024 bytes; nothing was written"},
		{"streamed past", []*authorityv1.ReadFileResponse{header(10), chunk(strings.Repeat("a", 1000)), chunk(strings.Repeat("b", 1000))}, "more than the 10 bytes it announced; nothing was written"},
		{"no header", []*authorityv1.ReadFileResponse{chunk(strings.Repeat("a", 1025))}, "more than the 0 bytes it announced; nothing was written"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			local := filepath.Join(dir, "s")
			var stdout, stderr strings.Builder
			g := &globals{Stdout: &stdout, Stderr: &stderr}
			err := downloadFile(t.Context(), g, &fileClient{msgs: tc.msgs}, "sess-1", "/out/s", local, false, 1024)
			if err == nil || !strings.Contains(err.Error(), "sess-1:/out/s") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("download over --max-size: %v", err)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("a refused download left %v", left)
			}
			err = downloadFile(t.Context(), g, &fileClient{msgs: tc.msgs}, "sess-1", "/out/s", "-", true, 1024)
			if err == nil || stdout.Len() != 0 {
				t.Errorf("to standard output: %d bytes written, %v", stdout.Len(), err)
			}
		})
	}
	dir := t.TempDir()
	local := filepath.Join(dir, "ok")
	g := &globals{Stdout: io.Discard, Stderr: io.Discard}
	if err := downloadFile(t.Context(), g, &fileClient{msgs: []*authorityv1.ReadFileResponse{header(1024), chunk(strings.Repeat("c", 1024))}}, "sess-1", "/out/ok", local, false, 1024); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(local); len(data) != 1024 {
		t.Fatalf("a download at --max-size exactly: %d bytes", len(data))
	}
}

// TestDownloadMaxSizeFlag: --max-size is a size, more than 0; a bad one is
// a usage error naming the flag, given before any call.
func TestDownloadMaxSizeFlag(t *testing.T) {
	cfg := serveFake(t, &fakeAuthority{})
	for _, v := range []string{"0", "-1", "lots"} {
		code, _, errOut := runCLI(t, cfg, nil, "session", "cp", "--max-size", v, "sess-1:/out/s", filepath.Join(t.TempDir(), "s"))
		if code != 2 || !strings.Contains(errOut, "--max-size") {
			t.Errorf("--max-size %s: exit %d: %s", v, code, errOut)
		}
	}
}
