// Package executorclient is the publisher's client of the executor: it
// adapts the executor's gRPC API to what the publish domain asks of it
// (publish.Executor), downloading a bundle and converting errors. Only the
// publisher's composition root imports it.
package executorclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// artifactTimeout bounds a bundle's download.
const artifactTimeout = 30 * time.Minute

// Client is publish.Executor over the executors' API: one connection per
// executor, each pinned to that executor's own identity.
type Client struct {
	conns *grpcclient.Conns
}

// New returns the executor adapter, dialing with src.
func New(src *tlsconfig.Source) *Client { return &Client{conns: grpcclient.NewConns(src)} }

// Close closes every connection.
func (e *Client) Close() error { return e.conns.Close() }

// conn is the connection to executor at address.
func (e *Client) conn(executor identity.ID, address string) (*grpc.ClientConn, error) {
	if address == "" {
		return nil, fmt.Errorf("%w: executor %s, which keeps the bundle, is out of reach (lost by the fleet); publish again when it is back", errdefs.ErrUnavailable, executor)
	}
	return e.conns.Get(executor, address)
}

// Artifact implements publish.Executor.
func (e *Client) Artifact(ctx context.Context, executor identity.ID, address, jobID, digest string, w io.Writer) ([]byte, error) {
	cc, err := e.conn(executor, address)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, artifactTimeout)
	defer cancel()
	stream, err := executorv1.NewExecutorServiceClient(cc).GetArtifact(ctx, &executorv1.GetArtifactRequest{JobId: jobID, BundleDigest: digest})
	if err != nil {
		return nil, errgrpc.FromPeer("executor", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, errgrpc.FromPeer("executor", err)
	}
	h := first.GetHeader()
	if h == nil {
		return nil, errors.New("executorclient: GetArtifact did not start with a header")
	}
	var got int64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if got != h.GetSize() {
				return nil, fmt.Errorf("%w: executor: GetArtifact sent %d bytes of a %d-byte bundle", errdefs.ErrUnavailable, got, h.GetSize())
			}
			return h.GetProvenance(), nil
		}
		if err != nil {
			return nil, errgrpc.FromPeer("executor", err)
		}
		if msg.GetHeader() != nil {
			return nil, errors.New("executorclient: GetArtifact sent a second header")
		}
		if got += int64(len(msg.GetChunk())); got > h.GetSize() {
			return nil, fmt.Errorf("%w: executor: GetArtifact sent more than the %d bytes its header announced", errdefs.ErrUnavailable, h.GetSize())
		}
		if _, err := w.Write(msg.GetChunk()); err != nil {
			return nil, err
		}
	}
}
