package authorityclient

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/test/bufconntest"
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
}

func (s *sourceServer) FetchSource(req *authorityv1.FetchSourceRequest, stream grpc.ServerStreamingServer[authorityv1.FetchSourceResponse]) error {
	if err := stream.Send(&authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_Header{Header: s.header}}); err != nil {
		return err
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

func dial(t *testing.T, srv authorityv1.AuthorityServiceServer) *Client {
	t.Helper()
	return New(bufconntest.Dial(t, func(r grpc.ServiceRegistrar) { authorityv1.RegisterAuthorityServiceServer(r, srv) }), nil)
}

func newSourceServer() *sourceServer {
	return &sourceServer{
		header:  &authorityv1.SourceHeader{Commit: strings.Repeat("a", 40), TreeHash: strings.Repeat("b", 40), Format: "tar", CommitObject: []byte("tree x\n"), HistoryDepth: 3},
		archive: []byte("the archive's bytes"),
		history: &authorityv1.SourceHistory{Depth: 3, Commits: 2},
		pack:    []byte("PACK the history"),
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

	// The history alone: the archive is skipped.
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

// TestFetchSourceMissingHistory: a history the header promised and the
// stream does not send is an error, not an empty history.
func TestFetchSourceMissingHistory(t *testing.T) {
	srv := newSourceServer()
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
