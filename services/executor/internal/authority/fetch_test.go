package authority

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// sourceServer plays the authority's FetchSource (a boundary these tests
// cannot reach in-process: the real one needs the whole authority). It
// records the requests it got.
type sourceServer struct {
	authorityv1.UnimplementedAuthorityServiceServer
	header  *authorityv1.SourceHeader
	archive []byte
	history *authorityv1.SourceHistory
	pack    []byte
	// ignoreHeaderOnly plays an authority that predates header_only;
	// changeHeader one whose full stream says something else.
	ignoreHeaderOnly, changeHeader bool

	mu   sync.Mutex
	reqs []*authorityv1.FetchSourceRequest
}

func (s *sourceServer) FetchSource(req *authorityv1.FetchSourceRequest, stream grpc.ServerStreamingServer[authorityv1.FetchSourceResponse]) error {
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	h := s.header
	if s.changeHeader && !req.GetHeaderOnly() {
		h = &authorityv1.SourceHeader{Commit: h.GetCommit(), TreeHash: h.GetTreeHash(), Format: "tar", CommitObject: h.GetCommitObject(), HistoryDepth: 1}
	}
	if err := stream.Send(&authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_Header{Header: h}}); err != nil {
		return err
	}
	if req.GetHeaderOnly() && !s.ignoreHeaderOnly {
		return nil
	}
	for _, c := range [][]byte{s.archive[:len(s.archive)/2], s.archive[len(s.archive)/2:]} {
		if err := stream.Send(&authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_Chunk{Chunk: c}}); err != nil {
			return err
		}
	}
	if s.history == nil {
		return nil
	}
	if err := stream.Send(&authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_History{History: s.history}}); err != nil {
		return err
	}
	return stream.Send(&authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_HistoryChunk{HistoryChunk: s.pack}})
}

func (s *sourceServer) requests() (headerOnly, full int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.reqs {
		if r.GetHeaderOnly() {
			headerOnly++
		} else {
			full++
		}
	}
	return headerOnly, full
}

func dial(t *testing.T, srv *sourceServer) *Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	authorityv1.RegisterAuthorityServiceServer(gs, srv)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return New(cc)
}

func newSourceServer() *sourceServer {
	return &sourceServer{
		header:  &authorityv1.SourceHeader{Commit: strings.Repeat("a", 40), TreeHash: strings.Repeat("b", 40), Format: "tar", CommitObject: []byte("tree x\n"), HistoryDepth: 3},
		archive: []byte("the archive's bytes"),
		history: &authorityv1.SourceHistory{Depth: 3, Commits: 2},
		pack:    []byte("PACK the history"),
	}
}

// TestFetchSourceHeaderFirst: the header alone is asked first, and the
// whole stream opened only when the archive or the history is read, so a
// retained tree costs no archive.
func TestFetchSourceHeaderFirst(t *testing.T) {
	for _, old := range []bool{false, true} {
		srv := newSourceServer()
		srv.ignoreHeaderOnly = old
		c := dial(t, srv)
		hdr, rc, err := c.FetchSource(t.Context(), "job-1")
		if err != nil {
			t.Fatal(err)
		}
		if hdr.HistoryDepth != 3 || hdr.Commit != srv.header.GetCommit() || hdr.History == nil {
			t.Fatalf("header %+v", hdr)
		}
		rc.Close()
		if h, f := srv.requests(); h != 1 || f != 0 {
			t.Errorf("old authority %v: %d header-only and %d full requests for a header, want 1 and 0", old, h, f)
		}
	}
}

// TestFetchSourceArchiveThenHistory: the archive reads to its end, and the
// history follows it, whether the archive was read or not.
func TestFetchSourceArchiveThenHistory(t *testing.T) {
	srv := newSourceServer()
	c := dial(t, srv)
	hdr, rc, err := c.FetchSource(t.Context(), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(data, srv.archive) {
		t.Fatalf("archive %q, %v", data, err)
	}
	h, err := hdr.History()
	if err != nil {
		t.Fatal(err)
	}
	pack, err := io.ReadAll(h.Pack)
	if err != nil || h.Depth != 3 || h.Commits != 2 || !bytes.Equal(pack, srv.pack) {
		t.Fatalf("history %+v, pack %q, %v", h, pack, err)
	}
	rc.Close()

	// The tree retained, the history alone: the archive is skipped.
	hdr, rc, err = c.FetchSource(t.Context(), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h, err = hdr.History()
	if err != nil {
		t.Fatal(err)
	}
	if pack, err := io.ReadAll(h.Pack); err != nil || !bytes.Equal(pack, srv.pack) {
		t.Fatalf("history without the archive read: %q, %v", pack, err)
	}
}

// TestFetchSourceRefusesAChangedHeader: the whole stream must say what the
// header alone said, or nothing of it is read; a history promised and not
// sent is an error, not an empty history.
func TestFetchSourceRefusesAChangedHeader(t *testing.T) {
	srv := newSourceServer()
	srv.changeHeader = true
	c := dial(t, srv)
	_, rc, err := c.FetchSource(t.Context(), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadAll(rc); err == nil || !strings.Contains(err.Error(), "not the one the authority first sent") {
		t.Fatalf("a changed header: %v", err)
	}

	srv = newSourceServer()
	srv.history = nil
	hdr, rc, err := dial(t, srv).FetchSource(t.Context(), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := hdr.History(); err == nil || !strings.Contains(err.Error(), "ended without the history of depth 3") {
		t.Fatalf("a missing history: %v", err)
	}
}
