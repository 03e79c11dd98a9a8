// Package authorityclient is the executor's client of the authority: it fetches
// source trees, reports results and leases the brokered credentials of
// its jobs' egress proxies over mTLS, pinned to the authority's
// SPIFFE ID, converting between the run manager's types and the API. Only
// the executor's composition root imports it.
package authorityclient

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/bundle/bundlepb"
	"github.com/airlockhq/airlock/pkg/chunkio"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
)

// Client implements runs.Authority, and leases the brokered credentials
// of the jobs' egress proxies.
type Client struct {
	api authorityv1.AuthorityServiceClient
	// tls is the executor's own certificate, which brokered credentials
	// are sealed to.
	tls *tlsconfig.Source
}

// New wraps a connection to the authority; tls is the executor's own
// mTLS identity (nil leases no brokered credentials).
func New(cc grpc.ClientConnInterface, tls *tlsconfig.Source) *Client {
	return &Client{api: authorityv1.NewAuthorityServiceClient(cc), tls: tls}
}

// FetchSource implements runs.Authority: the stream's header, and a
// reader of its archive chunks; the history part and its chunks follow
// the archive.
func (c *Client) FetchSource(ctx context.Context, jobID string) (stage.Header, io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.api.FetchSource(ctx, &authorityv1.FetchSourceRequest{JobId: jobID})
	if err != nil {
		cancel()
		return stage.Header{}, nil, errgrpc.FromGRPC(err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return stage.Header{}, nil, errgrpc.FromGRPC(err)
	}
	h := first.GetHeader()
	if h == nil {
		cancel()
		return stage.Header{}, nil, errors.New("authority: FetchSource did not start with a header")
	}
	if h.GetFormat() != "tar" {
		cancel()
		return stage.Header{}, nil, fmt.Errorf("authority: source format %q, want tar", h.GetFormat())
	}
	s := &sourceStream{stream: stream, cancel: cancel, depth: h.GetHistoryDepth()}
	s.archive = chunkio.NewReader(func() ([]byte, error) {
		if s.hist != nil {
			return nil, io.EOF
		}
		msg, err := s.recv()
		if err != nil {
			return nil, err
		}
		switch p := msg.GetPart().(type) {
		case *authorityv1.FetchSourceResponse_Chunk:
			return p.Chunk, nil
		case *authorityv1.FetchSourceResponse_History:
			s.hist = p.History
			return nil, io.EOF
		default:
			return nil, fmt.Errorf("authority: FetchSource sent %T inside the archive", p)
		}
	})
	hdr := stage.Header{Commit: h.GetCommit(), TreeHash: h.GetTreeHash(), CommitObject: h.GetCommitObject(), HistoryDepth: int(h.GetHistoryDepth())}
	if hdr.HistoryDepth > 1 {
		hdr.History = s.history
	}
	return hdr, s, nil
}

// sourceStream is the FetchSource stream after its header: the archive's
// chunks through Read, then the history part and its chunks.
type sourceStream struct {
	stream  grpc.ServerStreamingClient[authorityv1.FetchSourceResponse]
	cancel  context.CancelFunc
	depth   uint32 // the header's history depth
	archive *chunkio.Reader
	// hist is the history part, once the archive's chunks have ended.
	hist *authorityv1.SourceHistory
}

func (s *sourceStream) recv() (*authorityv1.FetchSourceResponse, error) {
	msg, err := s.stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil, io.EOF
	}
	if err != nil {
		return nil, errgrpc.FromGRPC(err)
	}
	return msg, nil
}

func (s *sourceStream) Read(p []byte) (int, error) { return s.archive.Read(p) }

// history skips what is left of the archive and returns the history.
func (s *sourceStream) history() (stage.History, error) {
	if _, err := io.Copy(io.Discard, s.archive); err != nil {
		return stage.History{}, err
	}
	if s.hist == nil {
		return stage.History{}, fmt.Errorf("authority: the source stream ended without the history of depth %d its header promised", s.depth)
	}
	pack := chunkio.NewReader(func() ([]byte, error) {
		msg, err := s.recv()
		if err != nil {
			return nil, err
		}
		c, ok := msg.GetPart().(*authorityv1.FetchSourceResponse_HistoryChunk)
		if !ok {
			return nil, fmt.Errorf("authority: FetchSource sent %T inside the history", msg.GetPart())
		}
		return c.HistoryChunk, nil
	})
	return stage.History{Depth: int(s.hist.GetDepth()), Commits: int(s.hist.GetCommits()), Pack: pack}, nil
}

func (s *sourceStream) Close() error {
	s.cancel()
	return nil
}

// reviewFilesBudget bounds the encoded file list in one report, so a
// report with the patch's first megabyte stays well inside gRPC's 4 MiB
// message limit however many files a job wrote (about 40,000 files of
// short paths fit). Beyond it the report says how many files there are;
// the whole list stays in the bundle, where ReadReview streams it.
const reviewFilesBudget = 2 << 20

// reviewExecsBudget bounds the serialized exec records one report
// carries, beside the patch (1 MiB), the file list (2 MiB) and the egress
// record (512 KiB), inside gRPC's 4 MiB; the bundle's result.json keeps
// every one.
const reviewExecsBudget = 320 << 10

// reviewExecs is a session's execs for review, in order, each with its
// argv and env cut: all of them if they fit the budget, else the first
// that fit a quarter of it and the last that fit the rest, so neither the
// start nor the end of the sequence can be pushed out. The second value
// is how many there are.
func reviewExecs(execs []runs.Exec) ([]*typesv1.Exec, int64) {
	all := make([]*typesv1.Exec, len(execs))
	total := 0
	for i, x := range execs {
		all[i] = convert.Exec(x)
		convert.CutSpec(all[i], convert.ExecSpecCut)
		total += proto.Size(all[i])
	}
	if total <= reviewExecsBudget {
		return all, int64(len(execs))
	}
	head, size := 0, 0
	for head < len(all) && size+proto.Size(all[head]) <= reviewExecsBudget/4 {
		size += proto.Size(all[head])
		head++
	}
	tail := len(all)
	for tail > head && size+proto.Size(all[tail-1]) <= reviewExecsBudget {
		tail--
		size += proto.Size(all[tail])
	}
	return append(all[:head:head], all[tail:]...), int64(len(execs))
}

// ReportResult implements runs.Authority.
func (c *Client) ReportResult(ctx context.Context, rep runs.Report) error {
	files, err := bundlepb.Files(rep.Files, reviewFilesBudget)
	if err != nil {
		return err
	}
	tail := func(t runs.Tail) *authorityv1.OutputTail {
		return &authorityv1.OutputTail{Data: t.Data, Size: t.Size, Capped: t.Capped}
	}
	detail := &authorityv1.ReviewDetail{
		Files: files, FilesTotal: rep.Result.FilesChanged, PatchSize: rep.Result.PatchSize,
		Stdout: tail(rep.Stdout), Stderr: tail(rep.Stderr),
	}
	if rep.HasEgress {
		detail.Egress = egresspb.Log(rep.Egress, rep.EgressLast, rep.EgressTotal, rep.EgressNames, rep.EgressCredentials)
	}
	detail.Execs, detail.ExecsTotal = reviewExecs(rep.Execs)
	detail.FileWrites, detail.FileWritesTotal = convert.FileWrites(rep.FileWrites, convert.ListedWrites)
	_, err = c.api.ReportResult(ctx, &authorityv1.ReportResultRequest{
		JobId:      rep.JobID,
		Result:     convert.RunResult(&rep.Result),
		Patch:      rep.Patch,
		Provenance: rep.Provenance,
		Detail:     detail,
	})
	return errgrpc.FromGRPC(err)
}

// FetchImageBlob implements images.Fetcher: the stream's header, and a
// reader of the blob's chunks (none for checkOnly). The caller checks the
// digest of what it reads.
func (c *Client) FetchImageBlob(ctx context.Context, jobID, digest string, checkOnly bool) (images.Blob, io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.api.FetchImageBlob(ctx, &authorityv1.FetchImageBlobRequest{JobId: jobID, Digest: digest, CheckOnly: checkOnly})
	if err != nil {
		cancel()
		return images.Blob{}, nil, errgrpc.FromGRPC(err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return images.Blob{}, nil, errgrpc.FromGRPC(err)
	}
	h := first.GetHeader()
	if h == nil || h.GetDigest() != digest {
		cancel()
		return images.Blob{}, nil, fmt.Errorf("authority: FetchImageBlob did not start with the header of %s", digest)
	}
	r := chunkio.NewReader(func() ([]byte, error) {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		if err != nil {
			return nil, errgrpc.FromGRPC(err)
		}
		c, ok := msg.GetPart().(*authorityv1.FetchImageBlobResponse_Chunk)
		if !ok {
			return nil, fmt.Errorf("authority: FetchImageBlob sent %T after its header", msg.GetPart())
		}
		return c.Chunk, nil
	})
	return images.Blob{MediaType: h.GetMediaType(), Size: h.GetSize()}, &blobReader{Reader: r, cancel: cancel}, nil
}

// blobReader ends its stream on Close.
type blobReader struct {
	*chunkio.Reader
	cancel context.CancelFunc
}

func (b *blobReader) Close() error { b.cancel(); return nil }
